// Prints the rendered boot script (stdout) and its id (stderr) for the given
// port base and posture, from the source tree's unit files: the shellcheck
// test's input. With "kernel-closures" instead of a posture, only that
// fragment (render_kernel_closures): what tests/guest runs in the qemu guest;
// with "dns-install", the allow list's forced command (render_dns_install).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "boot.h"
#include "sys.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fy-machine-render-boot <assets dir> <port base> [gvisor]\n");
    return 2;
  }
  std::string dir = argv[1];
  fy::machine::BootSpec s;
  s.port_base = std::atoll(argv[2]);
  s.gvisor = argc > 3 && std::string(argv[3]) == "gvisor";
  auto w = fy::machine::read_file(dir + "/wall/dist/fy-wall.service");
  auto g = fy::machine::read_file(dir + "/wall/dist/fy-forwarder-guard.service");
  auto f = fy::machine::read_file(dir + "/forwarder/exe/fy-forwarder.service");
  auto d = fy::machine::read_file(dir + "/wall/dnsfwd/exe/fy-dnsfwd.service");
  if (!w || !g || !f || !d) {
    std::fprintf(stderr, "missing unit files under %s\n", dir.c_str());
    return 1;
  }
  s.wall_unit = *w;
  s.guard_unit = *g;
  s.forwarder_unit = *f;
  s.dnsfwd_unit = *d;
  s.forwarder_key = std::string(64, 'a');
  if (argc > 3 && std::string(argv[3]) == "dns-install") {
    std::fputs(fy::machine::render_dns_install(s).c_str(), stdout);
    return 0;
  }
  s.dns_allow_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFy4ZbJxRenderBootTestKeyOnly0000000000";
  if (argc > 3 && std::string(argv[3]) == "kernel-closures") {
    std::fputs(fy::machine::render_kernel_closures(s).c_str(), stdout);
    return 0;
  }
  auto r = fy::machine::render_boot(s);
  std::fputs(r.script.c_str(), stdout);
  std::fprintf(stderr, "%s\n", r.id.c_str());
  return 0;
}
