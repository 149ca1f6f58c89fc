// Who owns the socket a query came from: its uid, through sock_diag, asked
// in the namespace of the listener that received it (the netlink socket is
// made there). Only a listener in the namespace of its clients' sockets (the
// VM's own: the walled user's processes, a container run with the host's
// network) finds them; a bridge listener's clients live in their containers'
// namespaces and are named by address instead.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <optional>

#include "core/result.h"

namespace fy::dnsfwd {

class SocketOwner {
 public:
  SocketOwner() = default;
  ~SocketOwner();
  SocketOwner(const SocketOwner&) = delete;
  SocketOwner& operator=(const SocketOwner&) = delete;

  // Makes the sock_diag socket in the calling thread's namespace.
  Result<void> open();
  // The uid of the `protocol` (IPPROTO_UDP or IPPROTO_TCP) socket bound to
  // `addr` (the query's source), or nullopt when there is none here or the
  // kernel did not answer within 20 ms. One dump filtered to the source port
  // in the kernel (INET_DIAG_BC_S_GE/LE), so its cost does not grow with the
  // machine's other sockets' traffic; blocking, on the loop thread.
  std::optional<uint32_t> uid(int protocol, const sockaddr* addr);

 private:
  int fd_ = -1;
  uint32_t seq_ = 1;
};

}  // namespace fy::dnsfwd
