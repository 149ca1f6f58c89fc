#include "src/route.h"

#include "src/go_case_table.h"

#include <iterator>
#include <vector>

namespace fy::sockfilter {
namespace {

constexpr std::string_view kWhyKube =
    "kube play creates containers whose annotations come from the YAML, which the filter "
    "does not rewrite; create each container through /libpod/containers/create instead";
constexpr std::string_view kWhyRestore =
    "a restore with import reads a checkpoint that names its own OCI runtime; restore only "
    "checkpoints of containers that exist on this socket (no import, no body)";
constexpr std::string_view kWhyLocal =
    "the engine reads a path on its own machine for this endpoint; send the content in the "
    "request (the non-local endpoint) instead";
constexpr std::string_view kWhyQuadlets =
    "quadlet units run containers outside this socket's runtime (PodmanArgs=--runtime=...); "
    "only reading them (GET) is allowed";
constexpr std::string_view kWhyScp =
    "image scp runs over the engine's own ssh connections, outside this socket";
constexpr std::string_view kWhyGrpc =
    "gRPC (Content-Type application/grpc) is served by a different engine handler the filter "
    "does not inspect";

bool is_version_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         c == '.' || c == '-';
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return c - 'A' + 10;
}

// The bytes Go's url.EscapedPath keeps as they are (validEncoded with
// encodePath): unreserved, the sub-delims, ':', '@', '[', ']', '%' and '/'.
bool path_byte_kept(unsigned char c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '-': case '.': case '_': case '~': case '!': case '$': case '&': case '\'':
    case '(': case ')': case '*': case '+': case ',': case ';': case '=': case ':':
    case '@': case '[': case ']': case '%': case '/':
      return true;
    default:
      return false;
  }
}

std::vector<std::string_view> split_path(std::string_view p) {
  // p starts with '/'; returns the segments after it.
  std::vector<std::string_view> out;
  size_t i = 1;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    out.push_back(p.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// Go's QueryUnescape, liberal: an invalid escape is kept as written (Go drops
// the pair; keeping it can only make the filter see more keys, not fewer).
std::string query_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && is_hex(s[i + 1]) && is_hex(s[i + 2])) {
      out.push_back(static_cast<char>(hex_val(s[i + 1]) * 16 + hex_val(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct QueryPair {
  std::string key;    // unescaped and folded
  std::string value;  // unescaped
};

std::vector<QueryPair> parse_query(std::string_view q) {
  std::vector<QueryPair> out;
  size_t i = 0;
  while (i <= q.size()) {
    size_t j = q.find('&', i);
    if (j == std::string_view::npos) j = q.size();
    std::string_view pair = q.substr(i, j - i);
    if (!pair.empty()) {
      size_t eq = pair.find('=');
      std::string_view k = pair.substr(0, eq);
      std::string_view v = eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
      out.push_back({fold(query_unescape(k)), query_unescape(v)});
    }
    i = j + 1;
  }
  return out;
}

Route refuse(std::string_view method, std::string_view path, std::string_view why,
             RouteClass klass, std::string_view code) {
  Route r;
  r.action = Action::refuse;
  r.klass = klass;
  r.code = code;
  r.reason = std::string(method) + " " + std::string(path) + " refused: " + std::string(why);
  return r;
}

// build (libpod and compat share compat.BuildImage): isolation other than the
// OCI runtime's, or any extra volume, runs build steps outside runsc.
Route check_build(std::string_view method, std::string_view path, std::string_view query) {
  for (const auto& p : parse_query(query)) {
    if (p.key == "isolation") {
      std::string v = fold(p.value);
      if (!(v.empty() || v == "oci" || v == "default" || v == "rootless")) {
        return refuse(method, path,
                      "build isolation '" + p.value +
                          "' runs build steps outside the OCI runtime (chroot or a number); "
                          "leave isolation unset or use oci",
                      RouteClass::door, "build_isolation");
      }
    } else if (p.key == "volume") {
      return refuse(method, path,
                    "build volumes bind paths of the engine's machine into build steps; "
                    "build without --volume",
                    RouteClass::door, "build_volume");
    }
  }
  Route r;
  r.klass = RouteClass::door;
  return r;
}


// ---------------------------------------------------------------- the table
//
// podman's routes (pkg/api/server/register_*.go of 4.3.1, 5.8.2 and 6.0-dev,
// united), as the router matches them: `{}` is a mux variable's default
// `[^/]+`, `{*}` a `{name:.*}` (any bytes, '/' included, possibly none).
// Scope V: under a version prefix; U: unversioned; VU: both. A route whose
// methods mux does not restrict (`monitor`, `plugins`, the swarm prefixes)
// takes any method. The engine answers every route that is not here with a
// 404 or 405, so refusing it loses nothing a client can use.

enum Method : uint8_t { G = 1, H = 2, P = 4, U = 8, D = 16, OTHER = 32, ANY = 63 };
enum Scope : uint8_t { V = 1, UNV = 2, VU = 3 };
enum class Door : uint8_t {
  pass,           // creates nothing (or only with the engine's default runtime)
  create_libpod,  // body rewritten
  create_compat,  // body rewritten
  kube,           // refused: containers from YAML
  restore,        // refused with import or a body
  build,          // refused with chroot isolation or volumes
  local,          // refused: the engine reads a path of its machine
  quadlets,       // refused: units run containers with their own flags
  scp,            // refused: runs over the engine's own ssh connections
};

struct Entry {
  uint8_t scope;
  uint8_t methods;
  std::string_view pattern;
  Door door;
};

constexpr Entry kTable[] = {
    // system, info, events
    {VU, G | H, "/_ping", Door::pass},
    {VU, G | H, "/libpod/_ping", Door::pass},
    {VU, G, "/info", Door::pass},
    {VU, G, "/version", Door::pass},
    {VU, G, "/events", Door::pass},
    {VU, G, "/system/df", Door::pass},
    {VU, P, "/auth", Door::pass},
    {V, G, "/libpod/info", Door::pass},
    {V, G, "/libpod/version", Door::pass},
    {V, G, "/libpod/events", Door::pass},
    {V, G, "/libpod/swagger", Door::pass},
    {V, G, "/libpod/system/df", Door::pass},
    {V, P, "/libpod/system/prune", Door::pass},
    {V, P, "/libpod/system/check", Door::pass},
    {VU, ANY, "/monitor", Door::pass},
    {VU, ANY, "/plugins", Door::pass},
    {VU, ANY, "/distribution/{}/json", Door::pass},
    {VU, ANY, "/configs/{*}", Door::pass},  // swarm: all answer "no swarm"
    {VU, ANY, "/nodes/{*}", Door::pass},
    {VU, ANY, "/secrets/{*}", Door::pass},
    {VU, ANY, "/services/{*}", Door::pass},
    {VU, ANY, "/swarm/{*}", Door::pass},
    {VU, ANY, "/tasks/{*}", Door::pass},
    // compat containers
    {VU, P, "/containers/create", Door::create_compat},
    {VU, G, "/containers/json", Door::pass},
    {VU, P, "/containers/prune", Door::pass},
    {VU, D, "/containers/{}", Door::pass},
    {VU, G | U | H, "/containers/{}/archive", Door::pass},
    {VU, P, "/containers/{}/attach", Door::pass},
    {VU, G, "/containers/{}/changes", Door::pass},
    {VU, P, "/containers/{}/exec", Door::pass},
    {VU, G, "/containers/{}/export", Door::pass},
    {VU, G, "/containers/{}/json", Door::pass},
    {VU, P, "/containers/{}/kill", Door::pass},
    {VU, G, "/containers/{}/logs", Door::pass},
    {VU, P, "/containers/{}/pause", Door::pass},
    {VU, P, "/containers/{}/rename", Door::pass},
    {VU, P, "/containers/{}/resize", Door::pass},
    {VU, P, "/containers/{}/restart", Door::pass},
    {VU, P, "/containers/{}/start", Door::pass},
    {VU, G, "/containers/{}/stats", Door::pass},
    {VU, P, "/containers/{}/stop", Door::pass},
    {VU, G, "/containers/{}/top", Door::pass},
    {VU, P, "/containers/{}/unpause", Door::pass},
    {VU, P, "/containers/{}/update", Door::pass},
    {VU, P, "/containers/{}/wait", Door::pass},
    {VU, P, "/commit", Door::pass},
    {VU, G, "/exec/{}/json", Door::pass},
    {VU, P, "/exec/{}/resize", Door::pass},
    {VU, P, "/exec/{}/start", Door::pass},
    // compat images, build
    {VU, P, "/build", Door::build},
    {VU, P, "/images/create", Door::pass},
    {VU, G, "/images/get", Door::pass},
    {VU, G, "/images/json", Door::pass},
    {VU, P, "/images/load", Door::pass},
    {VU, P, "/images/prune", Door::pass},
    {VU, G, "/images/search", Door::pass},
    {VU, D, "/images/{*}", Door::pass},
    {VU, G, "/images/{*}/get", Door::pass},
    {VU, G, "/images/{*}/history", Door::pass},
    {VU, G, "/images/{*}/json", Door::pass},
    {VU, P, "/images/{*}/push", Door::pass},
    {VU, P, "/images/{*}/tag", Door::pass},
    // compat networks, volumes, secrets
    {VU, G, "/networks", Door::pass},
    {VU, P, "/networks/create", Door::pass},
    {VU, P, "/networks/prune", Door::pass},
    {VU, G | D, "/networks/{}", Door::pass},
    {VU, P, "/networks/{}/connect", Door::pass},
    {VU, P, "/networks/{}/disconnect", Door::pass},
    {VU, G, "/volumes", Door::pass},
    {VU, P, "/volumes/create", Door::pass},
    {VU, P, "/volumes/prune", Door::pass},
    {VU, G | D, "/volumes/{}", Door::pass},
    {VU, G, "/secrets", Door::pass},
    {VU, P, "/secrets/create", Door::pass},
    {VU, G | D, "/secrets/{}", Door::pass},
    {VU, P, "/secrets/{}/update", Door::pass},
    {UNV, D, "/secret/{}", Door::pass},  // podman 4.3's spelling
    // libpod containers
    {V, P, "/libpod/containers/create", Door::create_libpod},
    {V, G, "/libpod/containers/json", Door::pass},
    {V, P, "/libpod/containers/prune", Door::pass},
    {V, G, "/libpod/containers/showmounted", Door::pass},
    {V, G, "/libpod/containers/stats", Door::pass},
    {V, D, "/libpod/containers/{}", Door::pass},
    {V, G | U | H, "/libpod/containers/{}/archive", Door::pass},
    {V, P, "/libpod/containers/{}/attach", Door::pass},
    {V, G, "/libpod/containers/{}/changes", Door::pass},
    {V, P, "/libpod/containers/{}/checkpoint", Door::pass},
    {V, P, "/libpod/containers/{}/exec", Door::pass},
    {V, G, "/libpod/containers/{}/exists", Door::pass},
    {V, G, "/libpod/containers/{}/export", Door::pass},
    {V, G, "/libpod/containers/{*}/healthcheck", Door::pass},
    {V, P, "/libpod/containers/{}/init", Door::pass},
    {V, G, "/libpod/containers/{}/json", Door::pass},
    {V, P, "/libpod/containers/{}/kill", Door::pass},
    {V, G, "/libpod/containers/{}/logs", Door::pass},
    {V, P, "/libpod/containers/{}/mount", Door::pass},
    {V, P, "/libpod/containers/{}/pause", Door::pass},
    {V, P, "/libpod/containers/{}/rename", Door::pass},
    {V, P, "/libpod/containers/{}/resize", Door::pass},
    {V, P, "/libpod/containers/{}/restart", Door::pass},
    {V, P, "/libpod/containers/{}/restore", Door::restore},
    {V, P, "/libpod/containers/{}/start", Door::pass},
    {V, G, "/libpod/containers/{}/stats", Door::pass},
    {V, P, "/libpod/containers/{}/stop", Door::pass},
    {V, G, "/libpod/containers/{}/top", Door::pass},
    {V, P, "/libpod/containers/{}/unmount", Door::pass},
    {V, P, "/libpod/containers/{}/unpause", Door::pass},
    {V, P, "/libpod/containers/{}/update", Door::pass},
    {V, P, "/libpod/containers/{}/wait", Door::pass},
    {V, P, "/libpod/commit", Door::pass},
    {V, G, "/libpod/exec/{}/json", Door::pass},
    {V, P, "/libpod/exec/{}/remove", Door::pass},
    {V, P, "/libpod/exec/{}/resize", Door::pass},
    {V, P, "/libpod/exec/{}/start", Door::pass},
    {V, G, "/libpod/generate/kube", Door::pass},
    {V, G, "/libpod/generate/{*}/systemd", Door::pass},
    {V, G, "/libpod/kube/generate", Door::pass},
    // libpod pods: the infra container is created with the engine's default
    // runtime (PodSpecGenerator has no runtime or annotations field, and the
    // infra spec is filled only from the pod's own fields).
    {V, P, "/libpod/pods/create", Door::pass},
    {V, G, "/libpod/pods/json", Door::pass},
    {V, P, "/libpod/pods/prune", Door::pass},
    {V, G, "/libpod/pods/stats", Door::pass},
    {V, D, "/libpod/pods/{}", Door::pass},
    {V, G, "/libpod/pods/{}/exists", Door::pass},
    {V, G, "/libpod/pods/{}/json", Door::pass},
    {V, P, "/libpod/pods/{}/kill", Door::pass},
    {V, P, "/libpod/pods/{}/pause", Door::pass},
    {V, P, "/libpod/pods/{}/restart", Door::pass},
    {V, P, "/libpod/pods/{}/start", Door::pass},
    {V, P, "/libpod/pods/{}/stop", Door::pass},
    {V, G, "/libpod/pods/{}/top", Door::pass},
    {V, P, "/libpod/pods/{}/unpause", Door::pass},
    // libpod kube
    {V, P, "/libpod/play/kube", Door::kube},
    {V, P, "/libpod/kube/play", Door::kube},
    {V, P, "/libpod/kube/apply", Door::kube},
    {V, D, "/libpod/play/kube", Door::pass},  // teardown
    {V, D, "/libpod/kube/play", Door::pass},
    // libpod images, build, manifests, artifacts
    {V, P, "/libpod/build", Door::build},
    {V, P, "/libpod/local/build", Door::local},
    {V, P, "/libpod/local/images/load", Door::local},
    {V, G, "/libpod/images/export", Door::pass},
    {V, P, "/libpod/images/import", Door::pass},
    {V, G, "/libpod/images/json", Door::pass},
    {V, P, "/libpod/images/load", Door::pass},
    {V, P, "/libpod/images/prune", Door::pass},
    {V, P, "/libpod/images/pull", Door::pass},
    {V, D, "/libpod/images/remove", Door::pass},
    {V, P, "/libpod/images/scp/{*}", Door::scp},
    {V, G, "/libpod/images/search", Door::pass},
    {V, D, "/libpod/images/{*}", Door::pass},
    {V, G, "/libpod/images/{}/changes", Door::pass},
    {V, G, "/libpod/images/{*}/exists", Door::pass},
    {V, G, "/libpod/images/{*}/get", Door::pass},
    {V, G, "/libpod/images/{*}/history", Door::pass},
    {V, G, "/libpod/images/{*}/json", Door::pass},
    {V, P, "/libpod/images/{*}/push", Door::pass},
    {V, G, "/libpod/images/{*}/resolve", Door::pass},
    {V, P, "/libpod/images/{*}/tag", Door::pass},
    {V, G, "/libpod/images/{*}/tree", Door::pass},
    {V, P, "/libpod/images/{*}/untag", Door::pass},
    {V, P | U | D, "/libpod/manifests/{*}", Door::pass},  // v3's create/add/push, v4's {name:.*}
    {V, G, "/libpod/manifests/{*}/exists", Door::pass},
    {V, G, "/libpod/manifests/{*}/json", Door::pass},
    {V, P, "/libpod/artifacts/add", Door::pass},
    {V, P, "/libpod/artifacts/local/add", Door::local},
    {V, G, "/libpod/artifacts/json", Door::pass},
    {V, P, "/libpod/artifacts/pull", Door::pass},
    {V, D, "/libpod/artifacts/remove", Door::pass},
    {V, D, "/libpod/artifacts/{*}", Door::pass},
    {V, G, "/libpod/artifacts/{*}/extract", Door::pass},
    {V, G, "/libpod/artifacts/{*}/json", Door::pass},
    {V, P, "/libpod/artifacts/{*}/push", Door::pass},
    // libpod quadlets (6.0): reading passes, installing or removing does not
    {V, P | D, "/libpod/quadlets", Door::quadlets},
    {V, D, "/libpod/quadlets/{}", Door::quadlets},
    {V, G, "/libpod/quadlets/json", Door::pass},
    {V, G, "/libpod/quadlets/{}/exists", Door::pass},
    {V, G, "/libpod/quadlets/{}/file", Door::pass},
    // libpod networks, volumes, secrets
    {V, P, "/libpod/networks/create", Door::pass},
    {V, G, "/libpod/networks/json", Door::pass},
    {V, P, "/libpod/networks/prune", Door::pass},
    {V, G | D, "/libpod/networks/{}", Door::pass},
    {V, P, "/libpod/networks/{}/connect", Door::pass},
    {V, P, "/libpod/networks/{}/disconnect", Door::pass},
    {V, G, "/libpod/networks/{}/exists", Door::pass},
    {V, G, "/libpod/networks/{}/json", Door::pass},
    {V, P, "/libpod/networks/{}/update", Door::pass},
    {V, P, "/libpod/volumes/create", Door::pass},
    {V, G, "/libpod/volumes/json", Door::pass},
    {V, P, "/libpod/volumes/prune", Door::pass},
    {V, D, "/libpod/volumes/{}", Door::pass},
    {V, G, "/libpod/volumes/{}/exists", Door::pass},
    {V, G, "/libpod/volumes/{}/export", Door::pass},
    {V, P, "/libpod/volumes/{}/import", Door::pass},
    {V, G, "/libpod/volumes/{}/json", Door::pass},
    {V, P, "/libpod/secrets/create", Door::pass},
    {V, G, "/libpod/secrets/json", Door::pass},
    {V, D, "/libpod/secrets/{}", Door::pass},
    {V, G, "/libpod/secrets/{}/exists", Door::pass},
    {V, G, "/libpod/secrets/{}/json", Door::pass},
};

// Matches `s` against a table pattern: literal bytes, `{}` for one or more
// bytes but '/', `{*}` for any bytes (backtracking; patterns have at most two).
bool match(std::string_view pat, std::string_view s) {
  size_t b = pat.find('{');
  if (b == std::string_view::npos) return pat == s;
  if (s.size() < b || s.substr(0, b) != pat.substr(0, b)) return false;
  pat.remove_prefix(b);
  s.remove_prefix(b);
  if (pat.substr(0, 3) == "{*}") {
    pat.remove_prefix(3);
    size_t lit = pat.find('{');
    if (lit == std::string_view::npos) {  // the usual case: a literal tail
      return s.size() >= pat.size() && s.substr(s.size() - pat.size()) == pat;
    }
    std::string_view head = pat.substr(0, lit);
    for (size_t k = s.find(head); k != std::string_view::npos; k = s.find(head, k + 1)) {
      if (match(pat, s.substr(k))) return true;
    }
    return false;
  }
  pat.remove_prefix(2);  // "{}"
  size_t k = 0;
  while (k < s.size() && s[k] != '/') ++k;
  for (size_t n = k; n >= 1; --n) {
    if (match(pat, s.substr(n))) return true;
  }
  return false;
}

// Each pattern's literal prefix (the bytes before its first `{`, or all of
// it), computed once: a request's path is compared with it before match()
// runs, so most of the table is passed over in a few compares.
struct Prefixes {
  size_t len[std::size(kTable)];
  Prefixes() {
    for (size_t i = 0; i < std::size(kTable); ++i) {
      size_t b = kTable[i].pattern.find('{');
      len[i] = b == std::string_view::npos ? kTable[i].pattern.size() : b;
    }
  }
};
const Prefixes kPrefixes;

uint8_t method_bit(std::string_view m) {
  if (m == "GET") return G;
  if (m == "HEAD") return H;
  if (m == "POST") return P;
  if (m == "PUT") return U;
  if (m == "DELETE") return D;
  return OTHER;
}

// A door's decision for one matching route.
Route judge(Door door, std::string_view method, std::string_view shown, std::string_view query,
            bool has_body) {
  Route r;
  switch (door) {
    case Door::pass:
      return r;
    case Door::create_libpod:
      r.action = Action::create_libpod;
      r.klass = RouteClass::create;
      return r;
    case Door::create_compat:
      r.action = Action::create_compat;
      r.klass = RouteClass::create;
      return r;
    case Door::kube:
      return refuse(method, shown, kWhyKube, RouteClass::door, "kube_play");
    case Door::restore: {
      bool import = has_body;
      for (const auto& p : parse_query(query)) {
        if (p.key.rfind("import", 0) == 0) import = true;
      }
      if (import) return refuse(method, shown, kWhyRestore, RouteClass::door, "restore_import");
      r.klass = RouteClass::door;
      return r;
    }
    case Door::build:
      return check_build(method, shown, query);
    case Door::local:
      return refuse(method, shown, kWhyLocal, RouteClass::door, "local_path");
    case Door::quadlets:
      return refuse(method, shown, kWhyQuadlets, RouteClass::door, "quadlets");
    case Door::scp:
      return refuse(method, shown, kWhyScp, RouteClass::door, "image_scp");
  }
  return r;
}

}  // namespace

namespace {

// Maps every rune of `s` through `table` (runes not in it, and bytes that are
// not UTF-8, are kept as they are) and ASCII upper case to lower case.
template <size_t N>
std::string fold_with(std::string_view s, const GoCaseFold (&table)[N]) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      continue;
    }
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n > 1 && i + n <= s.size()) {
      char32_t cp = c & (0x7F >> n);
      bool ok = true;
      for (size_t k = 1; k < n; ++k) {
        unsigned char d = static_cast<unsigned char>(s[i + k]);
        ok = ok && (d & 0xC0) == 0x80;
        cp = (cp << 6) | (d & 0x3F);
      }
      static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (ok && cp >= kMin[n]) {  // an overlong form is not that rune for Go
        char ascii = 0;
        for (const GoCaseFold& f : table) {
          if (f.rune == cp) ascii = f.ascii;
        }
        if (ascii) {
          out.push_back(ascii);
        } else {
          out.append(s.substr(i, n));
        }
        i += n - 1;
        continue;
      }
    }
    out.push_back(static_cast<char>(c));
  }
  return out;
}

}  // namespace

std::string fold(std::string_view s) { return fold_with(s, kEncodingJsonFold); }
std::string fold_lower(std::string_view s) { return fold_with(s, kJsoniterLower); }

size_t version_prefix(std::string_view path) {
  if (path.size() < 4 || path[0] != '/' || path[1] != 'v') return 0;
  if (!(path[2] >= '0' && path[2] <= '9')) return 0;
  size_t i = 3;
  while (i < path.size() && is_version_char(path[i])) ++i;
  if (i >= path.size() || path[i] != '/') return 0;
  return i;
}

bool needs_clean(std::string_view path) {
  if (path.empty() || path[0] != '/') return true;
  auto segs = split_path(path);
  for (size_t i = 0; i < segs.size(); ++i) {
    bool last = i + 1 == segs.size();
    if (segs[i].empty() && !last) return true;  // "//"
    if (segs[i] == "." || segs[i] == "..") return true;
  }
  return false;
}

Route classify(std::string_view method, std::string_view target, bool has_body,
               std::string_view content_type) {
  // Only origin-form: an absolute-form target is routed by Go on its path,
  // which this filter does not reconstruct; "*" routes nowhere.
  if (target.empty() || target[0] != '/') {
    return refuse(method, target.substr(0, 64),
                  "the request target must be a path starting with '/' (origin-form)",
                  RouteClass::bad_target, "not_origin_form");
  }
  size_t qpos = target.find('?');
  std::string_view path = target.substr(0, qpos);
  std::string_view query = qpos == std::string_view::npos ? std::string_view{} : target.substr(qpos + 1);
  std::string_view shown = path.substr(0, 200);

  for (size_t i = 0; i < path.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(path[i]);
    if (!path_byte_kept(c)) {
      return refuse(method, shown,
                    "the path has a byte the engine's router would re-escape before matching; "
                    "percent-encode it",
                    RouteClass::bad_target, "path_reescaped");
    }
    if (c == '%' && !(i + 2 < path.size() && is_hex(path[i + 1]) && is_hex(path[i + 2]))) {
      return refuse(method, shown, "the path has an invalid percent-escape", RouteClass::bad_target,
                    "path_bad_escape");
    }
  }
  if (needs_clean(path)) {
    return refuse(method, shown,
                  "the path has an empty, '.' or '..' segment, which the engine only redirects; "
                  "send the cleaned path",
                  RouteClass::bad_target, "path_unclean");
  }
  if (fold(content_type).find("application/grpc") != std::string::npos) {
    return refuse(method, shown, kWhyGrpc, RouteClass::bad_target, "grpc");
  }

  size_t vp = version_prefix(path);
  std::string_view rest = path.substr(vp);  // starts with '/'
  const uint8_t scope = vp > 0 ? V : UNV;
  const uint8_t mbit = method_bit(method);
  // Every route that matches is judged; a refusal wins over a create, a
  // create over a pass, so the route order of podman's router (first match)
  // cannot make the filter forward what one of the matches would refuse.
  auto rank = [](const Route& r) {
    if (r.action == Action::refuse) return 3;
    if (r.action != Action::pass) return 2;
    return r.klass == RouteClass::door ? 1 : 0;
  };
  bool matched = false;
  Route best;
  for (size_t i = 0; i < std::size(kTable); ++i) {
    const Entry& e = kTable[i];
    if (!(e.scope & scope) || !(e.methods & mbit)) continue;
    size_t b = kPrefixes.len[i];
    if (rest.size() < b) continue;
    // Bytes 1 and 8 first (the family, and the libpod resource): cheap
    // early outs of the same prefix compare.
    if ((b > 1 && rest[1] != e.pattern[1]) || (b > 8 && rest[8] != e.pattern[8])) continue;
    if (rest.compare(0, b, e.pattern.substr(0, b)) != 0) continue;
    if (!match(e.pattern, rest)) continue;
    Route r = judge(e.door, method, shown, query, has_body);
    if (!matched || rank(r) > rank(best)) best = std::move(r);
    matched = true;
  }
  if (matched) return best;
  return refuse(method, shown,
                "no engine endpoint has this method and path (the filter forwards only the routes "
                "of podman's API, 4.3 to 6.0); check the method and the path, e.g. "
                "GET /v4.0.0/libpod/containers/json",
                RouteClass::unknown, "unknown_route");
}

std::string_view class_name(RouteClass c) {
  switch (c) {
    case RouteClass::known: return "known";
    case RouteClass::create: return "create";
    case RouteClass::door: return "door";
    case RouteClass::unknown: return "unknown";
    case RouteClass::bad_target: return "bad_target";
  }
  return "?";
}

}  // namespace fy::sockfilter
