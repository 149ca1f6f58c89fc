// libFuzzer target: what fy-machine reads from lima — `limactl list --json`
// lines, `limactl info`, lima.yaml (the mounts, the provision marker). Input:
// the bytes, given to each parser. Traps when a parsed record breaks the
// parser's contract: an instance without a name, a provision id or a mount
// that spans lines, a vmType other than the configured or vz / qemu.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "plan.h"

using namespace fy::machine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  for (const auto& i : parse_lima_list(in))
    if (i.name.empty() || i.ssh_port < 0) abort();
  std::string id = parse_provision_id(in, kProvisionMarker);
  if (id.find('\n') != std::string::npos) abort();
  for (const auto& m : parse_lima_mounts(in))
    if (m.find('\n') != std::string::npos) abort();
  auto vt = resolve_vm_type(std::nullopt, in);
  if (vt && *vt != "vz" && *vt != "qemu") abort();
  return 0;
}
