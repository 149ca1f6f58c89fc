#include "proxy/server/server.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/buffer.h"
#include "core/clock.h"
#include "core/crypto.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/loop.h"
#include "proxy/http/answers.h"
#include "proxy/http/rewrite.h"
#include "proxy/server/admin.h"
#include "proxy/server/connection.h"
#include "proxy/server/origin_pool.h"
#include "proxy/server/watch.h"
#include "proxy/tls/context.h"

namespace fy::proxy {

void WouldBlockLimiter::forget_expired(int64_t now_ms) {
  while (!order_.empty() && now_ms - order_.front().last_ms >= kIntervalMs) {
    last_.erase(order_.front().key);
    order_.pop_front();
  }
}

bool WouldBlockLimiter::allow(const std::string& key, int64_t now_ms, int64_t window_id) {
  if (window_id != window_id_) {
    // A new observation window: every key may be reported again.
    last_.clear();
    order_.clear();
    window_id_ = window_id;
  }
  forget_expired(now_ms);
  auto it = last_.find(key);
  if (it != last_.end()) {
    int64_t since = now_ms - it->second->last_ms;
    if (since >= 0 && since < kIntervalMs) return false;
    // Reported again (the clock stepped back): it is now the newest.
    it->second->last_ms = now_ms;
    order_.splice(order_.end(), order_, it->second);
    return true;
  }
  if (last_.size() >= kMaxKeys) {
    // Full of keys still within their interval: the oldest report makes room.
    last_.erase(order_.front().key);
    order_.pop_front();
  }
  order_.push_back(Entry{key, now_ms});
  last_.emplace(order_.back().key, std::prev(order_.end()));
  return true;
}

Server::Server(uv_loop_t* loop, Config config) : loop_(loop), config_(std::move(config)) {
  http_limits_.max_head_bytes = config_.limits.max_head_bytes;
  http_limits_.max_headers = config_.limits.max_headers;
  // Responses may carry larger heads (cookies, CSP): the limit is generous.
  response_limits_.max_head_bytes = std::max<size_t>(config_.limits.max_head_bytes, 256 * 1024);
  response_limits_.max_headers = std::max<size_t>(config_.limits.max_headers, 500);
  for (auto& [h, ip] : config_.resolve) resolve_[h] = ip;
  for (auto& [from, to] : config_.connect_to) connect_to_[from] = to;
}

Server::~Server() {
  Stream::set_read_coalescing(false);
}

std::pair<std::string, uint16_t> Server::resolve_target(const HostPort& dest) const {
  if (!connect_to_.empty()) {
    auto it = connect_to_.find(dest.authority());
    if (it != connect_to_.end()) {
      auto hp = parse_authority(it->second, 0);
      if (hp) return {hp->host, hp->port};
    }
  }
  if (is_ipv4_literal(dest.host) || is_ipv6_literal(dest.host)) return {dest.host, dest.port};
  auto it = resolve_.find(dest.host);
  if (it != resolve_.end()) return {it->second, dest.port};
  return {"", dest.port};
}

Result<void> Server::start() {
  FY_TRY(make_default_dirs());
  bool created = false;
  auto ca = tls::CertAuthority::load_or_create(config_.state_dir, config_.cert_cache, &created);
  if (!ca) return std::move(ca).take_error();
  ca_ = std::move(*ca);
  if (created) log::info("generated a new CA: {} (the box must trust it)", ca_->cert_path());

  auto sctx = tls::make_server_context();
  if (!sctx) return std::move(sctx).take_error();
  server_ctx_ = std::move(*sctx);
  tls::ClientTrust trust;
  trust.system_roots = config_.system_roots;
  trust.extra_bundle = config_.upstream_ca;
  auto cctx = tls::make_client_context(trust);
  if (!cctx) return std::move(cctx).take_error();
  client_ctx_ = std::move(*cctx);
  origin_sessions_.attach(client_ctx_.get());
  origin_pool_ = std::make_unique<OriginPool>(loop_);

  if (!config_.stamp_key_file.empty()) {
    auto key = read_key_file(config_.stamp_key_file);
    if (!key) return std::move(key).take_error();
    stamp_key_ = std::move(*key);
  }

  netlog::WriterOptions wo;
  wo.path = config_.netlog_file;
  wo.max_bytes = config_.netlog_max_bytes;
  wo.backups = config_.netlog_backups;
  netlog_ = std::make_unique<netlog::Writer>(wo);

  host_env_ = std::make_unique<inject::HostEnv>(config_.host_env_file);
  if (!config_.host_env_file.empty()) host_env_->reload();
  inject::StoreOptions so;
  so.loop = loop_;
  so.client_ctx = client_ctx_.get();
  so.resolve = [this](const HostPort& d) { return resolve_target(d); };
  so.host_env = host_env_.get();
  so.minter_timeout_ms = config_.limits.minter_timeout_ms;
  credentials_ = std::make_unique<inject::CredentialStore>(so);
  if (!config_.build_tokens_file.empty()) reload_build_tokens();

  FY_TRY(load_policy_initial());
  if (std::string why = attribution_problem(*policy_); !why.empty())
    return Error{Errc::invalid_argument, "refusing to start: " + why};
  credentials_->update(policy_->rules(), policy_->rules().defaults);
  FY_TRY(fit_connection_limit());
  // Idle origin connections take at most an eighth of the clients' descriptors.
  origin_pool_->set_max_total(std::clamp<size_t>(max_connections_ / 8, 1, 1024));

  listener_ = std::make_unique<Listener>(
      loop_, 1024, [this](uv_stream_t* l) { on_connection(l); },
      [this](int status) { accept_failed("proxy", status); });
  auto port = listener_->listen(config_.listen);
  if (!port) {
    listener_->close();
    return Error{Errc::refused, port.error().message};
  }
  int admin_port = 0;
  if (config_.admin != "off") {
    admin_ = std::make_unique<Admin>(*this, loop_);
    auto ap = admin_->listen(config_.admin);
    if (!ap) {
      admin_->close();
      return Error{Errc::refused, "admin endpoint: " + ap.error().message};
    }
    admin_port = *ap;
  }

  uv_signal_init(loop_, &sighup_);
  uv_signal_init(loop_, &sigterm_);
  uv_signal_init(loop_, &sigint_);
  sighup_.data = sigterm_.data = sigint_.data = this;
  uv_signal_start(&sighup_, on_signal, SIGHUP);
  uv_signal_start(&sigterm_, on_signal, SIGTERM);
  uv_signal_start(&sigint_, on_signal, SIGINT);
  uv_unref(reinterpret_cast<uv_handle_t*>(&sighup_));

  uv_prepare_init(loop_, &prepare_);
  prepare_.data = this;
  uv_prepare_start(&prepare_, on_prepare);
  uv_unref(reinterpret_cast<uv_handle_t*>(&prepare_));
  Stream::set_read_coalescing(true);  // on_prepare flushes what is held

  uv_timer_init(loop_, &policy_timer_);
  uv_timer_init(loop_, &drain_timer_);
  uv_timer_init(loop_, &netlog_timer_);
  policy_timer_.data = drain_timer_.data = netlog_timer_.data = this;

  // Watch the policy, the host env file and the build tokens: each is
  // rewritten by the supervisor; a change is picked up without a signal.
  policy_watch_ =
      std::make_unique<FileWatch>(loop_, config_.policy_file, [this] { reload("file changed"); });
  policy_watch_->start();
  if (!config_.host_env_file.empty()) {
    host_env_watch_ =
        std::make_unique<FileWatch>(loop_, config_.host_env_file, [this] { reload_host_env(); });
    host_env_watch_->start();
  }
  if (!config_.build_tokens_file.empty()) {
    tokens_watch_ = std::make_unique<FileWatch>(loop_, config_.build_tokens_file,
                                                [this] { reload_build_tokens(); });
    tokens_watch_->start();
  }
  arm_policy_timer();

  if (!config_.port_file.empty()) {
    std::string tmp = config_.port_file + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f || fprintf(f, "%d\n", *port) < 0 || fclose(f) != 0 ||
        rename(tmp.c_str(), config_.port_file.c_str()) != 0)
      return make_error(Errc::io, "cannot write the port file {}: {}", config_.port_file,
                        strerror(errno));
  }
  std::string host = config_.listen.substr(0, config_.listen.rfind(':'));
  std::string admin_host = config_.admin.substr(0, config_.admin.rfind(':'));
  printf("fy-proxy ready: listening on %s:%d · admin %s · CA %s · policy %s · netlog %s\n",
         host.c_str(), *port, admin_ ? fmt::format("{}:{}", admin_host, admin_port).c_str() : "off",
         ca_->cert_path().c_str(), config_.policy_file.c_str(), config_.netlog_file.c_str());
  fflush(stdout);
  log::info("{}", policy_->summary(wall_ms()));
  scope_said_ = scope_text();
  log::info("scope: {}", scope_said_);
  return {};
}

std::string Server::scope_text() const {
  if (!policy_->scoping()) return "off: every principal gets every credential and grant";
  if (config_.stamp_key_file.empty())
    return "on in the policy, but nothing is attributed (no --stamp-key: the podman backend, or "
           "no forwarder), so credentials and grants go to every connection, as with scope off";
  return policy_->scope_summary() + "; unattributed connections get no credential";
}

Result<void> Server::make_default_dirs() {
  // A fresh machine has no ~/.local/state: make the state directory (0700: it
  // holds the CA key) and the Network Log's directory, with their parents.
  // Existing directories are left as they are.
  auto dir_of = [](const std::string& p) {
    size_t slash = p.rfind('/');
    return slash == std::string::npos ? std::string(".") : slash == 0 ? "/" : p.substr(0, slash);
  };
  struct Want {
    std::string dir;
    const char* what;
    const char* flag;
  };
  Want wants[] = {{config_.state_dir, "state directory", "--state-dir DIR"},
                  {dir_of(config_.netlog_file), "Network Log's directory", "--netlog FILE"}};
  for (const Want& w : wants) {
    auto made = make_dirs(w.dir, 0700);
    if (!made)
      return Error{Errc::io, fmt::format("{} (the {}); pick another with {}", made.error().message,
                                         w.what, w.flag)};
    if (!made->empty()) {
      std::string list;
      for (const std::string& d : *made) list += (list.empty() ? "" : ", ") + d;
      log::info("made the {} {} (it did not exist): {}", w.what, w.dir, list);
    }
  }
  return {};
}

Result<void> Server::load_policy_initial() {
  struct stat st;
  if (!config_.policy_explicit && ::stat(config_.policy_file.c_str(), &st) != 0 &&
      errno == ENOENT) {
    // First start with the default policy path: write a learn-mode policy.
    std::string text = policy::Policy::default_text(wall_ms(), config_.learn_window_ms);
    std::string tmp = config_.policy_file + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        ::close(fd) != 0 || ::rename(tmp.c_str(), config_.policy_file.c_str()) != 0)
      return make_error(Errc::io, "cannot write the first-start policy {}: {}", config_.policy_file,
                        strerror(errno));
    log::info("no policy at {}: wrote one in learn mode (observing for {} min, then enforcing)",
              config_.policy_file, config_.learn_window_ms / 60000);
  }
  auto p = policy::Policy::load_file(config_.policy_file, wall_ms());
  if (!p) {
    policy_error_ = p.error().message;
    log::error(
        "policy {} is unusable, so the proxy fails closed (enforcing, nothing granted, "
        "nothing tunnelled) until it is fixed:\n{}",
        config_.policy_file, p.error().message);
    policy_ = policy::Policy::closed(p.error().message);
    ++metrics_.reload_failures;
    return {};
  }
  for (const auto& w : (*p)->warnings()) log::warn("{}", w);
  policy_ = std::move(*p);
  return {};
}

std::string Server::attribution_problem(const policy::Policy& p) const {
  if (!p.require_attribution() || !config_.stamp_key_file.empty()) return {};
  // Without a key no stamp is verified and no connection is marked
  // unattributed: "require" would refuse nothing. Fail closed instead.
  return fmt::format(
      "policy {} sets attribution = \"require\", but fy-proxy was started without "
      "--stamp-key: with no key it verifies no stamp, and \"require\" would refuse nothing. "
      "Start fy-proxy with --stamp-key FILE (the key the forwarder stamps with), or set "
      "attribution = \"record\"",
      config_.policy_file);
}

void Server::reload_stamp_key(const char* why) {
  if (config_.stamp_key_file.empty()) return;
  auto key = read_key_file(config_.stamp_key_file);
  if (!key) {
    ++metrics_.stamp_key_reload_failures;
    if (key.error().message != stamp_key_error_) {
      // Said once per distinct problem, at error level.
      stamp_key_error_ = key.error().message;
      log::error(
          "stamp key not reloaded ({}), the old key stays in use: {}. Stamps made with a new "
          "key are recorded unattributed until the file is fixed; fix it, then send SIGHUP",
          why, key.error().message);
    }
    return;
  }
  if (!stamp_key_error_.empty()) log::info("stamp key {} is usable again", config_.stamp_key_file);
  stamp_key_error_.clear();
  if (*key == stamp_key_) return;
  // Only connections not yet bound verify under the new key: those already
  // bound keep their attribution. The replay guard stays: (boot, seq) is the
  // forwarder's and does not restart with a key.
  stamp_key_ = std::move(*key);
  ++metrics_.stamp_key_reloads;
  log::info(
      "stamp key reloaded from {} ({}): new connections are attributed by stamps under the new "
      "key only; open connections keep their attribution",
      config_.stamp_key_file, why);
}

void Server::reload(const char* why) {
  reload_stamp_key(why);
  auto p = policy::Policy::load_file(config_.policy_file, wall_ms());
  if (p) {
    if (std::string bad = attribution_problem(**p); !bad.empty())
      p = Error{Errc::invalid_argument, std::move(bad)};
  }
  if (!p) {
    ++metrics_.reload_failures;
    if (p.error().message != policy_error_) {
      // Said once per distinct problem, at error level.
      policy_error_ = p.error().message;
      log::error(
          "policy {} is unusable ({}), so the proxy fails closed (enforcing, nothing "
          "granted, nothing tunnelled) until it is fixed:\n{}",
          config_.policy_file, why, p.error().message);
    }
    install_policy(policy::Policy::closed(p.error().message), false);
    return;
  }
  if (!policy_error_.empty()) log::info("policy {} is usable again", config_.policy_file);
  policy_error_.clear();
  for (const auto& w : (*p)->warnings()) log::warn("{}", w);
  ++metrics_.reloads;
  install_policy(std::move(*p), false);
  log::info("policy reloaded ({}): {}", why, policy_->summary(wall_ms()));
  if (std::string sc = scope_text(); sc != scope_said_) {
    scope_said_ = std::move(sc);
    log::info("scope: {}", scope_said_);
  }
}

void Server::install_policy(std::shared_ptr<const policy::Policy> p, bool) {
  policy_ = std::move(p);
  // Idle origin connections are judged afresh by whoever next needs one.
  origin_pool_->clear();
  // Tokens of unchanged rules are kept; new rules are minted ahead.
  credentials_->update(policy_->rules(), policy_->rules().defaults);
  arm_policy_timer();
  rejudge_all();
}

void Server::reload_host_env() {
  if (!host_env_->reload()) return;
  // A rotated secret changes only its own rule's key: only that token drops.
  log::info("host env file {} changed: credentials of changed secrets will be minted again",
            config_.host_env_file);
  credentials_->update(policy_->rules(), policy_->rules().defaults);
}

void Server::reload_build_tokens() {
  auto r = build_tokens_.load(config_.build_tokens_file);
  if (!r) {
    if (r.error().message != build_tokens_error_) {
      build_tokens_error_ = r.error().message;
      log::error("{}", r.error().message);
    }
    return;
  }
  if (!build_tokens_error_.empty())
    log::info("build tokens {} usable again", config_.build_tokens_file);
  build_tokens_error_.clear();
}

void Server::rejudge_all() {
  int64_t now = wall_ms();
  // close() unlinks a connection from the list: take `next` first.
  for (Connection* c = head_; c;) {
    Connection* next = c->next;
    c->rejudge(now);
    c = next;
  }
}

void Server::arm_policy_timer() {
  if (stopped_) return;
  int64_t now = wall_ms();
  int64_t next = policy_->next_change_ms(now);
  uv_timer_stop(&policy_timer_);
  if (next == 0) return;
  uv_timer_start(&policy_timer_, on_policy_timer, static_cast<uint64_t>(next - now) + 5, 0);
  uv_unref(reinterpret_cast<uv_handle_t*>(&policy_timer_));
}

void Server::on_policy_timer(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  log::info("policy: {}", s->policy_->summary(wall_ms()));
  s->rejudge_all();
  s->arm_policy_timer();
}

Result<void> Server::fit_connection_limit() {
  rlimit rl;
  nofile_ = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  ConnectionBudget b = connection_budget(nofile_, config_.limits.max_connections);
  max_connections_ = b.max_connections;
  fd_reserve_ = b.reserve;
  if (max_connections_ == 0)
    return make_error(Errc::invalid_argument,
                      "the open-file limit (RLIMIT_NOFILE) is {}, too low to serve a single "
                      "client: raise it to at least {} (systemd: LimitNOFILE=; a shell: ulimit -n) "
                      "and start again",
                      nofile_, connection_budget(0, 1).nofile_needed);
  if (b.lowered)
    log::warn(
        "connection limit lowered from {} to {}: the open-file limit (RLIMIT_NOFILE) is {}, "
        "and each client needs a descriptor beyond a reserve of {}; past {} clients get "
        "503 (and a request that finds no descriptor left for its origin gets 503 too). To admit "
        "{}, raise the limit to at least {} "
        "(systemd: LimitNOFILE={}; a shell: ulimit -n {}) and restart, or set "
        "--max-connections {} to silence this",
        config_.limits.max_connections, max_connections_, nofile_, b.reserve, max_connections_,
        config_.limits.max_connections, b.nofile_needed, b.nofile_needed, b.nofile_needed,
        max_connections_);
  return {};
}

void Server::on_connection(uv_stream_t* l) {
  if (draining_) return;
  if (open_ >= max_connections_) {
    refuse_over_limit(l);
    return;
  }
  auto* c = new Connection(*this, next_id_++);
  ++open_;
  ++metrics_.connections_accepted;
  c->next = head_;
  if (head_) head_->prev = c;
  head_ = c;
  c->accept(l);
}

void Server::accept_failed(const char* which, int status) {
  ++metrics_.accept_failures;
  static log::RateLimit limit(1, 10'000);
  bool fds = status == UV_EMFILE || status == UV_ENFILE;
  log::limited(
      limit, log::Level::warn,
      "{} listener: accepting a client failed ({}){}; not accepting for {} ms, then retrying",
      which, uv::error_string(status),
      fds ? fmt::format(": out of file descriptors (open-file limit {}, {} clients open); "
                        "raise LimitNOFILE / ulimit -n or lower --max-connections",
                        nofile_, open_)
          : std::string(),
      listener_ ? listener_->pause_ms() : 100);
}

void Server::refuse_over_limit(uv_stream_t* l) {
  // Over the limit: answer 503 and close, without a Connection.
  struct Refused {
    uv_tcp_t tcp;
  };
  auto* r = new Refused;
  uv_tcp_init(loop_, &r->tcp);
  r->tcp.data = r;
  ++metrics_.connections_refused_limit;
  if (uv_accept(l, reinterpret_cast<uv_stream_t*>(&r->tcp)) == 0) {
    answers::Reply reply = answers::connection_limit(
        max_connections_, max_connections_ < config_.limits.max_connections);
    http::Answer a;
    a.status = reply.status;
    a.content_type = reply.content_type;
    a.body = std::move(reply.body);
    // Connection: close before Retry-After, as this answer always read.
    a.headers = {{"Connection", "close"}, {"Retry-After", "1"}};
    std::string msg;
    http::build_answer(msg, a);
    uv_buf_t b = uv_buf_init(msg.data(), static_cast<unsigned>(msg.size()));
    uv_try_write(reinterpret_cast<uv_stream_t*>(&r->tcp), &b, 1);
  }
  static log::RateLimit limit(1, 10'000);
  log::limited(limit, log::Level::warn, "connection limit {} reached: answering 503",
                     max_connections_);
  uv_close(reinterpret_cast<uv_handle_t*>(&r->tcp),
           [](uv_handle_t* h) { delete static_cast<Refused*>(h->data); });
}

void Server::unlink(Connection* c) {
  if (c->prev) c->prev->next = c->next;
  if (c->next) c->next->prev = c->prev;
  if (head_ == c) head_ = c->next;
  c->prev = c->next = nullptr;
}

void Server::released(Connection* c) {
  delete c;
  --open_;
  if (draining_) maybe_finish_drain();
}

void Server::on_signal(uv_signal_t* h, int signum) {
  auto* s = static_cast<Server*>(h->data);
  if (signum == SIGHUP) {
    s->reload("SIGHUP");
  } else {
    s->begin_drain();
  }
}

void Server::on_prepare(uv_prepare_t* h) {
  // Before the loop waits: write the rows when 64 KiB have gathered or the
  // oldest has waited 50 ms (one write per batch, not one per iteration);
  // the netlog timer covers a loop that goes idle with rows pending.
  auto* s = static_cast<Server*>(h->data);
  Stream::flush_held();  // writes held over full reads (stream.cc, "Coalescing")
  if (!s->netlog_->has_pending()) return;
  uint64_t now = uv_now(s->loop_);
  if (s->netlog_->pending_bytes() >= 64 * 1024 || now - s->netlog_flushed_ms_ >= 50) {
    s->netlog_->flush();
    s->netlog_flushed_ms_ = now;
  } else if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&s->netlog_timer_))) {
    uv_timer_start(
        &s->netlog_timer_,
        [](uv_timer_t* t) {
          auto* srv = static_cast<Server*>(t->data);
          srv->netlog_->flush();
          srv->netlog_flushed_ms_ = uv_now(srv->loop_);
        },
        50, 0);
  }
}

void Server::begin_drain() {
  if (draining_) return;
  draining_ = true;
  log::info("draining: {} connections open; exiting when they finish (at most {} s)", open_,
            config_.limits.drain_timeout_ms / 1000);
  if (listener_) listener_->close();
  origin_pool_->close();
  for (Connection* c = head_; c;) {
    Connection* next = c->next;
    c->drain();
    c = next;
  }
  uv_timer_start(&drain_timer_, on_drain_timer, config_.limits.drain_timeout_ms, 0);
  maybe_finish_drain();
}

void Server::on_drain_timer(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  if (s->open_ > 0) log::info("drain timeout: closing {} connections", s->open_);
  for (Connection* c = s->head_; c;) {
    Connection* next = c->next;
    c->close("drain timeout");
    c = next;
  }
  s->maybe_finish_drain();
}

void Server::maybe_finish_drain() {
  if (open_ > 0 || stopped_) return;
  close_handles();
}

void Server::close_handles() {
  stopped_ = true;
  netlog_->flush();
  auto close = [](auto* h) {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(h)))
      uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
  };
  if (listener_) listener_->close();
  if (admin_) admin_->close();
  close(&sighup_);
  close(&sigterm_);
  close(&sigint_);
  Stream::set_read_coalescing(false);  // nothing flushes at prepare any more
  close(&prepare_);
  close(&policy_timer_);
  close(&netlog_timer_);
  origin_pool_->close();
  for (auto* w : {policy_watch_.get(), host_env_watch_.get(), tokens_watch_.get()})
    if (w) w->close();
  credentials_->shutdown();
  close(&drain_timer_);
}

std::string Server::health() const {
  int64_t now = wall_ms();
  return fmt::format(
      "ok\npolicy: {}\n{}scope: {}\nconnections: {} (limit {})\n", policy_->summary(now),
      policy_->failed_closed() ? "policy FAILED CLOSED: " + policy_->failure() + "\n" : "",
      scope_text(), open_, max_connections_);
}

std::string Server::render_metrics() const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help,
                   name, name, v);
  };
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help,
                   name, name, v);
  };
  const Metrics& m = metrics_;
  gauge("fy_connections_open", "Client connections open now.", open_);
  gauge("fy_replay_bodies_kept_bytes",
        "Request body bytes kept for 401 replays now (bounded proxy-wide).", kept_body_bytes_);
  gauge("fy_connections_limit",
        "Clients admitted at once: --max-connections, or less if the open-file limit holds fewer.",
        max_connections_);
  gauge("fy_open_files_limit", "The open-file limit (RLIMIT_NOFILE) at start.", nofile_);
  counter("fy_accept_failures_total", "accept(2) failures (e.g. EMFILE); each pauses accepting.",
          m.accept_failures);
  counter("fy_dials_out_of_files_total",
          "Origin dials that found no file descriptor left (answered 503).", m.dials_out_of_files);
  counter("fy_connections_accepted_total", "Client connections accepted.", m.connections_accepted);
  counter("fy_connections_refused_limit_total", "Connections answered 503 at the limit.",
          m.connections_refused_limit);
  counter("fy_connections_closed_by_policy_total", "Connections closed by a policy change.",
          m.connections_closed_by_policy);
  out += "# HELP fy_requests_total Requests by outcome.\n# TYPE fy_requests_total counter\n";
  fmt::format_to(std::back_inserter(out),
                 "fy_requests_total{{outcome=\"forwarded\"}} {}\n"
                 "fy_requests_total{{outcome=\"refused_allowlist\"}} {}\n"
                 "fy_requests_total{{outcome=\"refused_claim\"}} {}\n"
                 "fy_requests_total{{outcome=\"bad_request\"}} {}\n"
                 "fy_requests_total{{outcome=\"head_timeout\"}} {}\n"
                 "fy_requests_total{{outcome=\"upstream_error\"}} {}\n",
                 m.responses_forwarded, m.refused_allowlist, m.refused_claim, m.bad_requests,
                 m.head_timeouts, m.upstream_errors);
  out += "# HELP fy_timeouts_total Deadlines that ran out, by phase (docs/fy-proxy.md, "
         "Deadlines).\n# TYPE fy_timeouts_total counter\n";
  for (Phase p : {Phase::hello, Phase::handshake, Phase::first_bytes, Phase::head, Phase::idle,
                  Phase::exchange, Phase::connect, Phase::tunnel_idle})
    fmt::format_to(std::back_inserter(out), "fy_timeouts_total{{phase=\"{}\"}} {}\n",
                   phase_name(p), m.timeouts[static_cast<int>(p)]);
  counter("fy_request_heads_total", "Request heads parsed, CONNECT included.", m.requests);
  counter("fy_would_block_total", "Requests the allowlist would refuse (observe/learn).",
          m.would_block);
  counter("fy_tunnels_total", "Passthrough and opaque tunnels opened.", m.tunnels);
  counter("fy_upgrades_total", "101 Switching Protocols relayed.", m.upgrades);
  counter("fy_bytes_up_total", "Bytes from clients (after TLS).", m.bytes_up);
  counter("fy_bytes_down_total", "Bytes from origins (after TLS).", m.bytes_down);
  counter("fy_tls_client_handshakes_total", "TLS handshakes with clients completed.",
          m.tls_client_handshakes);
  counter("fy_tls_client_handshake_failures_total", "TLS handshakes with clients failed.",
          m.tls_client_handshake_failures);
  counter("fy_tls_origin_handshakes_total", "TLS handshakes with origins completed.",
          m.tls_origin_handshakes);
  counter("fy_tls_origin_verify_failures_total", "Origin certificates refused.",
          m.tls_origin_verify_failures);
  counter("fy_cert_cache_hits_total", "Leaf certificates served from the cache.",
          ca_->stats().hits);
  counter("fy_cert_minted_total", "Leaf certificates minted.", ca_->stats().minted);
  gauge("fy_cert_cache_entries", "Leaf certificates cached.", ca_->cached());
  gauge("fy_origin_pool_idle", "Idle cleartext origin connections kept for reuse.",
        origin_pool_->size());
  counter("fy_origin_pool_full_total",
          "Origin connections closed instead of pooled: the pool held its maximum.",
          origin_pool_->full());
  counter("fy_origin_pool_reused_total", "Requests sent on a pooled origin connection.",
          origin_pool_->reused());
  counter("fy_tls_origin_resumptions_offered_total", "Sessions offered to origins for resumption.",
          origin_sessions_.resumptions());
  counter("fy_stamp_key_reloads_total", "Reloads that installed a changed --stamp-key.",
          m.stamp_key_reloads);
  counter("fy_stamp_key_reload_failures_total",
          "Reloads that could not read --stamp-key (the old key stays in use).",
          m.stamp_key_reload_failures);
  counter("fy_policy_reloads_total", "Policy reloads that succeeded.", m.reloads);
  counter("fy_policy_reload_failures_total", "Policy loads that failed (failed closed).",
          m.reload_failures);
  gauge("fy_policy_failed_closed", "1 while the policy is unusable and the proxy fails closed.",
        policy_->failed_closed() ? 1 : 0);
  counter("fy_netlog_rows_total", "Network Log rows written.", netlog_->stats().rows);
  counter("fy_netlog_write_errors_total", "Network Log write errors.",
          netlog_->stats().write_errors);
  counter("fy_netlog_rows_dropped_total", "Network Log rows lost to write errors.",
          netlog_->stats().rows_dropped);
  counter("fy_netlog_rotations_total", "Network Log rotations.", netlog_->stats().rotations);
  counter("fy_injected_total", "Requests a credential was written onto.", m.injected);
  counter("fy_mint_failures_total",
          "Requests answered 502 because a credential could not be minted.", m.mint_failures);
  counter("fy_held_total", "Held dummies answered 401 by the proxy.", m.held);
  counter("fy_scoped_out_total",
          "Requests answered 401 because their credential is not for who asked ([scope]).",
          m.scoped_out);
  counter("fy_overlaps_total", "Requests answered 502 for overlapping rules.", m.overlaps);
  counter("fy_replays_total", "Requests re-issued after a 401.", m.replays);
  counter("fy_builds_total", "Connections that proved a build secret.", m.builds);
  counter("fy_proxy_auth_challenges_total", "407 challenges sent.", m.proxy_auth_challenges);
  counter("fy_credential_mints_total", "Credentials minted.", credentials_->stats().mints);
  counter("fy_credential_mint_failures_total", "Mints that failed.",
          credentials_->stats().mint_failures);
  counter("fy_stamps_valid_total", "Connections with a valid forwarder stamp.", m.stamps_valid);
  counter("fy_stamps_invalid_total", "Stamps refused (bad MAC or form).", m.stamps_invalid);
  counter("fy_stamps_replayed_total", "Stamps refused as replays.", m.stamps_replayed);
  counter("fy_unattributed_total", "Connections recorded as unattributed.", m.unattributed);
  counter("fy_refused_unattributed_total", "Requests refused for lack of a stamp (require).",
          m.refused_unattributed);
  gauge("fy_buffer_chunks_live", "64 KiB buffer chunks in use.", ChunkPool::live());
  return out;
}

}  // namespace fy::proxy
