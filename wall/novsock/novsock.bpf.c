// fy-novsock's programs (docs/fy-wall.md, "vsock" and "Kernel-sent packets"):
// BPF-LSM hooks that refuse AF_VSOCK (socket_create) and every multicast
// membership change (socket_setsockopt) to the walled principals.
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

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} fy_nomcast_denied SEC(".maps");

// Whether the calling task's uid (as the initial user namespace sees it) is
// in one of the walled ranges.
static __always_inline int walled_uid(void) {
  __u32 uid = (__u32)bpf_get_current_uid_gid();
  for (__u32 i = 0; i < FY_NOVSOCK_SLOTS; i++) {
    __u32 k = i;
    struct fy_uid_range* r = bpf_map_lookup_elem(&fy_novsock_uids, &k);
    if (!r) break;
    if (r->lo <= uid && uid <= r->hi) return 1;
  }
  return 0;
}

static __always_inline void count(void* map) {
  __u32 z = 0;
  __u64* n = bpf_map_lookup_elem(map, &z);
  if (n) __sync_fetch_and_add(n, 1);
}

SEC("lsm/socket_create")
int BPF_PROG(fy_novsock, int family, int type, int protocol, int kern, int ret) {
  if (ret != 0) return ret;  // an earlier program refused already
  if (family != FY_AF_VSOCK || kern) return 0;
  if (!walled_uid()) return 0;
  count(&fy_novsock_denied);
  return -FY_EPERM;
}

// The options that change a socket's multicast memberships or source
// filters. Each makes the kernel send IGMP or MLD reports from a timer, with
// no socket, naming the groups and sources the caller chose (IGMPv3 and MLDv2
// carry source lists): bytes of the caller's choosing on the link, which no
// netfilter rule can attribute. Leaves and blocks are refused too: a state
// change report names the group as a join does.
#define FY_SOL_IP 0
#define FY_SOL_IPV6 41
static __always_inline int membership_option(int level, int optname) {
  if (level == FY_SOL_IP) {
    // IP_ADD_MEMBERSHIP 35 .. IP_MSFILTER 41, MCAST_JOIN_GROUP 42 .. MCAST_MSFILTER 48
    return optname >= 35 && optname <= 48;
  }
  if (level == FY_SOL_IPV6) {
    // IPV6_ADD_MEMBERSHIP 20, IPV6_DROP_MEMBERSHIP 21, IPV6_JOIN_ANYCAST 27,
    // IPV6_LEAVE_ANYCAST 28 (an anycast address joins its solicited-node
    // group), MCAST_JOIN_GROUP 42 .. MCAST_MSFILTER 48
    return optname == 20 || optname == 21 || optname == 27 || optname == 28 ||
           (optname >= 42 && optname <= 48);
  }
  return 0;
}

struct socket;

SEC("lsm/socket_setsockopt")
int BPF_PROG(fy_nomcast, struct socket* sock, int level, int optname, int ret) {
  if (ret != 0) return ret;
  if (!membership_option(level, optname)) return 0;
  if (!walled_uid()) return 0;
  count(&fy_nomcast_denied);
  return -FY_EPERM;
}

char LICENSE[] SEC("license") = "GPL";
