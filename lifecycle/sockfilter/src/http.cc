#include "src/http.h"

#include <cstdio>

#include "src/route.h"

namespace fy::sockfilter {
namespace {
bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x += 32;
    if (y >= 'A' && y <= 'Z') y += 32;
    if (x != y) return false;
  }
  return true;
}
}  // namespace

const std::string* RequestHead::get(std::string_view name) const {
  for (const Header& h : headers) {
    if (ieq(h.name, name)) return &h.value;
  }
  return nullptr;
}

size_t RequestHead::count(std::string_view name) const {
  size_t n = 0;
  for (const Header& h : headers) n += ieq(h.name, name);
  return n;
}

bool RequestHead::expects_continue() const {
  const std::string* e = get("expect");
  return e && ieq(*e, "100-continue");
}

namespace {
// Bytes check_raw_head looks at: CR, LF, and control bytes but HT.
struct Special {
  bool b[256] = {};
  constexpr Special() {
    for (int c = 0; c < 0x20; ++c) b[c] = c != '\t';
    b[0x7F] = true;
  }
};
constexpr Special kSpecial;
}  // namespace

std::optional<std::string> check_raw_head(std::string_view head) {
  if (head.empty() || !(head[0] >= 'A' && head[0] <= 'Z')) {
    return "the request does not start with a method";
  }
  for (size_t i = 0; i < head.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(head[i]);
    if (!kSpecial.b[c]) continue;
    if (c == '\n') return "the head has a line ending in a bare LF (CRLF is required)";
    if (c != '\r') return "the head has a control byte";
    if (i + 1 >= head.size() || head[i + 1] != '\n') return "the head has a CR without LF";
    ++i;
    // The next line starts here: a header line starting with SP or HT is
    // obs-fold.
    if (i + 1 < head.size() && (head[i + 1] == ' ' || head[i + 1] == '\t')) {
      return "the head has a folded header line (obs-fold)";
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_head(const RequestHead& h) {
  if (h.major != 1 || (h.minor != 0 && h.minor != 1)) {
    return "only HTTP/1.0 and HTTP/1.1 are served here (the HTTP/2 preface is refused)";
  }
  if (h.method == "PRI") return "the HTTP/2 preface is refused: speak HTTP/1.1";
  if (h.method == "CONNECT") return "CONNECT is not an engine API method";
  for (const Header& x : h.headers) {
    if (ieq(x.name, "http2-settings")) return "HTTP/2 (h2c) upgrades are refused: speak HTTP/1.1";
    if (ieq(x.name, "upgrade") && fold(x.value).find("h2c") != std::string::npos) {
      return "HTTP/2 (h2c) upgrades are refused: speak HTTP/1.1";
    }
  }
  size_t te = h.count("transfer-encoding");
  if (te > 0) {
    if (h.minor == 0) {
      return "Transfer-Encoding on an HTTP/1.0 request is refused (the engine ignores it there)";
    }
    if (te > 1 || fold(*h.get("transfer-encoding")) != "chunked") {
      return "Transfer-Encoding must be exactly one 'chunked'";
    }
    if (h.count("content-length") > 0) return "Content-Length together with Transfer-Encoding";
  }
  if (h.count("content-length") > 1) return "more than one Content-Length";
  return std::nullopt;
}

std::string emit_head(const RequestHead& h, bool chunked, std::optional<uint64_t> length,
                      bool drop_expect) {
  std::string out;
  out.reserve(256);
  out.append(h.method).push_back(' ');
  out.append(h.target).append(h.minor == 0 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n");
  for (const Header& x : h.headers) {
    if (ieq(x.name, "content-length") || ieq(x.name, "transfer-encoding")) continue;
    if (drop_expect && ieq(x.name, "expect")) continue;
    out.append(x.name).append(": ").append(x.value).append("\r\n");
  }
  if (chunked) {
    out.append("Transfer-Encoding: chunked\r\n");
  } else if (length) {
    out.append("Content-Length: ").append(std::to_string(*length)).append("\r\n");
  }
  out.append("\r\n");
  return out;
}

std::string chunk_size_line(size_t n) {
  char hex[24];
  int k = snprintf(hex, sizeof hex, "%zx\r\n", n);
  return std::string(hex, static_cast<size_t>(k));
}

std::string answer(int status, std::string_view reason, std::string_view body, bool close) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  out += "Content-Type: text/plain\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  out.append(body);
  return out;
}

}  // namespace fy::sockfilter
