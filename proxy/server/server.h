// The proxy server: owns the listener, the policy snapshot, the CA and TLS
// contexts, the Network Log writer, the admin endpoint, the reload watcher
// and the list of open connections. Runs on one libuv loop.
#pragma once

#include <openssl/ssl.h>
#include <uv.h>

#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/result.h"
#include "core/stamp.h"
#include "proxy/config.h"
#include "proxy/http/parser.h"
#include "proxy/inject/build_tokens.h"
#include "proxy/inject/store.h"
#include "proxy/io/stream.h"
#include "proxy/netlog/writer.h"
#include "proxy/policy/policy.h"
#include "proxy/server/metrics.h"
#include "proxy/tls/ca.h"
#include "proxy/tls/session_cache.h"

namespace fy::proxy {

class Connection;
class Admin;
class FileWatch;
class Listener;
class OriginPool;

// At most one would_block row per key per 60 s. At most 4096 keys are
// remembered: a key past its interval is forgotten, and when the map is full
// the key reported longest ago makes room, so a flood of new keys never resets
// the limit of the keys seen recently. A new observation window starts over.
// The clock is the caller's (`now_ms`); a clock that steps back lets a key be
// reported again rather than silencing it until the clock catches up.
class WouldBlockLimiter {
 public:
  static constexpr int64_t kIntervalMs = 60'000;
  static constexpr size_t kMaxKeys = 4096;
  bool allow(const std::string& key, int64_t now_ms, int64_t window_id);
  size_t size() const { return last_.size(); }

 private:
  struct Entry {
    std::string key;
    int64_t last_ms;
  };
  void forget_expired(int64_t now_ms);
  // Oldest report first; last_ points into it (list nodes are stable).
  std::list<Entry> order_;
  std::unordered_map<std::string_view, std::list<Entry>::iterator> last_;
  int64_t window_id_ = 0;
};

class Server {
 public:
  Server(uv_loop_t* loop, Config config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Loads the CA, the policy and the key, binds the listeners, prints the
  // ready line. Errors are for start-up and end the process.
  Result<void> start();
  // SIGTERM: stop accepting, let open work finish (bounded), then stop the loop.
  void begin_drain();
  // SIGHUP or a file change: re-read the stamp key and the policy, and
  // re-judge connections. A key that cannot be read keeps the old one.
  void reload(const char* why);

  // For connections.
  uv_loop_t* loop() const { return loop_; }
  const Config& config() const { return config_; }
  const http::Limits& http_limits() const { return http_limits_; }
  const http::Limits& response_limits() const { return response_limits_; }
  const policy::Policy& policy() const { return *policy_; }
  tls::CertAuthority& ca() { return *ca_; }
  SSL_CTX* server_ctx() const { return server_ctx_.get(); }
  SSL_CTX* client_ctx() const { return client_ctx_.get(); }
  tls::SessionCache* origin_sessions() { return &origin_sessions_; }
  OriginPool& origin_pool() { return *origin_pool_; }
  netlog::Writer& netlog() { return *netlog_; }
  Metrics& metrics() { return metrics_; }
  const std::string& stamp_key() const { return stamp_key_; }
  stamp::ReplayGuard& replay_guard() { return replay_; }
  WouldBlockLimiter& would_block() { return would_block_; }
  bool draining() const { return draining_; }
  // Where to connect for `dest`: an IP literal and port from --connect-to,
  // --resolve or the destination itself; ip "" means ask DNS for dest.host.
  std::pair<std::string, uint16_t> resolve_target(const HostPort& dest) const;
  inject::CredentialStore& credentials() { return *credentials_; }
  const inject::BuildTokens& build_tokens() const { return build_tokens_; }
  uint64_t open_connections() const { return open_; }
  uint64_t open_files_limit() const { return nofile_; }
  uint64_t* kept_body_bytes() { return &kept_body_bytes_; }
  // True when the Streams open (one descriptor each) leave no more than the
  // reserve of the open-file limit: an origin dial would run it short.
  bool descriptors_short() const { return Stream::live() + fd_reserve_ >= nofile_; }
  // --max-connections, lowered at start to what the open-file limit holds.
  uint32_t max_connections() const { return max_connections_; }
  // A listener's accept(2) failed (`which`: "proxy" or "admin"): counted and
  // logged (rate-limited); the listener pauses accepting briefly.
  void accept_failed(const char* which, int status);

  // Called by a connection when it starts closing (it leaves the list) and
  // when its memory is gone.
  void unlink(Connection* c);
  void released(Connection* c);

  std::string render_metrics() const;
  std::string health() const;
  // What scoping does with this policy and this proxy's attribution
  // (docs/fy-proxy.md, "Scope"): "off", "on: ...", or that it is on but
  // nothing is attributed (no --stamp-key), so nothing is scoped.
  std::string scope_text() const;

 private:
  void on_connection(uv_stream_t* listener);
  Result<void> fit_connection_limit();
  static void on_signal(uv_signal_t* h, int signum);
  static void on_prepare(uv_prepare_t* h);
  static void on_policy_timer(uv_timer_t* h);
  static void on_drain_timer(uv_timer_t* h);

  Result<void> make_default_dirs();
  Result<void> load_policy_initial();
  // Why `p` cannot be enforced with this proxy's flags ("" when it can):
  // attribution = "require" without --stamp-key.
  std::string attribution_problem(const policy::Policy& p) const;
  void reload_stamp_key(const char* why);
  void install_policy(std::shared_ptr<const policy::Policy> p, bool initial);
  void arm_policy_timer();
  void rejudge_all();
  void refuse_over_limit(uv_stream_t* server);
  void maybe_finish_drain();
  void close_handles();
  void reload_host_env();
  void reload_build_tokens();

  uv_loop_t* loop_;
  Config config_;
  http::Limits http_limits_;
  http::Limits response_limits_;
  std::shared_ptr<const policy::Policy> policy_;
  std::string policy_error_;  // the last load error reported (said once)
  std::unique_ptr<tls::CertAuthority> ca_;
  bssl::UniquePtr<SSL_CTX> server_ctx_;
  bssl::UniquePtr<SSL_CTX> client_ctx_;
  tls::SessionCache origin_sessions_;
  std::unique_ptr<OriginPool> origin_pool_;
  std::unique_ptr<netlog::Writer> netlog_;
  std::unique_ptr<Admin> admin_;
  Metrics metrics_;
  std::string stamp_key_;
  std::string stamp_key_error_;
  std::string scope_said_;       // the scope line last logged (said again when it changes)  // the last key reload error reported (said once)
  stamp::ReplayGuard replay_;
  WouldBlockLimiter would_block_;
  std::unordered_map<std::string, std::string> resolve_;
  std::unordered_map<std::string, std::string> connect_to_;
  std::unique_ptr<inject::HostEnv> host_env_;
  std::unique_ptr<inject::CredentialStore> credentials_;
  inject::BuildTokens build_tokens_;
  std::string build_tokens_error_;
  std::unique_ptr<FileWatch> policy_watch_, host_env_watch_, tokens_watch_;

  std::unique_ptr<Listener> listener_;
  uv_signal_t sighup_, sigterm_, sigint_;
  uv_prepare_t prepare_;
  uv_timer_t policy_timer_;  // fires when a learn window closes or a grant expires
  uv_timer_t drain_timer_;
  uv_timer_t netlog_timer_;  // flushes rows a quiet loop left pending
  uint64_t netlog_flushed_ms_ = 0;
  bool draining_ = false;
  bool stopped_ = false;

  Connection* head_ = nullptr;  // open connections (intrusive list)
  uint64_t open_ = 0;           // allocated connections, closing ones included
  uint64_t kept_body_bytes_ = 0;  // request bodies kept for 401 replays (KeptBody)
  uint32_t max_connections_ = 0;
  uint64_t nofile_ = 0;      // RLIMIT_NOFILE at start
  uint64_t fd_reserve_ = 0;  // descriptors kept back from Streams (connection_budget)
  uint64_t next_id_ = 1;
};

}  // namespace fy::proxy
