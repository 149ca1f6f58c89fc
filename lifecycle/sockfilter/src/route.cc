#include "src/route.h"

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

Route refuse(std::string_view method, std::string_view path, std::string_view why) {
  Route r;
  r.action = Action::refuse;
  r.reason = std::string(method) + " " + std::string(path) + " refused: " + std::string(why);
  return r;
}

bool seg_is(const std::vector<std::string_view>& s, std::initializer_list<std::string_view> want) {
  if (s.size() != want.size()) return false;
  size_t i = 0;
  for (auto w : want) {
    if (!w.empty() && s[i] != w) return false;
    if (w.empty() && s[i].empty()) return false;  // "" stands for a {name}: non-empty
    ++i;
  }
  return true;
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
                          "leave isolation unset or use oci");
      }
    } else if (p.key == "volume") {
      return refuse(method, path,
                    "build volumes bind paths of the engine's machine into build steps; "
                    "build without --volume");
    }
  }
  return {};
}

}  // namespace

std::string fold(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 'A' && c <= 'Z') {
      out.push_back(static_cast<char>(c + 32));
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x84 &&
               static_cast<unsigned char>(s[i + 2]) == 0xAA) {
      out.push_back('k');  // U+212A KELVIN SIGN
      i += 2;
    } else if (c == 0xC5 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xBF) {
      out.push_back('s');  // U+017F LATIN SMALL LETTER LONG S
      i += 1;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

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
                  "the request target must be a path starting with '/' (origin-form)");
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
                    "percent-encode it");
    }
    if (c == '%' && !(i + 2 < path.size() && is_hex(path[i + 1]) && is_hex(path[i + 2]))) {
      return refuse(method, shown, "the path has an invalid percent-escape");
    }
  }
  if (needs_clean(path)) {
    return refuse(method, shown,
                  "the path has an empty, '.' or '..' segment, which the engine only redirects; "
                  "send the cleaned path");
  }
  if (content_type.size() >= 16 && fold(content_type.substr(0, 16)) == "application/grpc") {
    return refuse(method, shown, kWhyGrpc);
  }

  size_t vp = version_prefix(path);
  std::string_view rest = path.substr(vp);  // starts with '/'
  auto segs = split_path(rest);
  bool post = method == "POST";

  if (vp > 0 && !segs.empty() && segs[0] == "libpod") {
    std::vector<std::string_view> s(segs.begin() + 1, segs.end());
    if (post && seg_is(s, {"containers", "create"})) return {Action::create_libpod, {}};
    if (post && (seg_is(s, {"play", "kube"}) || seg_is(s, {"kube", "play"}) ||
                 seg_is(s, {"kube", "apply"}))) {
      return refuse(method, shown, kWhyKube);
    }
    if (post && seg_is(s, {"containers", "", "restore"})) {
      bool import = has_body;
      for (const auto& p : parse_query(query)) {
        if (p.key.rfind("import", 0) == 0) import = true;
      }
      if (import) return refuse(method, shown, kWhyRestore);
      return {};
    }
    if (post && seg_is(s, {"build"})) return check_build(method, shown, query);
    if (post && (seg_is(s, {"local", "build"}) || seg_is(s, {"local", "images", "load"}) ||
                 seg_is(s, {"artifacts", "local", "add"}))) {
      return refuse(method, shown, kWhyLocal);
    }
    if (!s.empty() && s[0] == "quadlets" && method != "GET" && method != "HEAD") {
      return refuse(method, shown, kWhyQuadlets);
    }
    if (post && s.size() == 3 && s[0] == "images" && s[1] == "scp") {
      return refuse(method, shown, kWhyScp);
    }
    return {};
  }
  if (post && seg_is(segs, {"containers", "create"})) return {Action::create_compat, {}};
  if (post && seg_is(segs, {"build"})) return check_build(method, shown, query);
  return {};
}

}  // namespace fy::sockfilter
