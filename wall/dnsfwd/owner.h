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
  // The same, first by an exact lookup (no dump: the kernel's own socket
  // lookup, O(1)) of the socket at `addr` whose peer is `peer` (a UDP socket
  // that is not connected matches any peer); only when that finds nothing, by
  // uid()'s filtered dump, which walks the whole socket table (tens of µs).
  std::optional<uint32_t> uid_of(int protocol, const sockaddr* addr, const sockaddr* peer);

 private:
  std::optional<uint32_t> exact(int protocol, const sockaddr* addr, const sockaddr* peer);
  // Sends `len` bytes of request and collects the matching sockets' uid.
  std::optional<uint32_t> ask(void* req, size_t len, const sockaddr* addr);
  int fd_ = -1;
  uint32_t seq_ = 1;
};

}  // namespace fy::dnsfwd
