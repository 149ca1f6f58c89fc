// The guest's answer and the engine's container list are box-influenced
// bytes: neither parser may crash, and an accepted answer is always for the
// project asked about.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto a = fy::compose::parse_answer(in, "services", "proj");
  (void)a;
  auto c = fy::compose::pick_container(in, "proj", "web");
  (void)c;
  auto t = fy::compose::parse_ssh_target(in);
  if (t && (t->config.empty() || t->config[0] != '/' || t->host.empty() || t->host[0] == '-'))
    std::abort();
  return 0;
}
