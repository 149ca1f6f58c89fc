// Shared between the BPF program (novsock.bpf.c) and its loader (fy_novsock.cc).
#pragma once

// The uid ranges whose processes may not create AF_VSOCK sockets: slots of
// the array map fy_novsock_uids, each [lo, hi] inclusive, a slot with lo > hi
// empty. Sixteen are enough for a user, its subuid ranges and spares.
#define FY_NOVSOCK_SLOTS 16

struct fy_uid_range {
  unsigned int lo;
  unsigned int hi;
};
