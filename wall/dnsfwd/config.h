// fy-dnsfwd's configuration (docs/fy-dnsfwd.md), read whole and checked with
// file:line errors, every problem reported at once; unknown keys refused.
//
//   upstream = ["192.168.5.3"]          # the VM's resolver(s): "ip" or "ip:port"
//   allow = ["github.com", "pypi.org"]  # the names the proxy's policy could allow
//   allow_file = "/etc/fy/dnsfwd-allow.txt"  # more of them, one a line, as
//                                       # fy-dnsfwd-allow renders from the policy
//   log = "/var/log/foldyard/dnsfwd.jsonl"   # one JSON line a query; "-" = stdout
//   rate = 20                           # queries a second per source address
//   burst = 40
//   max_query = 512                     # bytes
//   timeout_ms = 2000                   # the upstream's answer
//   max_pending = 1024                  # queries upstream at once
//   max_tcp_clients = 64
//   tcp_idle_ms = 10000
//   log_uid = true                      # the asking socket's uid in the log
//
//   [[listen]]                          # one or more
//   address = "127.42.0.53"             # "ip" (port 53) or "ip:port"
//   netns = "/run/netns/bridge"         # optional: the namespace to listen in
//   name = "vm"                         # logged as "ns"; default "vm" or the netns path
//   redirect = true                     # with netns: send that namespace's :53 here
//                                       # (wall/dnsfwd/redirect.h); default true there
//   follow = true                       # with netns: it may not exist yet and may be
//                                       # re-created (podman's rootless namespace):
//                                       # opened when it appears, moved to each new one
//   mount_ns_pid_file = "/run/user/1000/libpod/tmp/pause.pid"
//                                       # with follow: netns is bound in that process's
//                                       # mount namespace (rootless podman's pause
//                                       # process), not this one; a final '*' in netns
//                                       # matches the one entry so named (podman 4's
//                                       # rootless-netns-<hash>): core/netns_path.h
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/net.h"
#include "core/result.h"
#include "wall/dnsfwd/judge.h"

namespace fy::dnsfwd {

struct Listen {
  HostPort address;
  std::string netns;  // "" = the daemon's own namespace
  std::string name;
  // Install the bridge namespace's :53 redirect (wall/dnsfwd/redirect.h)
  // there. Default: true when `netns` is set; refused without one (the VM's
  // namespace has the wall's dns_redirect).
  bool redirect = false;
  // The namespace at `netns` may be missing at start and may be torn down and
  // made again (rootless podman's, with the VM user's containers): the
  // listener (and its redirect) is opened in each namespace found there and
  // closed when it goes, instead of a missing one failing the start.
  bool follow = false;
  // With follow: `netns` is read in the mount namespace of the process this
  // file names (core/netns_path.h); "" = the daemon's own.
  std::string mount_ns_pid_file;
};

struct Config {
  std::string path;
  std::vector<HostPort> upstream;
  std::vector<Listen> listen;
  Policy policy;  // policy.allow: `allow`, then allow_file's lines
  std::string allow_file;  // "" = none
  std::string log = "-";
  uint32_t timeout_ms = 2000;
  uint32_t max_pending = 1024;
  uint32_t max_tcp_clients = 64;
  uint32_t tcp_idle_ms = 10000;
  // Look the asking socket's uid up (sock_diag) for the log; costs one
  // netlink round trip a query, overlapped with the upstream's.
  bool log_uid = true;
};

// Pure: `allow_file` is named, not read (read_config_file reads it).
Result<Config> parse_config(std::string_view text, const std::string& path);
// The config and its allow_file, if any; every problem of either at once.
Result<Config> read_config_file(const std::string& path);

// An allow file's text: one host name suffix a line; blank lines and lines
// starting with '#' ignored. Errors name `path:line` and what to do.
Result<std::vector<std::string>> parse_allow_file(std::string_view text, const std::string& path);
// The allow file at `path`, read (up to 1 MiB, as read_config_file reads it)
// and parsed: what `fy-dnsfwd --check-allow FILE` checks before the guest's
// install (fy-machine dns-allow) moves a new list in.
Result<std::vector<std::string>> read_allow_file(const std::string& path);

// What a reload cannot change in a running daemon (listeners, upstreams,
// the query log): one phrase each, "" when `next` changes none of them.
std::string needs_restart(const Config& running, const Config& next);

}  // namespace fy::dnsfwd
