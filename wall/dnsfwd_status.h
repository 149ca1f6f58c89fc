// `fy-wall status machine`'s fy-dnsfwd line: does anything listen where the
// live dns_redirect chain sends the walled principals' port 53? In its own
// file, apart from wall/cli.cc: the status command calls
// print_dnsfwd_status() after the deputies (one line in Cli::cmd_status).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wall/nft.h"
#include "wall/parse.h"

namespace fy::wall {

struct DnsfwdTarget {
  std::string addr;  // canonical IPv4 text
  uint16_t port = 53;
};

// Pure: the address `dnat ip to A:P` of the dns_redirect chain in a listing
// of inet fy_wall, or nullopt when the chain is absent (no dns_forwarder).
std::optional<DnsfwdTarget> dnsfwd_target(std::string_view listing);

struct DnsfwdStatus {
  bool udp = false, tcp = false;  // a listener on the address (or a wildcard), port P
  std::string line;               // what status prints, one line
  bool ok() const { return udp && tcp; }
};

// Pure: judged against the listeners of this namespace (/proc/net/{udp,tcp}).
DnsfwdStatus dnsfwd_status(const DnsfwdTarget& t, const std::vector<Listener>& listeners);

// Lists inet fy_wall through `nft`, reads /proc/net/{udp,tcp} of the calling
// thread's namespace and prints the line to `out` (nothing when the wall has
// no dns_redirect). Returns false only when the redirect exists and fy-dnsfwd
// is not listening on both protocols: the walled principals' DNS then fails,
// closed. Status does not count that as the wall not enforcing.
bool print_dnsfwd_status(FILE* out, Nft& nft);

}  // namespace fy::wall
