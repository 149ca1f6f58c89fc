// One header field of a parsed head, as views into the head's bytes. Apart
// from parser.h so that pure code (policy/admission) can read a head's fields
// without llhttp.
#pragma once

#include <string_view>

namespace fy::http {

struct Header {
  std::string_view name;
  std::string_view value;
};

}  // namespace fy::http
