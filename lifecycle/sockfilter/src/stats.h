// fy-sockfilter's counters and their text form. Pure: the loop (filter.cc)
// increments them, the stats socket writes render()'s text.
//
// The text is Prometheus' exposition format (version 0.0.4): one
// `name{label="value"} count` line per series, every reason and field named
// up front with 0, so a reader sees the whole vocabulary before anything
// happened.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "src/rewrite.h"
#include "src/route.h"

namespace fy::sockfilter {

inline constexpr int kRouteClasses = 5;

// Every refusal's short name (Route::code, and the filter's own).
inline constexpr std::string_view kRefusalCodes[] = {
    // the head and its framing (http.h)
    "head_malformed", "head_too_large", "head_timeout", "http2", "te_http10", "framing",
    // the target (route.h)
    "not_origin_form", "path_reescaped", "path_bad_escape", "path_unclean", "grpc",
    "unknown_route",
    // the creating doors (route.h)
    "kube_play", "restore_import", "build_isolation", "build_volume", "local_path", "quadlets",
    "image_scp",
    // bodies
    "create_unparseable", "create_too_large", "body_too_large", "body_timeout", "trailer",
    // the engine
    "upstream_unreachable",
};

struct Stats {
  uint64_t connections = 0;
  uint64_t requests[kRouteClasses] = {};        // by RouteClass, once classified
  std::map<std::string, uint64_t, std::less<>> refusals;  // by code
  uint64_t stripped[kStrippedKinds] = {};       // members removed, by Stripped
  uint64_t creates_rewritten = 0;               // create bodies forwarded

  Stats();
  void refused(std::string_view code);
  std::string render() const;
};

}  // namespace fy::sockfilter
