// The proxy's policy: allowlist mode, grants and passthrough, read from the
// TOML file the supervisor rewrites atomically (docs/fy-proxy.md, "Policy").
//
// A Policy is immutable once built and shared as shared_ptr<const Policy>:
// each connection keeps the snapshot it was judged with, and a reload swaps
// in a new one on the loop thread, then re-judges open connections.
// A missing or malformed file yields Policy::closed(): enforce, nothing
// granted, nothing tunnelled.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "proxy/inject/rules.h"
#include "proxy/policy/pattern.h"
#include "proxy/policy/principals.h"

namespace fy::cfg {
class Doc;
}

namespace fy::policy {

enum class Mode : uint8_t { enforce, observe, learn };
enum class Level : uint8_t { once, session, permanent };
enum class Scope : uint8_t { runtime, build };
enum class Verdict : uint8_t { allow, block, would_block };

const char* mode_name(Mode m);

struct Grant {
  Pattern pattern;
  Level level = Level::permanent;
  Scope scope = Scope::runtime;
  int64_t expires_ms = 0;  // 0: no expiry
  // [scope] mode = "on": only these principals (empty: everyone). Selectors
  // as proxy/policy/principals.h has them, "box" expanded by the policy.
  std::vector<std::string> principals;
};

// What is judged: always the destination (CONNECT target or dialled
// address), never a Host header.
struct Target {
  std::string_view host;  // normalized
  uint16_t port = 0;
  Kind kind = Kind::connect;
  bool build = false;  // the connection proved a build secret
  // Who asked, for grants scoped to principals. Null is an asker whose
  // state is unknown (nothing attributed): a scoped grant applies to it.
  const Asker* asker = nullptr;
};

inline constexpr int64_t kOnceGrantMs = 120 * 1000;
inline constexpr int64_t kMaxLearnWindowMs = 8 * 3600 * 1000;

class Policy {
 public:
  static Result<std::shared_ptr<const Policy>> load_file(const std::string& path, int64_t now_ms);
  static Result<std::shared_ptr<const Policy>> parse(std::string_view text,
                                                     const std::string& path, int64_t now_ms);
  // The fail-closed policy, remembering why.
  static std::shared_ptr<const Policy> closed(std::string reason);
  // A learn-mode policy for a first start with no policy file.
  static std::string default_text(int64_t now_ms, int64_t window_ms);

  // `implicit`: also admit what injection needs (an injector host over HTTPS
  // :443; a held or overlap host's CONNECT :443) without a grant.
  Verdict judge(const Target& t, int64_t now_ms, bool implicit = true) const;
  // Whether the allowlist refuses what it does not grant (false while
  // observing or inside a learn window).
  bool enforcing(int64_t now_ms) const;
  // Whether a CONNECT to `dest` whose ClientHello names `sni` ("" when none)
  // is tunnelled undecrypted. An SNI that disagrees with the destination is
  // always decrypted.
  bool tunnel(std::string_view dest, std::string_view sni, bool build) const;

  // Credential injection, held dummies and overlaps (issue 3).
  const inject::Rules& rules() const { return rules_; }

  // attribution = "require": connections without a valid forwarder stamp
  // are refused (when the proxy has a stamp key). Default "record".
  bool require_attribution() const { return require_attribution_; }

  // [scope] mode = "on" (docs/fy-proxy.md, "Scope"): credentials go only to
  // the principals their rule (or [scope] credentials) names, and grants
  // with principals only to those. Where nothing is attributed (an asker
  // whose state is unknown: no stamp key) nothing is scoped.
  bool scoping() const { return scoping_; }
  // Whether the selectors name the asker ("box" expanded).
  bool names(std::span<const std::string> selectors, const Asker& a) const;
  // Whether `rule`'s credential may be written onto this asker's request.
  bool may_inject(const inject::Rule& rule, const Asker& a) const;
  // The rule's principals ("box" not expanded): its own, or [scope] credentials.
  std::span<const std::string> principals_of(const inject::Rule& rule) const;
  // "off", or "on: credentials to box (box = user) · 1 scoped grant" for the
  // start line and /healthz.
  std::string scope_summary() const;

  Mode mode() const { return mode_; }
  int64_t learn_until_ms() const { return learn_until_ms_; }
  int64_t observing_since_ms() const { return observing_since_ms_; }
  bool failed_closed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  size_t grant_count() const { return grants_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The next instant judging changes by itself (a learn window closing, a
  // timed grant expiring), or 0 when none is pending.
  int64_t next_change_ms(int64_t now_ms) const;
  // "enforce · 3 grants · 2 passthrough entries" for the reload log line.
  std::string summary(int64_t now_ms) const;

 private:
  static Result<std::shared_ptr<const Policy>> from_doc(cfg::Doc& doc, int64_t now_ms);
  struct TimedGrant {
    Grant grant;
    PatternSet set;  // the grant's one pattern, for covers()
  };

  Mode mode_ = Mode::enforce;
  int64_t learn_until_ms_ = 0;
  int64_t observing_since_ms_ = 0;
  PatternSet allow_;
  PatternSet build_allow_;
  std::vector<TimedGrant> timed_;  // grants with an expiry, checked in order
  PatternSet passthrough_;
  inject::Rules rules_;
  bool require_attribution_ = false;
  bool scoping_ = false;
  std::vector<std::string> scope_box_{"user"};
  std::vector<std::string> scope_credentials_{"box"};
  size_t scoped_grants_ = 0;
  size_t grants_ = 0;
  std::string failure_;
  std::vector<std::string> warnings_;
};

}  // namespace fy::policy
