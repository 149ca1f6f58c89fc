// The credential store: one cached token per injection rule, minted off the
// request path and shared by every request that needs it.
//
// Contract:
//  - lookup() never blocks and never calls back: a fresh token (cached until
//    ttl - 30 s), a remembered failure (15 s, even across forced re-mints),
//    or "pending";
//  - wait() starts one mint per rule however many requests wait (single
//    flight) and calls each waiter back from a libuv callback, never from
//    inside wait(); a waiter that goes away first calls cancel();
//  - minting never blocks the loop: static secrets come from the host env
//    file (re-read on change), command minters run as child processes
//    (uv_spawn, 30 s), the github-app minter signs its JWT on the thread
//    pool and asks GitHub over the proxy's own TLS client;
//  - update() keeps the token of every rule whose spec and secrets are
//    unchanged (a rotated secret drops only that rule's token) and mints
//    ahead for rules that appeared;
//  - no value is ever logged: messages name the switch and the reason only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "proxy/inject/https_client.h"
#include "proxy/inject/rules.h"

namespace fy::inject {

// The host env file: KEY=VALUE lines ('#' comments, optional quotes).
class HostEnv {
 public:
  explicit HostEnv(std::string path) : path_(std::move(path)) {}
  // Re-reads the file; true when what it says changed. A missing file means
  // no secrets (and is not an error unless a rule needs one).
  bool reload();
  std::optional<std::string> get(std::string_view name) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, std::string, std::less<>> vars_;
};

struct MintOutcome {
  bool ok = false;
  std::string value;    // the token (ok)
  int64_t ttl_s = 0;
  std::string reason;   // redacted, for the box (not ok)
};

class MintJob;

struct StoreOptions {
  uv_loop_t* loop = nullptr;
  SSL_CTX* client_ctx = nullptr;
  Resolver resolve;
  HostEnv* host_env = nullptr;
  HostPort github_api{"api.github.com", 443};
  uint64_t minter_timeout_ms = 30'000;
  uint64_t failure_memory_ms = 15'000;
};

struct StoreStats {
  uint64_t mints = 0;
  uint64_t mint_failures = 0;
  uint64_t cache_hits = 0;
};

class CredentialStore {
 public:
  explicit CredentialStore(StoreOptions opts);
  ~CredentialStore();
  CredentialStore(const CredentialStore&) = delete;
  CredentialStore& operator=(const CredentialStore&) = delete;

  void update(const Rules& rules, const std::vector<std::pair<std::string, std::string>>& defaults);

  enum class State { ready, failed, pending };
  struct Lookup {
    State state = State::pending;
    std::string value;    // ready
    std::string failure;  // failed
  };
  Lookup lookup(const Rule& rule);

  using Done = std::function<void(const MintOutcome&)>;
  // Waits for the rule's token; `force` drops a cached token first (after a
  // 401). Returns a ticket for cancel().
  uint64_t wait(const Rule& rule, Done done, bool force = false);
  void cancel(uint64_t ticket);
  // The origin refused the token: drop it (a remembered failure stays).
  void invalidate(const Rule& rule);
  // Stops every mint (child processes are killed); for shutdown.
  void shutdown();

  const StoreStats& stats() const { return stats_; }
  // For tests and metrics: whether the rule has a usable cached token.
  bool has_token(const std::string& id) const;

 private:
  friend class MintJob;
  struct Entry {
    std::string key;
    Rule rule;
    std::string value;
    uint64_t fresh_until_ms = 0;
    uint64_t failed_until_ms = 0;
    std::string failure;
    MintJob* job = nullptr;
    std::vector<std::pair<uint64_t, Done>> waiters;
  };
  std::string key_for(const Rule& rule) const;
  Entry& entry_for(const Rule& rule);
  void start_mint(Entry& e);
  void mint_done(MintJob* job, const MintOutcome& out);
  std::vector<std::string> minter_env(const Rule& rule) const;

  StoreOptions opts_;
  std::unordered_map<std::string, Entry> entries_;  // by rule id
  std::vector<std::pair<std::string, std::string>> defaults_;
  uint64_t next_ticket_ = 1;
  StoreStats stats_;
  bool shut_down_ = false;
};

// Signs a GitHub App JWT (RS256) with the PEM private key; for tests too.
Result<std::string> github_app_jwt(const std::string& pem, int64_t app_id, int64_t now_s);

// Parses a minter's stdout: {"value": "...", "ttl": N}.
Result<std::pair<std::string, int64_t>> parse_minter_output(std::string_view out);

}  // namespace fy::inject
