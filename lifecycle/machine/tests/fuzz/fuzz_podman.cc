// libFuzzer target: what fy-machine reads from podman machine — `podman
// machine list` lines and the machine's JSON (its mounts). Traps on a listed
// machine without a name or with the default marker left on.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "plan.h"

using namespace fy::machine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (const auto& m : parse_podman_list(in))
    if (m.name.empty() || m.name.back() == '*' || m.name.find('\n') != std::string::npos) abort();
  parse_podman_mounts(in);
  return 0;
}
