#include "proxy/inject/store.h"

#include <openssl/bio.h>
#include <openssl/digest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/clock.h"
#include "core/crypto.h"
#include "core/log.h"
#include "core/loop.h"
#include "proxy/inject/redact.h"

extern char** environ;

namespace fy::inject {

// ---------------------------------------------------------------------------
// The host env file

bool HostEnv::reload() {
  // KEY=VALUE per line; '#' comments; "export " allowed. A double-quoted
  // value may span lines (a PEM key) and understands \n, \" and \\; a
  // single-quoted value is literal.
  std::map<std::string, std::string, std::less<>> vars;
  std::ifstream in(path_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    std::string line = text.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? text.size() : eol + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line = line.substr(start);
    if (line.rfind("export ", 0) == 0) line = line.substr(7);
    size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = line.substr(0, eq);
    std::string value = line.substr(eq + 1);
    if (!value.empty() && value.front() == '"') {
      // Read on until the closing quote (possibly on a later line).
      std::string raw = value.substr(1);
      while (true) {
        size_t close = std::string::npos;
        for (size_t i = 0; i < raw.size(); ++i) {
          if (raw[i] == '\\') {
            ++i;
          } else if (raw[i] == '"') {
            close = i;
            break;
          }
        }
        if (close != std::string::npos) {
          raw.resize(close);
          break;
        }
        if (pos >= text.size()) break;  // unterminated: take what there is
        size_t e2 = text.find('\n', pos);
        raw += '\n';
        raw += text.substr(pos, e2 == std::string::npos ? std::string::npos : e2 - pos);
        pos = e2 == std::string::npos ? text.size() : e2 + 1;
        while (!raw.empty() && raw.back() == '\r') raw.pop_back();
      }
      value.clear();
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size()) {
          char n = raw[++i];
          value += n == 'n' ? '\n' : n;
        } else {
          value += raw[i];
        }
      }
    } else if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
      value = value.substr(1, value.size() - 2);
    }
    vars[key] = value;
  }
  bool changed = vars != vars_;
  vars_ = std::move(vars);
  return changed;
}

std::optional<std::string> HostEnv::get(std::string_view name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

// ---------------------------------------------------------------------------
// Minter output and the GitHub App JWT

Result<std::pair<std::string, int64_t>> parse_minter_output(std::string_view out) {
  auto j = nlohmann::json::parse(out.begin(), out.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(Errc::parse, "bad JSON on stdout");
  auto v = j.find("value");
  if (v == j.end()) return make_error(Errc::parse, "missing key 'value' in its output");
  if (!v->is_string()) return make_error(Errc::parse, "'value' is not a string");
  std::string value = v->get<std::string>();
  if (value.empty()) return make_error(Errc::parse, "'value' is empty");
  for (char c : value)
    if (c == '\r' || c == '\n' || c == '\0')
      return make_error(Errc::parse, "'value' contains a line break or NUL");
  int64_t ttl = 3600;
  auto t = j.find("ttl");
  if (t != j.end()) {
    if (!t->is_number_integer()) return make_error(Errc::parse, "'ttl' is not an integer");
    ttl = t->get<int64_t>();
    if (ttl < 0) return make_error(Errc::parse, "'ttl' is negative");
  }
  return std::make_pair(std::move(value), ttl);
}

Result<std::string> github_app_jwt(const std::string& pem, int64_t app_id, int64_t now_s) {
  bssl::UniquePtr<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  bssl::UniquePtr<EVP_PKEY> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key || EVP_PKEY_id(key.get()) != EVP_PKEY_RSA)
    return make_error(Errc::parse, "the app's private key is not an RSA key in PEM form");
  std::string header = base64url_encode(R"({"alg":"RS256","typ":"JWT"})");
  // iat 60 s in the past allows for clock drift (GitHub's advice); exp < 10 min.
  std::string payload = base64url_encode(
      fmt::format(R"({{"iat":{},"exp":{},"iss":"{}"}})", now_s - 60, now_s + 540, app_id));
  std::string signing_input = header + "." + payload;
  bssl::ScopedEVP_MD_CTX ctx;
  size_t sig_len = 0;
  if (!EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) ||
      !EVP_DigestSign(ctx.get(), nullptr, &sig_len,
                      reinterpret_cast<const uint8_t*>(signing_input.data()), signing_input.size()))
    return make_error(Errc::internal, "cannot sign the app's JWT");
  std::string sig(sig_len, '\0');
  if (!EVP_DigestSign(ctx.get(), reinterpret_cast<uint8_t*>(sig.data()), &sig_len,
                      reinterpret_cast<const uint8_t*>(signing_input.data()), signing_input.size()))
    return make_error(Errc::internal, "cannot sign the app's JWT");
  sig.resize(sig_len);
  return signing_input + "." + base64url_encode(sig);
}

// ---------------------------------------------------------------------------
// Mint jobs: one in flight per rule. Each reports to the store exactly once
// (unless cancelled) from a libuv callback, then frees itself when its
// handles are closed.

class MintJob {
 public:
  MintJob(CredentialStore* store, const Rule& rule, std::string key)
      : store_(store), rule_(rule), key_(std::move(key)) {}
  virtual ~MintJob() = default;
  virtual void start() = 0;
  // The store no longer wants the result (shutdown): stop and free.
  virtual void cancel() = 0;
  const std::string& key() const { return key_; }
  const Rule& rule() const { return rule_; }

 protected:
  void report(const MintOutcome& out) {
    if (store_) store_->mint_done(this, out);
    store_ = nullptr;
  }
  CredentialStore* store_;
  Rule rule_;
  std::string key_;
};

namespace {

MintOutcome failure(std::string reason) {
  MintOutcome o;
  o.reason = std::move(reason);
  return o;
}

// Reports a known outcome on the next loop turn: a static secret (or its
// absence), or a remembered failure.
class DeferredJob final : public MintJob {
 public:
  DeferredJob(CredentialStore* s, const Rule& r, std::string key, uv_loop_t* loop, MintOutcome out)
      : MintJob(s, r, std::move(key)), out_(std::move(out)) {
    uv_timer_init(loop, &timer_);
    timer_.data = this;
  }
  void start() override {
    uv_timer_start(&timer_, [](uv_timer_t* t) {
      auto* self = static_cast<DeferredJob*>(t->data);
      self->report(self->out_);
      self->out_.value.assign(self->out_.value.size(), '\0');
      self->close();
    }, 0, 0);
  }
  void cancel() override {
    store_ = nullptr;
    close();
  }

 private:
  void close() {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(&timer_)))
      uv_close(reinterpret_cast<uv_handle_t*>(&timer_),
               [](uv_handle_t* h) { delete static_cast<DeferredJob*>(h->data); });
  }
  MintOutcome out_;
  uv_timer_t timer_;
};

MintOutcome static_outcome(const Rule& rule, const std::optional<std::string>& secret) {
  if (!secret || secret->empty())
    return failure(rule.secret_name() + " is not set in the host env file");
  MintOutcome out;
  out.ok = true;
  out.value = *secret;
  out.ttl_s = rule.ttl_s;
  return out;
}

// Command: a child process (argv, no shell) that prints {"value", "ttl"}.
class CommandJob final : public MintJob {
 public:
  CommandJob(CredentialStore* s, const Rule& r, std::string key, uv_loop_t* loop,
             std::vector<std::string> env, uint64_t timeout_ms)
      : MintJob(s, r, std::move(key)), loop_(loop), env_(std::move(env)), timeout_ms_(timeout_ms) {}

  void start() override {
    uv_timer_init(loop_, &timer_);
    timer_.data = this;
    ++open_;
    uv_pipe_init(loop_, &out_, 0);
    uv_pipe_init(loop_, &err_, 0);
    out_.data = err_.data = this;
    open_ += 2;
    std::vector<char*> args;
    for (auto& a : rule_.command) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_) envp.push_back(e.data());
    envp.push_back(nullptr);
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
    stdio[1].data.stream = reinterpret_cast<uv_stream_t*>(&out_);
    stdio[2].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
    stdio[2].data.stream = reinterpret_cast<uv_stream_t*>(&err_);
    uv_process_options_t opts{};
    opts.file = args[0];
    opts.args = args.data();
    opts.env = envp.data();
    opts.stdio = stdio;
    opts.stdio_count = 3;
    opts.exit_cb = on_exit;
    proc_.data = this;
    int rc = uv_spawn(loop_, &proc_, &opts);
    if (rc != 0) {
      // The process handle must still be closed; report on the next turn.
      spawn_error_ = uv_strerror(rc);
      spawn_failed_ = true;
      ++open_;
      uv_close(reinterpret_cast<uv_handle_t*>(&proc_), on_closed);
      uv_timer_start(&timer_, [](uv_timer_t* t) {
        auto* self = static_cast<CommandJob*>(t->data);
        self->report(failure("the minter could not start: " + self->spawn_error_));
        self->close_all();
      }, 0, 0);
      return;
    }
    ++open_;
    running_ = true;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&out_), alloc, on_read);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&err_), alloc, on_read);
    uv_timer_start(&timer_, [](uv_timer_t* t) {
      auto* self = static_cast<CommandJob*>(t->data);
      self->hung_ = true;
      if (self->running_) uv_process_kill(&self->proc_, SIGKILL);
    }, timeout_ms_, 0);
  }

  void cancel() override {
    store_ = nullptr;
    if (running_) uv_process_kill(&proc_, SIGKILL);
    // on_exit closes everything.
    if (!running_) close_all();
  }

 private:
  static void alloc(uv_handle_t*, size_t, uv_buf_t* buf) {
    static thread_local char scratch[16384];
    *buf = uv_buf_init(scratch, sizeof scratch);
  }
  static void on_read(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    auto* self = static_cast<CommandJob*>(s->data);
    if (n <= 0) return;
    std::string& into = s == reinterpret_cast<uv_stream_t*>(&self->out_) ? self->stdout_ : self->stderr_;
    if (into.size() < 65536) into.append(buf->base, std::min<size_t>(static_cast<size_t>(n), 65536 - into.size()));
  }
  static void on_exit(uv_process_t* p, int64_t status, int term_signal) {
    auto* self = static_cast<CommandJob*>(p->data);
    self->running_ = false;
    self->status_ = status;
    self->signal_ = term_signal;
    // Let the pipes drain what the child wrote last before judging.
    uv_timer_stop(&self->timer_);
    uv_timer_start(&self->timer_, [](uv_timer_t* t) {
      static_cast<CommandJob*>(t->data)->finish();
    }, 20, 0);
  }
  void finish() {
    MintOutcome out;
    if (hung_) {
      out = failure(fmt::format("hung: no answer within {} s", timeout_ms_ / 1000));
    } else if (signal_ != 0) {
      out = failure(fmt::format("killed by signal {}: {}", signal_, stderr_tail(stderr_)));
    } else if (status_ != 0) {
      out = failure(fmt::format("exit {}: {}", status_, stderr_tail(stderr_)));
    } else {
      auto parsed = parse_minter_output(stdout_);
      if (!parsed) {
        out = failure(parsed.error().message);  // never stdout itself
      } else {
        out.ok = true;
        out.value = std::move(parsed->first);
        out.ttl_s = parsed->second;
      }
    }
    stdout_.assign(stdout_.size(), '\0');
    stdout_.clear();
    report(out);
    close_all();
  }
  void close_all() {
    auto close = [this](uv_handle_t* h) {
      if (!uv_is_closing(h)) uv_close(h, on_closed);
    };
    close(reinterpret_cast<uv_handle_t*>(&timer_));
    close(reinterpret_cast<uv_handle_t*>(&out_));
    close(reinterpret_cast<uv_handle_t*>(&err_));
    if (!spawn_failed_) close(reinterpret_cast<uv_handle_t*>(&proc_));
  }
  static void on_closed(uv_handle_t* h) {
    auto* self = static_cast<CommandJob*>(h->data);
    if (--self->open_ == 0) delete self;
  }

  uv_loop_t* loop_;
  std::vector<std::string> env_;
  uint64_t timeout_ms_;
  uv_process_t proc_;
  uv_pipe_t out_, err_;
  uv_timer_t timer_;
  int open_ = 0;
  bool running_ = false;
  bool hung_ = false;
  bool spawn_failed_ = false;
  std::string spawn_error_;
  int64_t status_ = 0;
  int signal_ = 0;
  std::string stdout_, stderr_;
};

// GitHub App: a JWT signed on the thread pool, then
// POST /app/installations/<id>/access_tokens over the proxy's TLS client.
class GithubJob final : public MintJob {
 public:
  GithubJob(CredentialStore* s, const Rule& r, std::string key, uv_loop_t* loop, SSL_CTX* ctx,
            Resolver resolve, HostPort api, std::optional<std::string> pem)
      : MintJob(s, r, std::move(key)), loop_(loop), ctx_(ctx), resolve_(std::move(resolve)),
        api_(std::move(api)), pem_(std::move(pem)) {}

  void start() override {
    work_.data = this;
    uv_queue_work(loop_, &work_, [](uv_work_t* w) {
      auto* self = static_cast<GithubJob*>(w->data);
      if (!self->pem_ || self->pem_->empty()) return;
      auto jwt = github_app_jwt(*self->pem_, self->rule_.app_id, wall_ms() / 1000);
      if (jwt) {
        self->jwt_ = std::move(*jwt);
      } else {
        self->jwt_error_ = jwt.error().message;
      }
    }, [](uv_work_t* w, int) {
      auto* self = static_cast<GithubJob*>(w->data);
      self->signed_();
    });
  }

  void cancel() override {
    store_ = nullptr;
    cancelled_ = true;
    if (call_) {
      // The call's completion will not run once cancelled: free here.
      https_cancel(call_);
      call_ = nullptr;
      idle_ = true;
    }
    // With a work item in flight, signed_() frees the job when it returns.
    if (idle_) delete this;
  }

 private:
  void signed_() {
    pem_.reset();
    if (cancelled_) {
      delete this;
      return;
    }
    if (jwt_.empty()) {
      report(failure(!jwt_error_.empty() ? jwt_error_
                                         : rule_.secret_name() + " (the app's private key) is not set in the host env file"));
      delete this;
      return;
    }
    HttpsRequest req;
    req.dest = api_;
    req.method = "POST";
    req.path = fmt::format("/app/installations/{}/access_tokens", rule_.installation_id);
    req.headers = {{"Authorization", "Bearer " + jwt_},
                   {"Accept", "application/vnd.github+json"},
                   {"User-Agent", "foldyard-egress"},
                   {"X-GitHub-Api-Version", "2022-11-28"},
                   {"Content-Type", "application/json"}};
    jwt_.assign(jwt_.size(), '\0');
    nlohmann::json body = nlohmann::json::object();
    if (!rule_.repositories.empty()) {
      nlohmann::json repos = nlohmann::json::array();
      for (const auto& r : rule_.repositories) {
        // "owner/name" or "name": GitHub wants names.
        repos.push_back(r.substr(r.find('/') == std::string::npos ? 0 : r.find('/') + 1));
      }
      body["repositories"] = repos;
    }
    req.body = body.dump();
    idle_ = false;
    call_ = https_request(loop_, ctx_, resolve_, std::move(req), [this](Result<HttpsResponse> r) {
      call_ = nullptr;
      idle_ = true;
      if (cancelled_) {
        delete this;
        return;
      }
      MintOutcome out;
      if (!r) {
        out = failure(fmt::format("asking GitHub for an installation token failed: {}: {}",
                                  errc_name(r.error().code), redact_tokens(r.error().message)));
      } else if (r->status != 201 && r->status != 200) {
        auto j = nlohmann::json::parse(r->body, nullptr, false);
        std::string msg = j.is_object() && j.contains("message") && j["message"].is_string()
                              ? j["message"].get<std::string>()
                              : "";
        out = failure(fmt::format("GitHub answered {}{}{}", r->status, msg.empty() ? "" : ": ",
                                  redact_tokens(msg.substr(0, 300))));
      } else {
        auto j = nlohmann::json::parse(r->body, nullptr, false);
        if (!j.is_object() || !j.contains("token") || !j["token"].is_string()) {
          out = failure("GitHub's answer has no token");
        } else {
          out.ok = true;
          out.value = j["token"].get<std::string>();
          out.ttl_s = 3600;
          if (j.contains("expires_at") && j["expires_at"].is_string()) {
            if (auto exp = parse_iso8601(j["expires_at"].get<std::string>()))
              out.ttl_s = std::max<int64_t>(0, (*exp - wall_ms()) / 1000);
          }
        }
      }
      report(out);
      delete this;
    });
  }

  uv_loop_t* loop_;
  SSL_CTX* ctx_;
  Resolver resolve_;
  HostPort api_;
  std::optional<std::string> pem_;
  uv_work_t work_;
  std::string jwt_, jwt_error_;
  HttpsCall* call_ = nullptr;
  bool cancelled_ = false;
  bool idle_ = false;  // no work item and no call in flight
};

log::RateLimit g_mint_log(10, 60'000);

}  // namespace

// ---------------------------------------------------------------------------
// The store

CredentialStore::CredentialStore(StoreOptions opts) : opts_(std::move(opts)) {}

CredentialStore::~CredentialStore() { shutdown(); }

void CredentialStore::shutdown() {
  shut_down_ = true;
  for (auto& [id, e] : entries_) {
    if (e.job) {
      MintJob* job = e.job;
      e.job = nullptr;
      job->cancel();
    }
    e.waiters.clear();
  }
}

std::string CredentialStore::key_for(const Rule& rule) const {
  // The spec and every secret the mint reads, hashed: the key never holds a
  // value, and a change to either is a new credential.
  std::string material = rule.spec();
  material += '\0';
  material += opts_.host_env->get(rule.secret_name()).value_or("\x01unset");
  for (const auto& name : rule.env) {
    material += '\0';
    if (const char* v = getenv(name.c_str())) {
      material += v;
    } else if (auto hv = opts_.host_env->get(name)) {
      material += *hv;
    } else {
      for (const auto& [k, v2] : defaults_)
        if (k == name) material += v2;
    }
  }
  return hex(sha256(material));
}

std::vector<std::string> CredentialStore::minter_env(const Rule& rule) const {
  // A base environment plus exactly the names the rule declares: a minter
  // never sees another rule's secret.
  std::vector<std::string> env;
  for (const char* name : {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"}) {
    if (const char* v = getenv(name)) env.push_back(std::string(name) + "=" + v);
  }
  if (!getenv("PATH")) env.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  for (const auto& name : rule.env) {
    if (const char* v = getenv(name.c_str())) {
      env.push_back(name + "=" + v);
    } else if (auto hv = opts_.host_env->get(name)) {
      env.push_back(name + "=" + *hv);
    } else {
      for (const auto& [k, v2] : defaults_)
        if (k == name) env.push_back(name + "=" + v2);
    }
  }
  return env;
}

CredentialStore::Entry& CredentialStore::entry_for(const Rule& rule) {
  Entry& e = entries_[rule.id];
  std::string key = key_for(rule);
  if (e.key != key) {
    // A new or changed credential: nothing cached carries over.
    e.key = key;
    e.value.assign(e.value.size(), '\0');
    e.value.clear();
    e.fresh_until_ms = 0;
    e.failed_until_ms = 0;
    e.failure.clear();
  }
  e.rule = rule;
  return e;
}

void CredentialStore::update(const Rules& rules,
                             const std::vector<std::pair<std::string, std::string>>& defaults) {
  defaults_ = defaults;
  // Drop entries of rules that are gone; their waiters are told after the
  // map is no longer being walked (they re-check the policy and go on
  // without a credential).
  std::vector<Done> orphans;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!rules.by_id(it->first)) {
      if (it->second.job) {
        MintJob* job = it->second.job;
        it->second.job = nullptr;
        job->cancel();
      }
      for (auto& [ticket, done] : it->second.waiters) orphans.push_back(std::move(done));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  uint64_t now = uv_now(opts_.loop);
  for (const Rule& r : rules.inject) {
    bool existed = entries_.count(r.id) > 0;
    std::string old_key = existed ? entries_[r.id].key : "";
    Entry& e = entry_for(r);
    bool changed = !existed || old_key != e.key;
    if (!changed) continue;
    if (e.job) {
      // A mint for the old spec or secret is in flight: its result must
      // never serve the new credential. Stop it; the waiters stay enrolled
      // for the new mint.
      MintJob* job = e.job;
      e.job = nullptr;
      job->cancel();
      start_mint(e);
    } else if (now >= e.failed_until_ms) {
      start_mint(e);  // mint ahead: the first request should not wait
    }
  }
  MintOutcome gone = failure("the switch was turned off while its credential was minted");
  for (auto& done : orphans) done(gone);
}

CredentialStore::Lookup CredentialStore::lookup(const Rule& rule) {
  // Entries are re-keyed by update() on every policy and host env change, so
  // the request path needs no hashing: find the rule's entry by id.
  auto it = entries_.find(rule.id);
  Entry& e = it != entries_.end() ? it->second : entry_for(rule);
  uint64_t now = uv_now(opts_.loop);
  Lookup l;
  if (now < e.failed_until_ms) {
    l.state = State::failed;
    l.failure = e.failure;
  } else if (!e.value.empty() && now < e.fresh_until_ms) {
    ++stats_.cache_hits;
    l.state = State::ready;
    l.value = e.value;
  }
  return l;
}

uint64_t CredentialStore::wait(const Rule& rule, Done done, bool force) {
  auto it = entries_.find(rule.id);
  Entry& e = it != entries_.end() ? it->second : entry_for(rule);
  if (force) {
    e.value.assign(e.value.size(), '\0');
    e.value.clear();
    e.fresh_until_ms = 0;
  }
  uint64_t ticket = next_ticket_++;
  e.waiters.emplace_back(ticket, std::move(done));
  // One mint per rule however many wait; a remembered failure answers even a
  // forced re-mint (start_mint reports it on the next turn).
  if (!e.job) start_mint(e);
  return ticket;
}

void CredentialStore::cancel(uint64_t ticket) {
  for (auto& [id, e] : entries_) {
    for (auto it = e.waiters.begin(); it != e.waiters.end(); ++it) {
      if (it->first == ticket) {
        e.waiters.erase(it);
        return;
      }
    }
  }
}

void CredentialStore::invalidate(const Rule& rule) {
  auto it = entries_.find(rule.id);
  if (it == entries_.end()) return;
  it->second.value.assign(it->second.value.size(), '\0');
  it->second.value.clear();
  it->second.fresh_until_ms = 0;
}

bool CredentialStore::has_token(const std::string& id) const {
  auto it = entries_.find(id);
  return it != entries_.end() && !it->second.value.empty() &&
         uv_now(opts_.loop) < it->second.fresh_until_ms;
}

void CredentialStore::start_mint(Entry& e) {
  if (shut_down_) return;
  uint64_t now = uv_now(opts_.loop);
  MintJob* job;
  if (now < e.failed_until_ms) {
    // Report the remembered failure without running the minter again; ttl -1
    // marks it so its memory is not renewed.
    MintOutcome remembered = failure(e.failure);
    remembered.ttl_s = -1;
    job = new DeferredJob(this, e.rule, e.key, opts_.loop, std::move(remembered));
  } else {
    switch (e.rule.kind) {
      case Kind::static_secret:
        job = new DeferredJob(this, e.rule, e.key, opts_.loop,
                              static_outcome(e.rule, opts_.host_env->get(e.rule.secret_name())));
        break;
      case Kind::command:
        job = new CommandJob(this, e.rule, e.key, opts_.loop, minter_env(e.rule),
                             opts_.minter_timeout_ms);
        break;
      case Kind::github_app:
        job = new GithubJob(this, e.rule, e.key, opts_.loop, opts_.client_ctx, opts_.resolve,
                            opts_.github_api, opts_.host_env->get(e.rule.secret_name()));
        break;
      default: return;
    }
  }
  e.job = job;
  job->start();
}

void CredentialStore::mint_done(MintJob* job, const MintOutcome& out) {
  auto it = entries_.find(job->rule().id);
  if (it == entries_.end() || it->second.job != job) return;  // superseded
  Entry& e = it->second;
  e.job = nullptr;
  uint64_t now = uv_now(opts_.loop);
  bool same_credential = job->key() == e.key;
  if (!same_credential) {
    // Minted for a spec or secret that has since changed: worthless, and
    // dangerous to hand out. Mint again for the current one; waiters stay.
    if (!e.waiters.empty()) start_mint(e);
    return;
  }
  if (out.ok) {
    ++stats_.mints;
    if (same_credential) {
      e.value = out.value;
      // Cached until ttl - 30 s.
      int64_t keep_s = out.ttl_s > 30 ? out.ttl_s - 30 : 0;
      e.fresh_until_ms = now + static_cast<uint64_t>(keep_s) * 1000;
      e.failure.clear();
      e.failed_until_ms = 0;
    }
    log::info("minted a credential for switch '{}' ({}, {}): valid {} s", e.rule.id,
              kind_name(e.rule.kind), e.rule.host, out.ttl_s);
  } else {
    if (out.ttl_s != -1) {
      ++stats_.mint_failures;
      if (same_credential) {
        e.failure = out.reason;
        e.failed_until_ms = now + opts_.failure_memory_ms;
      }
      log::limited(g_mint_log, log::Level::warn,
                         "could not mint a credential for switch '{}' ({}): {}", e.rule.id,
                         e.rule.host, out.reason);
    }
  }
  auto waiters = std::move(e.waiters);
  e.waiters.clear();
  for (auto& [ticket, done] : waiters) done(out);
}

}  // namespace fy::inject
