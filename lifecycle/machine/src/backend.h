// The Backend interface (ADR-0011): a VM whose whole downstream contract is a
// libpod socket. `state` is lima's or podman's word for the processes; it is
// never readiness. Readiness is `responsive`: the socket answers GET /_ping.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plan.h"
#include "sys.h"

namespace fy::machine {

enum class State { absent, stopped, running, starting, broken };
const char* state_name(State s);

// Every line a backend prints goes through here (stderr in the CLI).
using Say = std::function<void(const std::string&)>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "lima", "podman"
  virtual std::string cli() const = 0;   // the VM-lifecycle binary
  bool available() const { return on_path(cli()); }
  virtual bool supports_concurrent() const = 0;

  virtual bool exists(const std::string& n) = 0;
  virtual State state(const std::string& n) = 0;
  // The socket answers GET /_ping within 2 s.
  Probe responsive(const std::string& n) { return ping_socket(socket(n), scaled_probe()); }

  virtual bool create(const std::string& n, const Resources& r, const std::vector<Mount>& m) = 0;
  // Starts a stopped (or broken, or stuck) VM, recovering what it must first.
  virtual bool start(const std::string& n) = 0;
  // Graceful, then forced when any host process outlives it.
  virtual bool stop(const std::string& n) = 0;
  virtual bool remove(const std::string& n) = 0;
  // Signals host processes left behind by a dead VM; returns the pids.
  virtual std::vector<pid_t> reap_orphans(const std::string& n) = 0;

  virtual std::vector<std::string> mounts(const std::string& n) = 0;
  virtual std::string socket(const std::string& n) = 0;  // unix://..., "" when absent
  virtual std::string guest_socket() const = 0;
  virtual std::optional<SshConfig> ssh_target(const std::string& n) = 0;
  // The guest's ssh host public keys as the host knows them without asking
  // the network (the qemu backend makes the key itself and gives it to the
  // guest before its sshd serves it): pin_host_key pins these and never
  // scans. Empty (lima, podman): the key is scanned and pinned on first
  // contact (TOFU).
  virtual std::vector<HostKey> known_host_keys(const std::string& n) { return {}; }

  // The recorded boot provisioning's id ("" when none), and recording a new
  // one (a stopped VM only). Backends that cannot be provisioned return
  // false from can_provision().
  virtual bool can_provision() const { return false; }
  virtual std::string provision_id(const std::string& n) { return ""; }
  virtual bool set_provision(const std::string& n, const std::string& script) { return false; }
  // Runs a command in the guest as the VM user (for the post-boot check).
  virtual RunResult guest(const std::string& n, const std::vector<std::string>& argv) {
    return {127, "", "no guest shell"};
  }

  virtual std::vector<pid_t> host_pids(const std::string& n) = 0;
  virtual std::vector<std::string> list_running() = 0;

 protected:
  static std::chrono::milliseconds scaled_probe() { return std::chrono::milliseconds(2000); }
};

struct Env {
  Say say;
  std::string home;  // $HOME
  std::optional<std::string> vm_type;  // [machine].vmtype (MACHINE_VMTYPE wins)
};

std::unique_ptr<Backend> make_lima(Env e);
std::unique_ptr<Backend> make_podman(Env e);

}  // namespace fy::machine
