// fy-novsock's program (docs/fy-wall.md, "vsock"): a BPF-LSM hook on
// socket_create that refuses AF_VSOCK to the walled principals.
//
// netfilter never sees AF_VSOCK and cgroup/sock_create runs for inet sockets
// only, so the family is closed where every socket is made: the LSM hook runs
// in the context of each socket(2) and socketpair(2) on the machine, before
// the family's module is looked up. It refuses (-EPERM) when the family is
// AF_VSOCK, the socket is a user's (not the kernel's own), and the calling
// task's uid (as the initial user namespace sees it: a rootless container's
// processes are their subuids) lies in one of the ranges of fy_novsock_uids.
// Everything else, root and Lima's guest agent included, is allowed. Each
// refusal is counted in fy_novsock_denied.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "novsock.h"

#define FY_AF_VSOCK 40
#define FY_EPERM 1

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, FY_NOVSOCK_SLOTS);
  __type(key, __u32);
  __type(value, struct fy_uid_range);
} fy_novsock_uids SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} fy_novsock_denied SEC(".maps");

SEC("lsm/socket_create")
int BPF_PROG(fy_novsock, int family, int type, int protocol, int kern, int ret) {
  if (ret != 0) return ret;  // an earlier program refused already
  if (family != FY_AF_VSOCK || kern) return 0;
  __u32 uid = (__u32)bpf_get_current_uid_gid();
  for (__u32 i = 0; i < FY_NOVSOCK_SLOTS; i++) {
    __u32 k = i;
    struct fy_uid_range* r = bpf_map_lookup_elem(&fy_novsock_uids, &k);
    if (!r) break;
    if (r->lo <= uid && uid <= r->hi) {
      __u32 z = 0;
      __u64* n = bpf_map_lookup_elem(&fy_novsock_denied, &z);
      if (n) __sync_fetch_and_add(n, 1);
      return -FY_EPERM;
    }
  }
  return 0;
}

char LICENSE[] SEC("license") = "GPL";
