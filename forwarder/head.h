// The forwarder's view of a connection's first request head.
//
// The forwarder reads exactly one head per connection: the first. It must
// agree with the proxy on three things, or a client could smuggle a request
// past it unstamped or carry a stamp of its own choosing: where the head ends,
// where each header line starts and ends, and which lines are stamps. So it
// accepts only canonical HTTP/1 (ADR-0034), and refuses everything else before
// any byte goes upstream:
//
//   request-line = METHOD SP target SP ("HTTP/1.1" | "HTTP/1.0") CRLF
//   METHOD       = upper-case letters, '-' or '_' (1..32)
//   target       = CONNECT: host ":" port (authority-form, port required)
//                  other:   "http://" | "https://" authority [path/query]
//   header line  = token ":" *(SP/HTAB) value CRLF   (no space before ':',
//                  no obs-fold, no CTL in the value but HTAB)
//   every line end is CRLF; the head ends at the first empty line.
//
// Nothing here allocates: a Head holds views into the caller's buffer and a
// fixed array of the byte ranges to keep, so the stamped head goes upstream as
// an iovec splice of the original bytes plus one generated line.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fy::fwd {

// Why a head was refused. Each has a counter (see refusal_name()).
enum class Refusal : uint8_t {
  none = 0,
  too_large,         // no end of head within the size limit
  too_many_headers,  // more header lines than the limit
  bare_lf,           // a line ends in LF without CR
  bare_cr,           // a CR not followed by LF
  nul,               // a NUL byte anywhere in the head
  leading_empty,     // an empty line before the request line
  request_line,      // not METHOD SP target SP version (single spaces)
  method,            // a character outside [A-Z_-] or too long
  method_case,       // a lower-case letter in the method
  version,           // not HTTP/1.1 or HTTP/1.0
  target_form,       // not absolute-form (or authority-form for CONNECT)
  target,            // a malformed authority, or a byte outside visible ASCII
  obs_fold,          // a header line starting with SP or HTAB
  header_name,       // empty, non-token or space before the colon
  header_value,      // a control character in a value
  kCount,
};

const char* refusal_name(Refusal r);
// One sentence for the client and the log: what was wrong.
const char* refusal_reason(Refusal r);

struct HeadLimits {
  size_t max_bytes = 16 * 1024;
  size_t max_headers = 128;  // at most Head::kMaxHeaders
};

// A byte range of the buffer.
struct Span {
  uint32_t off = 0;
  uint32_t len = 0;
};

struct Head {
  // Header lines are limited to kMaxHeaders, so removing stamp lines never
  // splits the head into more than kMaxHeaders + 1 ranges.
  static constexpr size_t kMaxHeaders = 256;
  static constexpr size_t kMaxKeep = kMaxHeaders + 1;

  std::string_view method;
  std::string_view target;
  std::string_view version;
  bool is_connect = false;
  // The whole head, final CRLF CRLF included; bytes after it belong to the
  // body or the tunnel and are relayed untouched.
  size_t length = 0;
  // Bytes of the head to send upstream, in order: the request line and every
  // header line except the stamps; the final empty line is not included (the
  // caller adds its stamp line, then "\r\n").
  std::array<Span, kMaxKeep> keep{};
  size_t keep_count = 0;
  // How many client-written stamp header lines were dropped.
  size_t stamps_removed = 0;
  size_t header_count = 0;
};

enum class ParseStatus : uint8_t { complete, incomplete, refused };

struct ParseResult {
  ParseStatus status = ParseStatus::incomplete;
  Refusal refusal = Refusal::none;
};

// Parses the head at the start of `buf`. Complete lines are checked as they
// are found, so a bad head is refused as soon as its first bad line arrives;
// `incomplete` means every line so far is canonical and more bytes are needed
// (the caller refuses with too_large once `buf` reaches limits.max_bytes; the
// parser does too). `out` is valid only when status == complete, and only
// while `buf` is.
ParseResult parse_head(std::string_view buf, const HeadLimits& limits, Head* out);

// Fills `iov` with the stamped head: keep ranges of `buf`, then `stamp_line`
// (a complete "Fy-Stamp: ...\r\n" line, or empty for an unstamped port), then
// "\r\n". Returns the number of iovecs used (at most Head::kMaxKeep + 2).
size_t build_iov(const Head& head, std::string_view buf, std::string_view stamp_line, iovec* iov);

}  // namespace fy::fwd
