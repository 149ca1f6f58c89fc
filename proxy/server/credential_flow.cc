#include "proxy/server/credential_flow.h"

#include <utility>

#include "proxy/http/rewrite.h"
#include "proxy/inject/redact.h"

namespace fy::proxy {

void CredentialWait::start(inject::CredentialStore& store, const inject::Rule& rule,
                           inject::CredentialStore::Done done, bool force) {
  ticket_ = store.wait(
      rule,
      [this, done = std::move(done)](const inject::MintOutcome& out) {
        ticket_ = 0;
        done(out);
      },
      force);
}

bool CredentialWait::cancel(inject::CredentialStore& store) {
  if (!ticket_) return false;
  store.cancel(ticket_);
  ticket_ = 0;
  return true;
}

void CredentialFlow::begin(const inject::Rule& rule, std::optional<uint64_t> content_length,
                           netlog::Row& row) {
  rule_id_ = rule.id;
  rule_spec_ = rule.spec();
  replay_ = rule.replay_on_401;
  if (replay_ && content_length && *content_length > inject::kMaxReplayBody) body_unkept_ = true;
  row.rule = rule.id;
  if (!rule.query_param.empty()) row.path = inject::redact_query_param(row.path, rule.query_param);
}

const inject::Rule* CredentialFlow::rule(const inject::Rules& rules) const {
  return rules.by_id(rule_id_);
}

const inject::Rule* CredentialFlow::same_rule(const inject::Rules& rules) const {
  const inject::Rule* r = rules.by_id(rule_id_);
  return r && r->spec() == rule_spec_ ? r : nullptr;
}

void CredentialFlow::drop_rule(netlog::Row* row) {
  rule_id_.clear();
  if (row) row->rule.clear();
}

bool CredentialFlow::inject(const inject::Rules& rules, std::string_view token,
                            std::string_view target, http::RequestOut& out, std::string& target_buf,
                            netlog::Row& row) {
  const inject::Rule* r = rule(rules);
  if (!r) return false;
  std::string value = r->value_prefix;
  value.append(token);
  if (!r->query_param.empty()) {
    target_buf = inject::set_query_param(target, r->query_param, value);
    out.target = target_buf;
  } else {
    // Overwrite, never append: the dummy the box sent is gone.
    out.set.emplace_back(r->header, value);
  }
  value.assign(value.size(), '\0');
  injected_ = true;
  row.injected = true;
  return true;
}

void CredentialFlow::keep_body(uint64_t* total, const char* p, size_t n) {
  if (!kept_body_.append(total, inject::kMaxReplayBody, inject::kMaxReplayBodies, p, n))
    body_unkept_ = true;
}

CredentialFlow::Verdict CredentialFlow::response_head(int status, bool request_done,
                                                      const inject::Rules& rules,
                                                      inject::CredentialStore& store) {
  Verdict v = Verdict::pass;
  if (status == 401 && injected_) {
    if (replayable(request_done)) {
      discard_response_ = true;
      return Verdict::replace;
    }
    // A streamed upload (a body over the bound, or one still arriving)
    // cannot be sent again: the token is dropped so the next request has a
    // fresh one.
    v = replay_ && !replayed_ ? Verdict::hand_back_unkept : Verdict::hand_back;
    if (const inject::Rule* r = same_rule(rules)) store.invalidate(*r);
  }
  replay_ = false;
  kept_body_.release();
  return v;
}

const inject::Rule* CredentialFlow::start_replay(const inject::Rules& rules,
                                                 inject::CredentialStore& store, netlog::Row& row) {
  replayed_ = true;
  row.replayed = true;
  const inject::Rule* r = same_rule(rules);
  if (!r) {
    discard_response_ = false;
    rule_id_.clear();
    return nullptr;
  }
  store.invalidate(*r);
  return r;
}

CredentialFlow::Arrival CredentialFlow::arrived(const inject::MintOutcome& out,
                                                const inject::Rules& rules) {
  if (discard_response_) {
    discard_response_ = false;
    if (!out.ok) return Arrival::failed_after_401;
  }
  return same_rule(rules) ? Arrival::same_rule : Arrival::rule_changed;
}

}  // namespace fy::proxy
