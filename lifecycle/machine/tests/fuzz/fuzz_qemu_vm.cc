// libFuzzer target: the qemu backend's vm.json (a file in the VM's folder,
// which anything with the user's rights may have rewritten). Traps when an
// accepted record breaks what qemu_argv and the boot hook rely on (an
// absolute mount path with no ',' or newline, sizes in range) or does not
// round-trip through render_qemu_vm.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "qemu.h"

using namespace fy::machine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto v = parse_qemu_vm(in);
  if (!v) return 0;
  if (v->image.empty() || v->cpus < 1 || v->cpus > 256 || v->memory_mib < 128) abort();
  for (const auto& m : v->mounts)
    if (m.empty() || m[0] != '/' || m.find_first_of(",\n\r") != std::string::npos) abort();
  auto back = parse_qemu_vm(render_qemu_vm(*v));
  if (!back || back->image != v->image || back->mounts != v->mounts || back->cpus != v->cpus ||
      back->memory_mib != v->memory_mib)
    abort();
  return 0;
}
