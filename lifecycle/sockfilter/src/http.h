// Request heads as the filter judges and re-emits them. Pure: the bytes come
// in, a decision or a canonical head goes out; the loop (filter.cc) applies it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fy::sockfilter {

struct Header {
  std::string name;
  std::string value;  // OWS trimmed both sides
};

struct RequestHead {
  std::string method;
  std::string target;
  int major = 1;
  int minor = 1;
  std::vector<Header> headers;
  bool chunked = false;
  std::optional<uint64_t> content_length;
  bool keep_alive = true;

  // Empties it for the next request, keeping the headers' storage.
  void reset() {
    method.clear();
    target.clear();
    major = minor = 1;
    headers.clear();
    chunked = false;
    content_length.reset();
    keep_alive = true;
  }

  // The first value of a header, by case-insensitive name; nullptr if absent.
  const std::string* get(std::string_view name) const;
  size_t count(std::string_view name) const;
  bool has_body() const { return chunked || (content_length && *content_length > 0); }
  bool expects_continue() const;
};

// The raw head, from its first byte through the blank line: refuses what
// llhttp might accept but Go reads differently or not at all. Returns the
// refusal text, or nullopt when the bytes are acceptable.
//   - a line ending in LF without CR (bare LF), a CR not followed by LF;
//   - obs-fold (a header line starting with SP or HT);
//   - NUL and other control bytes but HT;
//   - anything that does not start with an upper-case method letter.
std::optional<std::string> check_raw_head(std::string_view head);

// The parsed head: version 1.0 or 1.1 only; no PRI/CONNECT; no h2c Upgrade
// and no HTTP2-Settings; Transfer-Encoding exactly one `chunked` and never on
// HTTP/1.0 (Go ignores it there, so the chunks would be read as a next
// request); at most one Content-Length.
std::optional<std::string> check_head(const RequestHead& h);

// The head as forwarded: the request line and every header as parsed, but
// Content-Length and Transfer-Encoding (and Expect when `drop_expect`), then
// exactly one framing header: `Transfer-Encoding: chunked` when `chunked`,
// else `Content-Length: <length>` when `length` is set, else none.
std::string emit_head(const RequestHead& h, bool chunked, std::optional<uint64_t> length,
                      bool drop_expect);

// A forwarded chunked body, as the filter frames it: each piece of body it
// read goes up as one chunk (`chunk_size_line(n)`, the n bytes, CRLF), and the
// body ends with kLastChunk: no chunk extension and no trailer section, ever.
// A request whose trailer section has a field is refused before its end (see
// docs/fy-sockfilter.md, Trailers), so nothing after the last chunk but the
// blank line reaches the engine. The Go oracle reads these bytes back with
// net/http's ReadRequest (tests: unit, real_sockets, fuzz_sockfilter_framing).
std::string chunk_size_line(size_t n);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

// A complete response the filter writes itself.
std::string answer(int status, std::string_view reason, std::string_view body, bool close);

}  // namespace fy::sockfilter
