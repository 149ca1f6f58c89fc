#include "forwarder/head.h"

#include <cstring>

#include "core/net.h"
#include "core/stamp.h"
#include "core/text.h"

namespace fy::fwd {
namespace {

constexpr std::string_view kCrlf = "\r\n";

bool is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// Checks a line's content (CRLF stripped) for the characters no line may hold.
Refusal check_line_bytes(std::string_view content) {
  for (char ch : content) {
    if (ch == '\r') return Refusal::bare_cr;
    if (ch == '\0') return Refusal::nul;
  }
  return Refusal::none;
}

Refusal check_method(std::string_view m) {
  if (m.empty() || m.size() > 32) return Refusal::method;
  bool lower = false;
  for (char c : m) {
    if (c >= 'A' && c <= 'Z') continue;
    if (c == '-' || c == '_') continue;
    if (c >= 'a' && c <= 'z') {
      lower = true;
      continue;
    }
    return Refusal::method;
  }
  return lower ? Refusal::method_case : Refusal::none;
}

Refusal check_target(std::string_view target, bool is_connect) {
  if (target.empty()) return Refusal::target_form;
  for (char ch : target) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x21 || c > 0x7e) return Refusal::target;
  }
  if (is_connect) {
    // authority-form only: host ":" port.
    if (target.front() == '/' || target.find("://") != std::string_view::npos)
      return Refusal::target_form;
    if (target.find_first_of("/?#@") != std::string_view::npos) return Refusal::target;
    return parse_authority(target, 0).ok() ? Refusal::none : Refusal::target;
  }
  uint16_t default_port = 0;
  std::string_view rest;
  if (target.substr(0, 7) == "http://") {
    default_port = 80;
    rest = target.substr(7);
  } else if (target.substr(0, 8) == "https://") {
    default_port = 443;
    rest = target.substr(8);
  } else {
    return Refusal::target_form;  // origin-form, asterisk-form, another scheme, upper case
  }
  std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (authority.empty() || authority.find('@') != std::string_view::npos) return Refusal::target;
  return parse_authority(authority, default_port).ok() ? Refusal::none : Refusal::target;
}

Refusal check_request_line(std::string_view line, Head* out) {
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Refusal::request_line;
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
      line.find('\t') != std::string_view::npos || sp2 == sp1 + 1 || sp1 == 0 ||
      sp2 + 1 == line.size())
    return Refusal::request_line;
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (Refusal r = check_method(method); r != Refusal::none) return r;
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return Refusal::version;
  bool is_connect = method == "CONNECT";
  if (Refusal r = check_target(target, is_connect); r != Refusal::none) return r;
  out->method = method;
  out->target = target;
  out->version = version;
  out->is_connect = is_connect;
  return Refusal::none;
}

// Validates one header line's content; sets *is_stamp for a stamp header.
Refusal check_header_line(std::string_view line, bool* is_stamp) {
  if (line.front() == ' ' || line.front() == '\t') return Refusal::obs_fold;
  size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return Refusal::header_name;
  std::string_view name = line.substr(0, colon);
  for (char c : name)
    if (!is_tchar(static_cast<unsigned char>(c))) return Refusal::header_name;
  for (char ch : line.substr(colon + 1)) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '\t' || c >= 0x20) {
      if (c == 0x7f) return Refusal::header_value;
      continue;
    }
    return Refusal::header_value;
  }
  *is_stamp = stamp::is_stamp_header(name);
  return Refusal::none;
}

ParseResult refuse(Refusal r) {
  return ParseResult{ParseStatus::refused, r};
}

}  // namespace

const char* refusal_name(Refusal r) {
  switch (r) {
    case Refusal::none:
      return "none";
    case Refusal::too_large:
      return "too_large";
    case Refusal::too_many_headers:
      return "too_many_headers";
    case Refusal::bare_lf:
      return "bare_lf";
    case Refusal::bare_cr:
      return "bare_cr";
    case Refusal::nul:
      return "nul";
    case Refusal::leading_empty:
      return "leading_empty";
    case Refusal::request_line:
      return "request_line";
    case Refusal::method:
      return "method";
    case Refusal::method_case:
      return "method_case";
    case Refusal::version:
      return "version";
    case Refusal::target_form:
      return "target_form";
    case Refusal::target:
      return "target";
    case Refusal::obs_fold:
      return "obs_fold";
    case Refusal::header_name:
      return "header_name";
    case Refusal::header_value:
      return "header_value";
    case Refusal::kCount:
      break;
  }
  return "unknown";
}

const char* refusal_reason(Refusal r) {
  switch (r) {
    case Refusal::none:
      return "no refusal";
    case Refusal::too_large:
      return "the request head is larger than the limit";
    case Refusal::too_many_headers:
      return "the request head has more header lines than the limit";
    case Refusal::bare_lf:
      return "a line ends in LF without CR; every line must end in CRLF";
    case Refusal::bare_cr:
      return "a CR is not followed by LF";
    case Refusal::nul:
      return "the request head contains a NUL byte";
    case Refusal::leading_empty:
      return "the request starts with an empty line";
    case Refusal::request_line:
      return "the request line is not METHOD, target and version separated by single spaces";
    case Refusal::method:
      return "the method is not an upper-case token";
    case Refusal::method_case:
      return "the method has lower-case letters; write it in upper case";
    case Refusal::version:
      return "the version is not HTTP/1.1 or HTTP/1.0";
    case Refusal::target_form:
      return "the target is not absolute-form (http://host/path) or, for CONNECT, host:port";
    case Refusal::target:
      return "the target's host or port is malformed";
    case Refusal::obs_fold:
      return "a header line is folded (starts with a space or tab)";
    case Refusal::header_name:
      return "a header line has no name, a non-token name or a space before the colon";
    case Refusal::header_value:
      return "a header value contains a control character";
    case Refusal::kCount:
      break;
  }
  return "unknown refusal";
}

ParseResult parse_head(std::string_view buf, const HeadLimits& limits, Head* out) {
  *out = Head{};
  const size_t max_headers =
      limits.max_headers < Head::kMaxHeaders ? limits.max_headers : Head::kMaxHeaders;
  size_t pos = 0;
  size_t keep_from = 0;
  bool first = true;
  while (true) {
    if (pos > limits.max_bytes) return refuse(Refusal::too_large);
    const char* lf = static_cast<const char*>(
        pos < buf.size() ? std::memchr(buf.data() + pos, '\n', buf.size() - pos) : nullptr);
    if (!lf) {
      // A partial line: refuse early what no more bytes could fix.
      std::string_view partial = buf.substr(pos);
      if (!partial.empty() && partial.back() == '\r') partial.remove_suffix(1);
      if (Refusal r = check_line_bytes(partial); r != Refusal::none) return refuse(r);
      if (buf.size() >= limits.max_bytes) return refuse(Refusal::too_large);
      return ParseResult{ParseStatus::incomplete, Refusal::none};
    }
    size_t end = static_cast<size_t>(lf - buf.data());  // index of '\n'
    if (end + 1 > limits.max_bytes) return refuse(Refusal::too_large);
    if (end == pos || buf[end - 1] != '\r') return refuse(Refusal::bare_lf);
    std::string_view content = buf.substr(pos, end - 1 - pos);
    if (Refusal r = check_line_bytes(content); r != Refusal::none) return refuse(r);
    size_t next = end + 1;
    if (first) {
      if (content.empty()) return refuse(Refusal::leading_empty);
      if (Refusal r = check_request_line(content, out); r != Refusal::none) return refuse(r);
      first = false;
    } else if (content.empty()) {
      // End of head.
      if (pos > keep_from)
        out->keep[out->keep_count++] = Span{uint32_t(keep_from), uint32_t(pos - keep_from)};
      out->length = next;
      return ParseResult{ParseStatus::complete, Refusal::none};
    } else {
      if (++out->header_count > max_headers) return refuse(Refusal::too_many_headers);
      bool is_stamp = false;
      if (Refusal r = check_header_line(content, &is_stamp); r != Refusal::none) return refuse(r);
      if (is_stamp) {
        ++out->stamps_removed;
        if (pos > keep_from)
          out->keep[out->keep_count++] = Span{uint32_t(keep_from), uint32_t(pos - keep_from)};
        keep_from = next;
      }
    }
    pos = next;
  }
}

size_t build_iov(const Head& head, std::string_view buf, std::string_view stamp_line, iovec* iov) {
  size_t n = 0;
  for (size_t i = 0; i < head.keep_count; ++i) {
    iov[n].iov_base = const_cast<char*>(buf.data() + head.keep[i].off);
    iov[n].iov_len = head.keep[i].len;
    ++n;
  }
  if (!stamp_line.empty()) {
    iov[n].iov_base = const_cast<char*>(stamp_line.data());
    iov[n].iov_len = stamp_line.size();
    ++n;
  }
  iov[n].iov_base = const_cast<char*>(kCrlf.data());
  iov[n].iov_len = kCrlf.size();
  ++n;
  return n;
}

}  // namespace fy::fwd
