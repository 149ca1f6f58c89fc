#include "proxy/netlog/error_kind.h"

namespace fy::netlog {

std::string_view error_kind_name(ErrorKind k) {
  for (const ErrorKindRow& r : kErrorKinds)
    if (r.kind == k) return r.name;
  return "io";
}

ErrorKind error_kind_of(Errc e) {
  switch (e) {
    case Errc::dns: return ErrorKind::dns;
    case Errc::connect: return ErrorKind::connect;
    case Errc::tls: return ErrorKind::tls;
    case Errc::reset: return ErrorKind::reset;
    case Errc::timeout: return ErrorKind::timeout;
    case Errc::closed: return ErrorKind::closed;
    case Errc::parse: return ErrorKind::protocol;
    default: return ErrorKind::io;
  }
}

std::string error_text(ErrorKind k, std::string_view detail) {
  std::string s(error_kind_name(k));
  s += ": ";
  s += detail;
  return s;
}

std::optional<ErrorKind> parse_error_kind(std::string_view error) {
  if (error.starts_with(kClientPrefix)) error.remove_prefix(kClientPrefix.size());
  size_t colon = error.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view name = error.substr(0, colon);
  for (const ErrorKindRow& r : kErrorKinds)
    if (r.name == name) return r.kind;
  return std::nullopt;
}

}  // namespace fy::netlog
