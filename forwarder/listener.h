// A set of listening sockets in one network namespace: for each daemon port
// on one address, one socket per worker (an SO_REUSEPORT group when there are
// several; forwarder/worker.h). The bridge listener lives in the followed
// rootless namespace, the VM listener in the forwarder's own. A connection is
// accepted by the worker whose socket the kernel gave it to and becomes a
// Connection there (forwarder/relay.h).
//
// Made and destroyed on the main thread. Each worker's sockets are watched by
// that worker's engine from the moment open() returns; the destructor hands
// each socket to its worker to unwatch and close, in order after whatever the
// worker was asked before (a new namespace's listener is made first, so the
// old sockets close only after the new ones accept).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/result.h"
#include "forwarder/engine.h"
#include "core/fd.h"
#include "forwarder/netns.h"
#include "forwarder/relay.h"

namespace fy::fwd {

class Worker;

class Listener {
 public:
  // Makes the sockets inside `ns_fd` (or in the caller's namespace when
  // ns_fd < 0) and starts accepting on every worker.
  static Result<std::unique_ptr<Listener>> open(const std::vector<Worker*>& workers,
                                                const Config& cfg, ListenerKind kind, int ns_fd,
                                                NsId ns, const std::string& ip,
                                                const std::string& net);
  // Closing the sockets: later connects to them are reset by the kernel.
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  NsId ns() const { return ns_; }
  ListenerKind kind() const { return common_->kind; }
  // "0.0.0.0:42600,42700"; a band as a range, "0.0.0.0:41000-41089,41100-41189"
  const std::string& describe() const { return common_->desc; }
  // How often net = "auto" re-read its interface map (0 for a fixed net).
  uint64_t iface_refreshes() const;

 private:
  // What a listener's ports share, read by whichever worker accepts.
  struct Common {
    ListenerKind kind = ListenerKind::bridge;
    int family = AF_INET;  // the listening sockets' (AF_INET6 for an IPv6 listen)
    std::string net;       // "auto" (bridge): the name of the connection's ingress link
    std::string desc;      // describe()
    std::mutex ifmap_mu;
    IfaceMap ifmap;  // bridge listener only; guarded by ifmap_mu
  };
  // One socket of one port, on one worker: touched only on that worker.
  //
  // Out of descriptors (EMFILE/ENFILE), the spare descriptor is given up to
  // accept one client and reset it, then taken back. Another thread may take
  // the freed slot first (another worker, the thread pool); with no spare to
  // give, the socket is not watched for kPauseMs instead, so a level-triggered
  // listener whose accept keeps failing does not spin its worker.
  struct Port final : Watcher, TimerSlot {
    static constexpr uint64_t kPauseMs = 50;
    std::shared_ptr<Common> common;
    RelayContext* ctx = nullptr;
    Fd fd;
    const PortRule* rule = nullptr;
    Fd spare;  // released to accept-and-reset when out of fds
    bool paused = false;
    void on_io(uint32_t events) override { accept_on(); }
    void on_timer() override;
    void accept_on();
    // A bridge listener's stamped port: a.net from the connection's ingress
    // link, or a.ingress_refusal when it must not be stamped.
    void bridge_ingress(Accepted& a);
    // Out of descriptors: reset one waiting client if a spare can be given
    // up; otherwise stop watching for kPauseMs.
    void out_of_fds();
  };
  explicit Listener(NsId ns) : ns_(ns) {}

  NsId ns_;
  std::shared_ptr<Common> common_;
  std::vector<std::pair<Worker*, std::unique_ptr<Port>>> ports_;
};

}  // namespace fy::fwd
