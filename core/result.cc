#include "core/result.h"

namespace fy {

const char* errc_name(Errc e) {
  switch (e) {
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::parse: return "parse";
    case Errc::io: return "io";
    case Errc::not_found: return "not_found";
    case Errc::permission: return "permission";
    case Errc::timeout: return "timeout";
    case Errc::too_large: return "too_large";
    case Errc::closed: return "closed";
    case Errc::refused: return "refused";
    case Errc::tls: return "tls";
    case Errc::dns: return "dns";
    case Errc::connect: return "connect";
    case Errc::reset: return "reset";
    case Errc::internal: return "internal";
  }
  return "unknown";
}

}  // namespace fy
