#include "forwarder/redirect.h"

#include <sched.h>
#include <sys/select.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include "core/net.h"
#include "core/nft.h"

namespace fy::fwd {
namespace {

bool wildcard(const std::string& ip) {
  return ip == "0.0.0.0" || ip == "::";
}

}  // namespace

const char* redirect_family(const Config& cfg) {
  return is_ipv6_literal(cfg.upstream_host) ? "ip6" : "ip";
}

std::string redirect_ruleset(const Config& cfg) {
  const char* fam = redirect_family(cfg);
  // One set for every port, a band as an interval ("41000-41089"): one rule
  // whatever the number of ports.
  const std::string ports = format_ports(cfg.ports, ", ");
  std::string to =
      wildcard(cfg.bridge.listen) ? std::string("redirect") : "dnat to " + cfg.bridge.listen;
  return fmt::format(
      "table {0} {1} {{}}\n"
      "delete table {0} {1}\n"
      "table {0} {1} {{\n"
      "  chain prerouting {{\n"
      "    type nat hook prerouting priority dstnat; policy accept;\n"
      "    {0} daddr {2} tcp dport {{ {3} }} {4}\n"
      "  }}\n"
      "}}\n",
      fam, kRedirectTable, cfg.upstream_host, ports, to);
}

Result<void> install_redirect(const Config& cfg) {
  // libnftables waits for the kernel's answers with select(), whose fd_set
  // holds descriptors below FD_SETSIZE (1024) only: glibc's check aborts the
  // whole process ("bit out of range 0 - FD_SETSIZE on fd_set") when the
  // netlink socket it opened is numbered higher. The forwarder passes 1024
  // descriptors easily: a listening socket and a spare per port, worker and
  // namespace (a 180-port band with one worker: 720, and a new namespace's
  // listener is made before the old one closes), and two per connection. So
  // the transaction runs on a thread of its own (it inherits the caller's
  // namespace) whose descriptor table is a private copy with everything but
  // stdio closed in it: libnftables' socket is then numbered 3 or so. The
  // process's table, and every descriptor in it, are untouched.
  Result<void> out = make_error(Errc::internal, "the redirect's thread did not run");
  std::thread t([&] {
    if (unshare(CLONE_FILES) != 0) {
      out = make_error(Errc::io, "unshare(CLONE_FILES): {}", strerror(errno));
      return;
    }
    if (close_range(3, FD_SETSIZE - 1, 0) != 0)
      for (int fd = 3; fd < FD_SETSIZE; ++fd) ::close(fd);
    out = install_redirect_here(cfg);
  });
  t.join();
  return out;
}

Result<void> install_redirect_here(const Config& cfg) {
  // A context's netlink socket belongs to the namespace it was made in: make
  // it here, on the namespace's thread, and free it before leaving. open()
  // probes first, so a want of descriptors leaves this namespace unserved
  // (and retried) instead of libnftables exit()ing the forwarder.
  auto ctx = nft::Ctx::open();
  if (!ctx) return std::move(ctx).take_error();
  nft::Reply r = ctx->run(redirect_ruleset(cfg));
  if (r.ok) return {};
  std::string err = nft::condense(r.err);
  if (err.empty()) err = "libnftables gave no message";
  return make_error(Errc::refused, "the kernel refused table {} {} (nothing was changed): {}",
                    redirect_family(cfg), kRedirectTable, err);
}

}  // namespace fy::fwd
