// fy-forwarder: the daemon. The main loop runs the control plane and worker 0
// of the data path; workers 1..n-1 run threads of their own
// (forwarder/worker.h). On the main loop:
//
//   - the VM listener (forwarder's own namespace) and the bridge listener,
//     which follows the rootless namespace: inotify on the path's directory,
//     POLLPRI on /proc/self/mountinfo (a mount of a namespace file raises no
//     inotify event), and a poll timer as the fallback. A new namespace gets a
//     new listener first; the old one is closed only after, so the old
//     namespace (and its inode) stays alive until the new one is served;
//   - the control socket: the liveness probe ("status") and the OCI hook's
//     question ("ready"), one line each way (docs/fy-forwarder.md);
//   - signals: SIGTERM/SIGINT stop, SIGHUP re-reads the key;
//   - sd_notify READY/WATCHDOG when run by systemd with Type=notify.
#pragma once

#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "core/netns_path.h"
#include "core/result.h"
#include "forwarder/attrib.h"
#include "forwarder/config.h"
#include "forwarder/dirwatch.h"
#include "forwarder/engine.h"
#include "forwarder/listener.h"
#include "forwarder/relay.h"
#include "forwarder/stamper.h"
#include "forwarder/worker.h"

namespace fy::fwd {

class Forwarder {
 public:
  explicit Forwarder(Config cfg);
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  // Sets everything up on `loop`. An error is fatal: the forwarder must not
  // run half-configured.
  Result<void> start(uv_loop_t* loop);
  // Stops listening, resets live connections, closes every handle.
  void stop();
  bool stopping() const { return stopping_; }

  // The liveness probe's answer: "ok ..." when serving, "fail <why>" when not.
  std::string status_line();
  // The hook's answer after a fresh look at the namespace path:
  // "ready <ino> path=<path>", "absent path=<path> <why>" (no namespace there:
  // nothing to wait for, unless the hook itself sees one at <path>) or
  // "waiting <why>".
  std::string ready_line();
  // The hook's "start <id> <pid>": records the container's addresses
  // (forwarder/starts.h). `uid`: the peer's, -1 when unknown; only root and
  // the walled uids may record.
  std::string start_line(const std::string& cmd, int64_t uid);

 private:
  struct ControlClient;
  void rescan_bridge(const char* why);
  bool bridge_current(NsId* at_path, std::string* why);
  // The path to open for the bridge namespace now ([bridge] netns located
  // through mount_ns_pid_file and a final '*', or netns_pid_file's
  // /proc/<pid>/ns/net); not_found with why when there is none yet.
  Result<std::string> bridge_path() const;
  void start_watches();
  void start_event_watches();
  void on_event(const char* why);
  void watch_dir();
  Result<void> start_control();
  void on_signal(int sig);
  void notify(const std::string& msg);
  void check_previous_instance();
  static unsigned default_workers();
  void stop_workers();
  std::string stats_json() const;  // the control socket's "stats"
  std::vector<Worker*> worker_ptrs() const;
  // A counter summed over the workers.
  uint64_t total(Count Counters::*field) const;

  Config cfg_;
  uv_loop_t* loop_ = nullptr;
  Stamper stamper_;
  Starts starts_;
  std::unique_ptr<Attributor> attributor_;
  Shared shared_;
  RelayContext base_;  // what every worker's context starts from
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Listener> vm_;
  std::unique_ptr<Listener> bridge_;
  std::string bridge_error_;
  LocateNotice bridge_unlocated_;  // "matches several", said once (rescan_bridge)
  // A namespace has been found at the bridge path since the start (even if
  // not served): until then the status says bridge=absent:never-found.
  bool bridge_seen_ = false;
  NsId redirect_failed_;  // the namespace where installing the redirect last failed
  uint64_t redirect_failed_ms_ = 0;
  uint64_t bridge_switches_ = 0;
  uint64_t last_warn_ms_ = 0;

  // The inotify watch on the bridge path's directory: made in
  // start_event_watches, re-armed by the poll timer, the only owner and
  // closer of its handle (forwarder/dirwatch.h).
  std::unique_ptr<DirWatch> dir_watch_;
  uv_poll_t mount_watch_{};
  bool mount_watching_ = false;
  int mountinfo_fd_ = -1;
  uv_timer_t poll_timer_{};
  uv_timer_t burst_timer_{};
  uint64_t burst_until_ms_ = 0;
  uv_timer_t watchdog_{};
  // Every kBeatMs with more than one worker: beats posted to workers 1..n-1;
  // one whose loop has not run one for kStallMs fails the status line and
  // withholds the watchdog ping.
  static constexpr uint64_t kBeatMs = 1000;
  static constexpr uint64_t kStallMs = 5000;
  uv_timer_t beat_timer_{};
  std::string stalled_workers() const;  // "" when every loop turns
  void on_watchdog();
  uv_signal_t sig_term_{}, sig_int_{}, sig_hup_{};
  uv_pipe_t control_{};
  bool control_open_ = false;
  bool started_ = false;
  bool stopping_ = false;
  bool unclean_restart_ = false;
  int lock_fd_ = -1;  // <state_dir>/lock, flock'ed while this forwarder lives
  std::string attribution_note_;
};

}  // namespace fy::fwd
