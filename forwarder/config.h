// fy-forwarder's configuration: one TOML file, validated whole at start-up
// (file:line errors, unknown keys refused). The operator's reference for every
// key is docs/fy-forwarder.md; forwarder/exe/forwarder.example.toml is a
// complete example.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/result.h"

namespace fy::fwd {

// A daemon port on the host gateway. A redirected connection keeps its
// destination port, so the listener's local port names the daemon port and the
// upstream connection goes to (upstream.host, port).
struct PortRule {
  uint16_t port = 0;
  bool stamp = true;  // false: a token service, relayed byte for byte, not stamped
};

// The most ports one forwarder serves: each is a listening socket (and a
// spare descriptor) per worker, in the VM namespace and in the bridge
// namespace it follows. A port band is 180.
inline constexpr size_t kMaxPorts = 1024;

struct UidRange {
  uint32_t lo = 0;
  uint32_t hi = 0;  // inclusive
  bool contains(uint32_t uid) const { return uid >= lo && uid <= hi; }
};

enum class AttributionMode { bpf, proc };

struct BridgeConfig {
  bool enabled = false;
  // The rootless bridge namespace to follow: a path that is (or will be) a
  // bind mount of a network namespace, e.g. /run/user/1000/netns/rootless-netns-*
  // (podman 4; a final '*' matches the one entry so named, core/netns_path.h),
  // or /proc/<pid>/root/<path> to reach into another mount namespace.
  std::string netns;
  // With `netns`: a file holding the pid of a process in whose mount namespace
  // `netns` is bound (rootless podman's pause process:
  // /run/user/<uid>/libpod/tmp/pause.pid); "" = the forwarder's own.
  std::string mount_ns_pid_file;
  // Alternative to `netns`: a file holding the pid of a process that lives in
  // the namespace; the namespace followed is /proc/<pid>/ns/net.
  std::string netns_pid_file;
  std::string listen = "0.0.0.0";
  // Stamp `net`: "auto" names the interface the connection arrived on
  // (podman1, ...; forwarder/ingress.h); anything else is written as given.
  std::string net = "auto";
  uint32_t poll_ms = 250;
  // true: inotify on the path's directory and POLLPRI on /proc/self/mountinfo,
  // with the poll as the fallback; false: the poll alone (for filesystems
  // where inotify does not work, and for measuring what the hook buys).
  bool watch_events = true;
  // Install the redirect (forwarder/redirect.h) in every namespace followed,
  // before it counts as served; false when something else installs it.
  bool redirect = true;
};

struct VmConfig {
  bool enabled = false;
  std::string listen = "127.42.0.1";
  std::vector<UidRange> walled_uids;
  AttributionMode attribution = AttributionMode::bpf;
  // A connection not attributed by then gets a 503 (its lookup may still be
  // queued behind others on the thread pool).
  uint32_t attribution_timeout_ms = 5000;
  // The cgroup2 mount the BPF recorder attaches to; "auto" finds it in
  // /proc/self/mountinfo.
  std::string cgroup_root = "auto";
  bool walled(uint32_t uid) const {
    for (const auto& r : walled_uids)
      if (r.contains(uid)) return true;
    return false;
  }
};

struct Config {
  std::string path;  // the file this came from
  std::string key_file;
  std::string state_dir = "/run/fy-forwarder";
  std::string control_socket;  // default: <state_dir>/control.sock
  std::string boot_id_file = "/proc/sys/kernel/random/boot_id";
  log::Level log_level = log::Level::info;

  std::string upstream_host;  // an IP literal: the host gateway, from the VM's namespace
  uint32_t connect_timeout_ms = 2000;
  uint32_t redials = 8;         // re-dials after the first attempt
  uint32_t rst_wait_ms = 5000;  // longest wait for SIOCOUTQ 0 before the RST anyway
  std::vector<PortRule> ports;

  size_t max_head_bytes = 16 * 1024;
  size_t max_headers = 128;
  uint32_t head_timeout_ms = 10000;
  uint32_t half_closed_timeout_ms = 60000;
  uint32_t max_connections = 50000;
  // A bulk relay direction's pipe (relay.h, "Bulk directions"); pipes start at
  // the kernel's 64 KiB. 0 or <= 64 KiB: never grow.
  uint32_t pipe_size = 1024 * 1024;
  // At most this many pipes grown to pipe_size at once, forwarder-wide: what
  // the relay may hold in pipes is bounded by bulk_pipes x pipe_size.
  uint32_t bulk_pipes = 128;
  // Event loops of the data path (forwarder/worker.h); 0: one per two CPUs
  // the process may run on, at least 1, at most 8.
  uint32_t workers = 0;
  // Bytes one wake-up reads from each side of a connection before it yields
  // to the loop's other work (and resumes on the next turn). 0: no bound.
  size_t pump_budget = 4 << 20;

  BridgeConfig bridge;
  VmConfig vm;

  const PortRule* port_rule(uint16_t port) const {
    for (const auto& p : ports)
      if (p.port == port) return &p;
    return nullptr;
  }
};

// Loads and validates `path`; every problem in the file, one per line.
Result<Config> load_config(const std::string& path);
// The same from text (tests).
Result<Config> parse_config(std::string_view text, const std::string& path);

// "1000" or "100000-165535".
Result<UidRange> parse_uid_range(std::string_view s);

// "41000" or "41000-41089" (inclusive, 1-65535, low end first).
Result<std::pair<uint16_t, uint16_t>> parse_port_range(std::string_view s);

// The ports, sorted, runs of consecutive ports written as ranges, joined by
// `sep`: "41000-41089, 41100-41189" (for the redirect's set, and the logs).
std::string format_ports(const std::vector<PortRule>& rules, std::string_view sep);

}  // namespace fy::fwd
