// Attribution for the VM listener: which principal in the VM's own namespace
// owns the client end of a connection (ADR-0034, "a second listener").
//
//   1. sock_diag (libnl idiag): an exact lookup of the client's socket by its
//      4-tuple (the client's address and port, and the destination it dialled
//      before the redirect) gives its inode, its uid and its cookie.
//   2. The owner process:
//        bpf   a cgroup/connect4+6 program records, at connect(2) time, the
//              socket cookie -> the tgid that connected (forwarder/bpf/);
//              a hit costs one map lookup;
//        proc  the fallback, and the whole path in "proc" mode: walk
//              /proc/<pid>/fd of the walled uids' processes for socket:[inode].
//   3. /proc/<pid>/cgroup's unified path: the outermost libpod-<64 hex>.scope
//      is that container, a crun-buildah-*.scope is a build step, anything
//      else is the VM user. A pasta helper (comm pasta/passt) is refused.
//
// The numbers behind the bpf default are in docs/fy-forwarder.md
// ("Attribution cost").
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"
#include "forwarder/config.h"

namespace fy::fwd {

class BpfRecorder;

struct AttribQuery {
  sockaddr_storage client{};  // the client socket's own address and port
  sockaddr_storage dst{};     // where the client connected (before any redirect)
};

struct SockInfo {
  uint32_t inode = 0;
  uint32_t uid = 0;
  uint64_t cookie = 0;
};

struct Attribution {
  enum class Verdict : uint8_t { ok, refused_pasta, failed };
  Verdict verdict = Verdict::failed;
  std::string who;  // the stamp's who field when ok
  std::string why;  // for refusals and failures: what happened
  // How the owner was found: the BPF record, the /proc walk, or not at all
  // because the socket's uid is not walled (who = "uid:<n>").
  enum class Via : uint8_t { none, bpf, proc, uid };
  Via via = Via::none;
  pid_t pid = 0;
  uint64_t cost_us = 0;
};

class Attributor {
 public:
  explicit Attributor(const VmConfig& cfg);
  ~Attributor();
  Attributor(const Attributor&) = delete;
  Attributor& operator=(const Attributor&) = delete;

  // In bpf mode loads and attaches the recorder; when that fails the error is
  // returned and proc mode stays in effect (the caller logs it loudly).
  Result<void> start();
  bool bpf_active() const;

  // Thread-safe; runs on the thread pool.
  Attribution lookup(const AttribQuery& q) const;

  // The pieces, public for the tests and the cost benchmark.
  static Result<SockInfo> find_socket(const AttribQuery& q);
  // The first process of a walled uid holding socket:[inode]; 0 when none.
  pid_t find_owner_proc(uint32_t inode) const;
  // The owner recorded at connect time, or 0.
  pid_t find_owner_bpf(uint64_t cookie) const;
  // "container:<64 hex>", "build:<scope>" or "user" for a unified cgroup path.
  static std::string classify_cgroup(std::string_view path);
  // The unified ("0::") cgroup path of a process; "" when unreadable.
  static std::string cgroup_of(pid_t pid);
  static bool is_pasta(pid_t pid);

 private:
  VmConfig cfg_;
  std::unique_ptr<BpfRecorder> bpf_;
};

// Finds the cgroup2 mount point in /proc/self/mountinfo ("" when none).
std::string find_cgroup2_root();

}  // namespace fy::fwd
