// The value of the socket-owner map (fy_sock_owner), shared by the BPF program
// that writes it (sock_owner.bpf.c, compiled for BPF) and the forwarder that
// reads it (attrib.cc). One definition, so the two cannot drift apart: the
// map's value size is checked by the kernel against the BTF of this struct, and
// the C++ side asserts the same size and layout below.
#ifndef FY_FORWARDER_BPF_SOCK_OWNER_H
#define FY_FORWARDER_BPF_SOCK_OWNER_H

#include <linux/types.h>

struct fy_owner {
  __u64 cgroup_id;  // bpf_get_current_cgroup_id() of the connecting thread
  __u32 tgid;       // its thread group (the process id)
  __u32 uid;        // its real uid
  __u64 when_ns;    // bpf_ktime_get_ns() at connect(2)
};

#ifdef __cplusplus
static_assert(sizeof(struct fy_owner) == 24, "fy_owner is the BPF map's value: 24 bytes");
static_assert(__builtin_offsetof(struct fy_owner, cgroup_id) == 0 &&
                  __builtin_offsetof(struct fy_owner, tgid) == 8 &&
                  __builtin_offsetof(struct fy_owner, uid) == 12 &&
                  __builtin_offsetof(struct fy_owner, when_ns) == 16,
              "fy_owner's layout is the BPF program's");
#endif

#endif  // FY_FORWARDER_BPF_SOCK_OWNER_H
