// libnftables, owned: the one wrapper fy-wall and fy-forwarder share.
//
// It is a library of its own (fycore_nft, core/meson.build), not part of
// core's base, so that only the two binaries that change rulesets link
// libnftables; fy-proxy, fy-netlog and the lifecycle subprojects do not.
//
// The probe: libnftables exit()s the process when nft_ctx_new cannot open its
// netlink socket (EMFILE, ENOMEM, no nfnetlink in the kernel). open() tries
// such a socket first and answers Errc::io when it cannot be had, so a daemon
// that asks for a context leaves one namespace unserved (and retries) instead
// of ending every connection it holds. A socket that opens in the probe and
// fails a moment later in libnftables is a race left open: nothing outside
// libnftables can close it.
//
// The descriptor guard: libnftables waits for the kernel's answers with
// select(), whose fd_set holds descriptors below FD_SETSIZE (1024) only, and
// glibc aborts the whole process ("*** bit out of range 0 - FD_SETSIZE on
// fd_set ***") when the netlink socket libnftables opened is numbered higher.
// fy-forwarder (a listener and a spare per port, worker and namespace, two per
// connection) and fy-dnsfwd (a TCP client each, up to max_tcp_clients) pass
// 1024 easily. So a Ctx does all of its libnftables work, from nft_ctx_new to
// nft_ctx_free, on a thread of its own whose descriptor table is a private
// copy (unshare(CLONE_FILES)) with every descriptor but stdin, stdout and
// stderr closed in it (close_range(3, ~0U), or a loop below FD_SETSIZE where
// the kernel lacks close_range): libnftables' socket is numbered 3 or so and
// lives only in that copy. Closing a descriptor in the copy drops the copy's
// reference alone: the process's table, and every socket, pipe and file in
// it, stay open and untouched (POSIX record locks too: their owner is the
// process's table, not the copy). Every libnftables call in this project goes
// through a Ctx, so every caller has the guard.
//
// The namespace: a new thread shares the network namespace of the thread
// that creates it (CLONE_NEWNET is a per-task property, copied at clone; a
// setns() moves only the thread that calls it), and unshare(CLONE_FILES)
// leaves it alone. Ctx::open() makes the context's thread, so a caller that
// entered a namespace with setns() on its own thread (fy-forwarder's
// run_in_netns, fy-dnsfwd's in_netns) gets a context in that namespace, and
// keeps it for the context's life whichever thread then calls run().
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/result.h"

struct nft_ctx;

namespace fy::nft {

// What one command did: `ok` is libnftables' verdict; `out` what it listed;
// `err` its error buffer with trailing blank lines and spaces trimmed.
struct Reply {
  bool ok = false;
  std::string out;
  std::string err;
};

class Ctx {
 public:
  // A context whose netlink socket talks to the calling thread's network
  // namespace, on a thread of its own with a private descriptor table (see
  // above). Output and errors are buffered, never printed. Errc::io when that
  // thread cannot be had or no netfilter netlink socket can be opened (the
  // probe).
  static Result<Ctx> open();

  Ctx(Ctx&&) noexcept;
  Ctx& operator=(Ctx&&) noexcept;
  // Frees the context on its thread, then joins it.
  ~Ctx();

  // Runs `text` as one batch: the kernel commits all of it or none of it.
  // With dry_run the kernel validates the batch and nothing is committed;
  // stateless omits counter values from listings. Blocks until the
  // context's thread has the answer; one caller at a time.
  Reply run(const std::string& text, bool dry_run = false, bool stateless = false);

 private:
  struct Worker;
  explicit Ctx(std::unique_ptr<Worker> worker);
  std::unique_ptr<Worker> worker_;
};

// True when nft's error text says the kernel refused for want of
// CAP_NET_ADMIN.
bool not_permitted(std::string_view err);

// nft's error buffer, one "file:line:col: Error: what" line per problem, each
// followed by the offending input and a caret line: the distinct "what"s,
// joined with "; " (for a one-line log message).
std::string condense(std::string_view err);

}  // namespace fy::nft
