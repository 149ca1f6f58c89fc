// Shared between the BPF program (novsock.bpf.c) and its loader (fy_novsock.cc).
#pragma once

// The uid ranges whose processes may not create AF_VSOCK sockets: slots of
// the array map fy_novsock_uids, each [lo, hi] inclusive, a slot with lo > hi
// empty: room for a user, the 64 ranges core/subid.h lets it have, and spares.
#define FY_NOVSOCK_SLOTS 72

struct fy_uid_range {
  unsigned int lo;
  unsigned int hi;
};
