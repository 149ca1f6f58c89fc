// fy-forwarder's socket-owner recorder (forwarder/attrib.h).
//
// Attached as cgroup/connect4 and cgroup/connect6 at the cgroup2 root, it runs
// in the context of every connect(2) on the machine and records
//   socket cookie -> the connecting thread group, its uid and its cgroup id
// in an LRU map the forwarder reads when the VM listener accepts. It never
// changes the connect: it always returns 1 (allow). The forwarder owns the
// attachment through BPF links, so the program goes when the forwarder does.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "sock_owner.h"

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 65536);
  __type(key, __u64);
  __type(value, struct fy_owner);
} fy_sock_owner SEC(".maps");

static __always_inline int record(struct bpf_sock_addr* ctx) {
  __u64 cookie = bpf_get_socket_cookie(ctx);
  struct fy_owner o = {};
  o.cgroup_id = bpf_get_current_cgroup_id();
  o.tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
  o.uid = (__u32)bpf_get_current_uid_gid();
  o.when_ns = bpf_ktime_get_ns();
  bpf_map_update_elem(&fy_sock_owner, &cookie, &o, BPF_ANY);
  return 1;
}

SEC("cgroup/connect4")
int fy_connect4(struct bpf_sock_addr* ctx) { return record(ctx); }

SEC("cgroup/connect6")
int fy_connect6(struct bpf_sock_addr* ctx) { return record(ctx); }

char LICENSE[] SEC("license") = "GPL";
