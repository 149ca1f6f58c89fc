// A set of listening sockets in one network namespace: one per daemon port on
// one address. The bridge listener lives in the followed rootless namespace,
// the VM listener in the forwarder's own. Accepted connections become
// Connections (forwarder/relay.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "forwarder/engine.h"
#include "forwarder/fd.h"
#include "forwarder/netns.h"
#include "forwarder/relay.h"

namespace fy::fwd {

class Listener {
 public:
  // Makes the sockets inside `ns_fd` (or in the caller's namespace when
  // ns_fd < 0) and starts accepting on the engine.
  static Result<std::unique_ptr<Listener>> open(RelayContext* ctx, ListenerKind kind, int ns_fd,
                                                NsId ns, const std::string& ip,
                                                const std::string& net);
  // Closing the sockets: later connects to them are reset by the kernel.
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  NsId ns() const { return ns_; }
  ListenerKind kind() const { return kind_; }
  std::string describe() const;  // "0.0.0.0:42600,42700"

 private:
  struct Port final : Watcher {
    Listener* l = nullptr;
    UniqueFd fd;
    const PortRule* rule = nullptr;
    void on_io(uint32_t events) override { l->accept_on(*this); }
  };
  Listener(RelayContext* ctx, ListenerKind kind, NsId ns, std::string ip, std::string net)
      : ctx_(ctx), kind_(kind), ns_(ns), ip_(std::move(ip)), net_(std::move(net)) {}
  void accept_on(Port& p);

  RelayContext* ctx_;
  ListenerKind kind_;
  NsId ns_;
  std::string ip_;
  std::string net_;  // "auto" (bridge): the interface of the local address
  std::vector<std::unique_ptr<Port>> ports_;
  IfaceMap ifmap_;
  UniqueFd spare_;  // released to accept-and-reset when out of fds
};

}  // namespace fy::fwd
