// The credential flow of an exchange: the rule it injects for, the token
// written into its head, the copy of its body kept for a 401 replay, the
// replay-once rule, and the Network Log fields they set (rule, injected,
// replayed, mint_failed); and the wait for a token from the store
// (proxy/inject/store.h, single flight).
//
// The cut follows tunnel.h's: state as values, steps that return what the
// owner must do. The Connection stays the handler of both Streams, owns the
// timer and the one kill point, decides with admission (a rule or a scope
// that changed during a mint) and answers; these types never call back into
// it, close, pause or answer anything themselves. The store is passed to each
// step that needs it, never kept.
//
//  - CredentialFlow is per exchange (a member of the Connection's Exchange,
//    reset with it): what was injected, whether a replay is allowed, pending
//    or done, and the kept body.
//  - CredentialWait is per connection: the one registration it may hold in
//    the store. It outlives any exchange reset; the owner cancels it when it
//    answers instead and at its kill point, before the wait is destroyed (the
//    store's callback refers to it).
#pragma once

#include <cassert>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/inject/rules.h"
#include "proxy/inject/store.h"
#include "proxy/netlog/row.h"

namespace fy::http {
struct RequestOut;  // proxy/http/rewrite.h
}  // namespace fy::http

namespace fy::proxy {

// A request body kept for a 401 replay, counted in a proxy-wide total that it
// keeps exact: whatever way it is dropped (release, reassignment, the
// exchange or the connection going), its bytes leave the total.
class KeptBody {
 public:
  KeptBody() = default;
  KeptBody(const KeptBody&) = delete;
  KeptBody& operator=(const KeptBody&) = delete;
  KeptBody(KeptBody&& o) noexcept : bytes_(std::move(o.bytes_)), total_(o.total_) {
    o.bytes_.clear();
    o.total_ = nullptr;
  }
  KeptBody& operator=(KeptBody&& o) noexcept {
    if (this != &o) {
      release();
      bytes_.swap(o.bytes_);
      total_ = o.total_;
      o.total_ = nullptr;
    }
    return *this;
  }
  ~KeptBody() { release(); }

  // Appends n bytes unless this body would pass `each` or `*total` would pass
  // `all`; then everything kept is released and false returned.
  bool append(uint64_t* total, size_t each, size_t all, const char* p, size_t n) {
    if (bytes_.size() + n > each || *total + n > all) {
      release();
      return false;
    }
    total_ = total;
    bytes_.append(p, n);
    *total += n;
    return true;
  }
  void release() {
    if (total_) *total_ -= bytes_.size();
    total_ = nullptr;
    std::string().swap(bytes_);
  }
  const std::string& bytes() const { return bytes_; }
  bool empty() const { return bytes_.empty(); }

 private:
  std::string bytes_;
  uint64_t* total_ = nullptr;
};

// The wait for one rule's token. `done` is called from a libuv callback (the
// store's contract), never from inside start(); the wait is over (waiting()
// false) before `done` runs, so `done` may start another.
class CredentialWait {
 public:
  CredentialWait() = default;
  // The store's callback refers to this object: the wait must be over
  // (answered or cancelled) before it is freed.
  ~CredentialWait() { assert(ticket_ == 0 && "a CredentialWait must be over before it is freed"); }
  CredentialWait(const CredentialWait&) = delete;
  CredentialWait& operator=(const CredentialWait&) = delete;

  // `force`: the cached token is dropped first (the replay after a 401). At
  // most one wait at a time.
  void start(inject::CredentialStore& store, const inject::Rule& rule,
             inject::CredentialStore::Done done, bool force = false);
  // Withdraws the wait; its `done` is never called. True: one was pending.
  bool cancel(inject::CredentialStore& store);
  bool waiting() const { return ticket_ != 0; }

 private:
  uint64_t ticket_ = 0;
};

// One exchange's flow; reset with the exchange (its kept body leaves the
// proxy-wide total then).
class CredentialFlow {
 public:
  // The exchange is forwarded under `rule`: the row names it and its path
  // loses the query parameter's value. `content_length`: the request head's;
  // a body announced over inject::kMaxReplayBody is never kept (it is
  // streamed, and a 401 to it goes back to the client).
  void begin(const inject::Rule& rule, std::optional<uint64_t> content_length, netlog::Row& row);
  // The switch this exchange injects for ("" for none, or once dropped).
  const std::string& rule_id() const { return rule_id_; }
  // The exchange's rule as `rules` has it now, by its switch only; nullptr
  // when it is gone.
  const inject::Rule* rule(const inject::Rules& rules) const;
  // The same, and only when its spec is still the one the exchange began
  // with (else the token minted for it is not this rule's).
  const inject::Rule* same_rule(const inject::Rules& rules) const;
  // Nothing is injected any more; `row` (when given) no longer names the
  // rule.
  void drop_rule(netlog::Row* row);

  // Writes `token` into the head to send: the rule's query parameter in
  // `out.target` (whose bytes `target_buf` then holds: it must outlive
  // `out`), else its header, overwritten. True (the row says injected) when
  // the rule is still there; false writes nothing.
  [[nodiscard]] bool inject(const inject::Rules& rules, std::string_view token,
                            std::string_view target, http::RequestOut& out, std::string& target_buf,
                            netlog::Row& row);
  bool injected() const { return injected_; }
  // The store failed to mint: the row says so (the owner answers).
  static void mint_failed(netlog::Row& row) { row.mint_failed = true; }

  // Whether body bytes that went upstream are copied: the rule replays, a
  // token went out, no replay happened yet and no byte went up uncopied.
  bool keeps_body() const { return replay_ && injected_ && !replayed_ && !body_unkept_; }
  // Copies them, grown as bytes arrive (never reserved from Content-Length);
  // past either bound (the body's, or `*total` of all kept bodies) the copy
  // is dropped for good.
  void keep_body(uint64_t* total, const char* p, size_t n);
  // Whether a 401 may be replaced by a re-mint and a re-issue: the rule
  // replays, it has not happened yet, and the whole request went up and is
  // kept (`request_done`: the parser saw its last byte).
  bool replayable(bool request_done) const {
    return replay_ && !replayed_ && request_done && !body_unkept_;
  }

  // What a final response head means for the credential.
  enum class Verdict : uint8_t {
    pass,              // not a 401 to an injected token: the client gets it
    replace,           // read it to its end (discarding()), then start_replay()
    hand_back,         // a 401 the client gets; its token is dropped (same_rule() only)
    hand_back_unkept,  // the same, for a replaying rule whose body was not kept
  };
  // For every final head (never an interim one). Except on replace, nothing
  // will be re-issued: the kept body is released.
  Verdict response_head(int status, bool request_done, const inject::Rules& rules,
                        inject::CredentialStore& store);
  // A 401 being replaced: its bytes go nowhere.
  bool discarding() const { return discard_response_; }
  // The replaced 401 is read: the row says replayed, once. Returns the rule
  // to wait for (its token dropped from the store: the wait must force a
  // re-mint); nullptr when the rule changed, and then the request goes again
  // without a token.
  const inject::Rule* start_replay(const inject::Rules& rules, inject::CredentialStore& store,
                                   netlog::Row& row);
  bool replayed() const { return replayed_; }
  // The body the first attempt sent, framing included, for the re-issue.
  KeptBody& kept_body() { return kept_body_; }

  // A token (or a failure) arrived; a replaced 401 is no longer discarded.
  enum class Arrival : uint8_t {
    failed_after_401,  // the re-mint after a replaced 401 failed: answer that
    rule_changed,      // the rule is gone or changed: drop_rule(), judge again
    same_rule,         // same_rule() is still the one: check its scope, then use `out`
  };
  Arrival arrived(const inject::MintOutcome& out, const inject::Rules& rules);

 private:
  std::string rule_id_;
  std::string rule_spec_;
  bool injected_ = false;
  bool replay_ = false;  // the rule re-issues once after a 401
  bool replayed_ = false;
  bool discard_response_ = false;  // the 401 being replaced
  // A replay_on_401 exchange keeps a copy of the request body as it went
  // upstream, up to kMaxReplayBody. A body over the bound (or one still
  // arriving when the 401 comes) is not re-sent.
  KeptBody kept_body_;
  bool body_unkept_ = false;  // some body bytes went up without a copy
};

}  // namespace fy::proxy
