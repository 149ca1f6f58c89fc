// libnftables.h defines _GNU_SOURCE itself; g++ already has.
#undef _GNU_SOURCE
#include <nftables/libnftables.h>

#include "core/nft.h"

#include <linux/netlink.h>
#include <sched.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "core/fd.h"

namespace fy::nft {
namespace {

std::string trim_trailing(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

struct CtxFree {
  void operator()(nft_ctx* c) const noexcept { nft_ctx_free(c); }
};

// Gives the calling thread a private copy of the descriptor table with
// everything from 3 up closed in it (the guard, core/nft.h).
Result<void> private_descriptor_table() {
  if (unshare(CLONE_FILES) != 0)
    return make_error(Errc::io,
                      "cannot give libnftables a descriptor table of its own "
                      "(unshare(CLONE_FILES): {}) — nothing was changed; try again",
                      std::strerror(errno));
  if (close_range(3, ~0U, 0) != 0)
    for (int fd = 3; fd < FD_SETSIZE; ++fd) ::close(fd);
  return {};
}

// The probe (core/nft.h), then the context, on the calling thread.
Result<std::unique_ptr<nft_ctx, CtxFree>> make_ctx() {
  {
    Fd probe(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER));
    if (!probe)
      return make_error(Errc::io,
                        "cannot open a netfilter netlink socket ({}) — is nf_tables in this "
                        "kernel, and has the process descriptors to spare?",
                        std::strerror(errno));
  }
  std::unique_ptr<nft_ctx, CtxFree> ctx(nft_ctx_new(NFT_CTX_DEFAULT));
  if (!ctx)
    return make_error(Errc::io,
                      "libnftables could not open a netlink socket — is the nf_tables module "
                      "available in this kernel?");
  if (nft_ctx_buffer_output(ctx.get()) != 0 || nft_ctx_buffer_error(ctx.get()) != 0)
    return make_error(Errc::internal, "libnftables could not buffer its output");
  return ctx;
}

}  // namespace

// The context's thread and what it is handed: one job at a time, run under
// mu_ while its caller waits for job_ to clear.
struct Ctx::Worker {
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool stop_ = false;
  std::unique_ptr<nft_ctx, CtxFree> ctx_;  // made, used and freed on thread_ only
  std::thread thread_;

  ~Worker() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void serve() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || job_ != nullptr; });
      if (job_ != nullptr) {
        (*job_)();
        job_ = nullptr;
        cv_.notify_all();
      } else {
        break;
      }
    }
    ctx_.reset();  // its socket is in this thread's table: close it here
  }

  void call(const std::function<void()>& fn) {
    std::unique_lock lk(mu_);
    job_ = &fn;
    cv_.notify_all();
    cv_.wait(lk, [&] { return job_ == nullptr; });
  }
};

Ctx::Ctx(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}
Ctx::Ctx(Ctx&&) noexcept = default;
Ctx& Ctx::operator=(Ctx&&) noexcept = default;
Ctx::~Ctx() = default;

Result<Ctx> Ctx::open() {
  auto w = std::make_unique<Worker>();
  Worker* raw = w.get();
  Result<void> opened = make_error(Errc::internal, "libnftables' thread did not start");
  bool ready = false;
  // Made here, so it is in this thread's network namespace (core/nft.h).
  try {
    raw->thread_ = std::thread([raw, &opened, &ready] {
      Result<void> r = private_descriptor_table();
      if (r) {
        auto ctx = make_ctx();
        if (ctx)
          raw->ctx_ = std::move(*ctx);
        else
          r = std::move(ctx).take_error();
      }
      bool good = r.ok();
      {
        std::lock_guard lk(raw->mu_);
        opened = std::move(r);
        ready = true;
      }
      raw->cv_.notify_all();
      if (good) raw->serve();
    });
  } catch (const std::system_error& e) {
    return make_error(Errc::io, "cannot start libnftables' thread ({}) — the process is at its "
                      "thread limit; nothing was changed, try again", e.what());
  }
  {
    std::unique_lock lk(raw->mu_);
    raw->cv_.wait(lk, [&] { return ready; });
  }
  if (!opened) return std::move(opened).take_error();  // ~Worker joins the thread
  return Ctx(std::move(w));
}

Reply Ctx::run(const std::string& text, bool dry_run, bool stateless) {
  Reply r;
  const std::function<void()> job = [&] {
    nft_ctx* c = worker_->ctx_.get();
    nft_ctx_set_dry_run(c, dry_run);
    nft_ctx_output_set_flags(c, stateless ? NFT_CTX_OUTPUT_STATELESS : 0);
    int rc = nft_run_cmd_from_buffer(c, text.c_str());
    nft_ctx_set_dry_run(c, false);
    r.ok = rc == 0;
    r.out = nft_ctx_get_output_buffer(c);  // also drains it for the next command
    r.err = trim_trailing(nft_ctx_get_error_buffer(c));
  };
  worker_->call(job);
  return r;
}

bool not_permitted(std::string_view err) {
  return err.find("Operation not permitted") != std::string_view::npos;
}

std::string condense(std::string_view err) {
  std::vector<std::string> out;
  while (!err.empty()) {
    size_t nl = err.find('\n');
    std::string_view line = err.substr(0, nl);
    err.remove_prefix(nl == std::string_view::npos ? err.size() : nl + 1);
    size_t at = line.find("Error: ");
    if (at == std::string_view::npos) continue;
    std::string what(line.substr(at + 7));
    bool seen = false;
    for (const auto& o : out) seen = seen || o == what;
    if (!seen) out.push_back(std::move(what));
  }
  std::string s;
  for (const auto& o : out) s += (s.empty() ? "" : "; ") + o;
  return s;
}

}  // namespace fy::nft
