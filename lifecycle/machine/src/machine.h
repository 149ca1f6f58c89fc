// The lifecycle verbs over one Backend: ensure, status, stop, rm, socket,
// ssh-target. Each returns the CLI's exit code (0 done, 1 refused or failed)
// and says what happened, and what to run, through `say`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "boot.h"
#include "plan.h"

namespace fy::machine {

struct Settings {
  std::string name;
  Resources res;
  std::string repo;
  std::string wt_root;
  Selection sel;
  BootSpec boot;
  std::string state_dir;  // fy-machine's own files for this VM (the pinned host key)
  // The proxy policy whose names the guest's fy-dnsfwd may resolve
  // ([machine].dns_policy, FY_MACHINE_DNS_POLICY): ensure renders and sends
  // it after the boot. "" sends nothing (the guest's list stays as it is).
  std::string dns_policy;
  std::string dnsfwd_allow_bin = "fy-dnsfwd-allow";  // renders a policy's names
};

// The allow list's channel key in the state dir (ssh-keygen, once per VM;
// <file>.pub is what the boot provisioning gives root's authorized_keys).
inline constexpr std::string_view kDnsAllowKeyFile = "dns-allow_ed25519";

// A readiness condition beyond GET /_ping (ADR-0025's runtime probe of the
// socket filter is one). `ensure` is done only when every check passes.
class ReadinessCheck {
 public:
  virtual ~ReadinessCheck() = default;
  virtual std::string name() const = 0;
  virtual Probe check(Backend& b, const std::string& vm, const std::string& ssh_config,
                      const std::string& alias) = 0;
};

// Under the gVisor posture: `podman info` through the filtered socket in the
// guest, over the pinned ssh target, must name the runsc-fy runtime (10 x 1 s).
std::unique_ptr<ReadinessCheck> make_gvisor_probe();

class Machine {
 public:
  Machine(Settings s, std::unique_ptr<Backend> b, Say say)
      : s_(std::move(s)), b_(std::move(b)), say_(std::move(say)) {}
  void add_check(std::unique_ptr<ReadinessCheck> c) { checks_.push_back(std::move(c)); }

  int ensure();
  int status();
  int stop();
  int rm();
  int socket();
  int ssh_target(bool json);
  // Sends the guest's fy-dnsfwd a new allow list over root's forced-command
  // channel: rendered from `policy` with fy-dnsfwd-allow, or `file` as it is.
  int dns_allow(const std::string& policy, const std::string& file);
  // dns_allow, then again at each change of the file's content (looked at
  // every `every`), until SIGINT or SIGTERM (0) or the VM is found not running
  // at a change (1). A refused list is said and the watch goes on: the guest
  // keeps the list it had. Only that file is watched, not what it names.
  int dns_allow_watch(const std::string& policy, const std::string& file,
                      std::chrono::milliseconds every);

  Backend& backend() { return *b_; }

 private:
  bool cli_ok();
  bool poll_ready(int tries, std::chrono::milliseconds every, Probe* last);
  bool check_guest();
  // Writes the pinned ssh config; false (having said why) on a changed key.
  bool pin_host_key(int tries, std::string* config, std::string* alias, SshConfig* target);

  Settings s_;
  std::unique_ptr<Backend> b_;
  Say say_;
  std::vector<std::unique_ptr<ReadinessCheck>> checks_;
};

}  // namespace fy::machine
