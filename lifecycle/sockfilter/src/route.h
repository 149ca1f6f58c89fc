// The route classifier: which podman API endpoint a request reaches, decided
// the way podman's router decides it, so the filter and the engine cannot
// disagree about whether a request creates a container.
//
// podman (pkg/api/server) routes with gorilla/mux and UseEncodedPath():
//   - the query is not part of the route;
//   - routes match the *escaped* path: `/containers/%63reate` is not create;
//   - a versioned route is `/v{version:[0-9][0-9A-Za-z.-]*}/<path>`; libpod
//     routes exist only versioned, compat ones also unversioned;
//   - mux answers a path that cleanPath would change (`//`, `.`, `..`
//     segments) with a 301 to the cleaned path. The filter refuses those (the
//     engine would do nothing with them but redirect) rather than guess;
//   - a path Go would re-escape (bytes outside the set url.EscapedPath keeps)
//     is routed on the re-escaped form; the filter refuses those too, so the
//     path it classifies is always the path the router matches.
// Default deny: a request is forwarded only when its method and path match a
// route of podman's API (the union of podman 4.3, 5.8 and 6.0-dev's
// pkg/api/server/register_*.go, kept in route.cc's table) whose handler does
// not create or run a container outside the engine's default runtime. The
// two create routes are rewritten; the other creating routes are refused or
// checked (restore, build); anything the table does not know is refused.
// Pure: no I/O, no allocation beyond the result's strings.
#pragma once

#include <string>
#include <string_view>

namespace fy::sockfilter {

enum class Action {
  pass,           // forward unchanged (parsed and re-framed)
  create_libpod,  // POST /v*/libpod/containers/create: body checked and stripped
  create_compat,  // POST [/v*]/containers/create: body checked and stripped
  refuse,         // answered 400 by the filter with `reason`
};

// What the counters call a request's route (docs/fy-sockfilter.md, Counters).
enum class RouteClass {
  known,       // a route of the table that creates nothing: forwarded
  create,      // one of the two create routes: body checked and stripped
  door,        // a creating route other than create: refused or checked
  unknown,     // no route of the table: refused
  bad_target,  // a target the router would redirect or re-escape: refused
};
std::string_view class_name(RouteClass c);

struct Route {
  Action action = Action::pass;
  RouteClass klass = RouteClass::known;
  std::string_view code;  // a refusal's short name for the counters (static)
  std::string reason;     // the 400 body's text for refuse, without the prefix
};

// Classifies one request. `target` is the request-target as sent; `has_body`
// says whether the request carries a body (Content-Length > 0 or chunked);
// `content_type` is every Content-Type value the request carries, joined
// with ", " (empty when absent): podman routes a request to its gRPC server
// when any of them contains `application/grpc` (an unanchored regexp).
Route classify(std::string_view method, std::string_view target, bool has_body,
               std::string_view content_type);

// The version-prefix grammar: returns the length of a `/v<version>` prefix at
// the start of `path` (followed by '/'), or 0 when there is none.
size_t version_prefix(std::string_view path);

// Case folding as podman's decoders compare names: ASCII A-Z to a-z, plus the
// two non-ASCII letters Go folds onto ASCII ones (U+212A KELVIN SIGN to 'k',
// U+017F LONG S to 's'; jsoniter's strings.ToLower takes the first, schema's
// EqualFold both). Other bytes are kept.
std::string fold(std::string_view s);

// True when mux's cleanPath would change `path` (a `//`, `.` or `..` segment).
bool needs_clean(std::string_view path);

}  // namespace fy::sockfilter
