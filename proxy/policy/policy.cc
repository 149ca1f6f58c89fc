#include "proxy/policy/policy.h"

#include <fmt/format.h>

#include "core/clock.h"
#include "core/config.h"
#include "proxy/policy/bundles.h"

namespace fy::policy {

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::enforce: return "enforce";
    case Mode::observe: return "observe";
    case Mode::learn: return "learn";
  }
  return "?";
}

std::shared_ptr<const Policy> Policy::closed(std::string reason) {
  auto p = std::make_shared<Policy>();
  p->mode_ = Mode::enforce;
  p->failure_ = std::move(reason);
  return p;
}

std::string Policy::default_text(int64_t now_ms, int64_t window_ms) {
  return fmt::format(
      "# fy-proxy policy, written on first start (docs/fy-proxy.md, \"Policy\").\n"
      "# Learn mode: observe (log would_block rows, refuse nothing) until learn_until,\n"
      "# then enforce by itself. Grant hosts with allow = [...] or [[grant]] tables.\n"
      "mode = \"learn\"\n"
      "learn_until = {}\n"
      "observing_since = {}\n"
      "allow = []\n"
      "passthrough = []\n",
      iso8601_utc(now_ms + window_ms, false, true), iso8601_utc(now_ms, false, true));
}

Result<std::shared_ptr<const Policy>> Policy::load_file(const std::string& path, int64_t now_ms) {
  auto doc = cfg::Doc::load_file(path);
  if (!doc) return std::move(doc).take_error();
  return from_doc(*doc, now_ms);
}

Result<std::shared_ptr<const Policy>> Policy::parse(std::string_view text,
                                                    const std::string& path, int64_t now_ms) {
  auto doc = cfg::Doc::parse(text, path);
  if (!doc) return std::move(doc).take_error();
  return from_doc(*doc, now_ms);
}

Result<std::shared_ptr<const Policy>> Policy::from_doc(cfg::Doc& doc, int64_t now_ms) {
  auto p = std::make_shared<Policy>();
  cfg::Table root = doc.root();

  if (auto m = root.string("mode")) {
    if (*m == "enforce") p->mode_ = Mode::enforce;
    else if (*m == "observe") p->mode_ = Mode::observe;
    else if (*m == "learn") p->mode_ = Mode::learn;
    else root.error("mode", fmt::format("'{}' is not a mode: use \"enforce\", \"observe\" or "
                                        "\"learn\"", *m));
  }
  auto until = root.timestamp_ms("learn_until");
  if (p->mode_ == Mode::learn) {
    if (!until) {
      if (!root.has("learn_until"))
        root.error("mode", "learn mode needs learn_until, the instant it starts enforcing "
                           "(at most 8 h ahead), e.g. learn_until = 2026-11-29T22:30:00Z");
    } else if (*until - now_ms > kMaxLearnWindowMs) {
      root.error("learn_until", fmt::format("the learn window ends {} h from now; it may last "
                                            "at most 8 h",
                                            (*until - now_ms) / 3600000));
    } else {
      p->learn_until_ms_ = *until;
    }
  }
  if (auto since = root.timestamp_ms("observing_since")) p->observing_since_ms_ = *since;
  if (auto a = root.string("attribution")) {
    if (*a == "require") p->require_attribution_ = true;
    else if (*a != "record")
      root.error("attribution", fmt::format("'{}' is not an attribution policy: use \"record\" "
                                            "(unattributed connections are logged) or \"require\" "
                                            "(they are refused)", *a));
  }

  if (auto sc = root.table("scope")) {
    if (auto m = sc->string("mode")) {
      if (*m == "on") p->scoping_ = true;
      else if (*m != "off")
        sc->error("mode", fmt::format("'{}' is not a scope mode: use \"off\" (every principal "
                                      "gets every credential and grant, as before) or \"on\"",
                                      *m));
    }
    auto selectors = [&](const char* key, std::vector<std::string>* out, bool box_ok) {
      auto list = sc->strings(key);
      if (!list) return;
      if (list->empty()) {
        sc->error(key, "an empty list names nobody; leave it out for the default");
        return;
      }
      for (const std::string& sel : *list) {
        if (auto err = selector_error(sel)) sc->error(key, *err);
        else if (!box_ok && sel == "box") sc->error(key, "box cannot name itself");
      }
      *out = *list;
    };
    selectors("box", &p->scope_box_, false);
    selectors("credentials", &p->scope_credentials_, true);
    sc->finish();
  }

  auto add_list = [&](const char* key, PatternSet* set) {
    if (auto list = root.strings(key)) {
      for (const std::string& s : *list) {
        auto pat = parse_pattern(s, /*allow_port=*/true);
        if (!pat) {
          root.error(key, pat.error().message);
          continue;
        }
        set->add(*pat);
        ++p->grants_;
      }
    }
  };
  add_list("allow", &p->allow_);
  add_list("build_allow", &p->build_allow_);

  for (cfg::Table g : root.tables("grant")) {
    auto host = g.string("host");
    if (!host) {
      if (!g.has("host")) g.error("", "a grant needs host = \"<pattern>\"");
      g.finish();
      continue;
    }
    auto pat = parse_pattern(*host, true);
    if (!pat) {
      g.error("host", pat.error().message);
      g.finish();
      continue;
    }
    Grant gr;
    gr.pattern = *pat;
    if (auto lv = g.string("level")) {
      if (*lv == "once") gr.level = Level::once;
      else if (*lv == "session") gr.level = Level::session;
      else if (*lv == "permanent") gr.level = Level::permanent;
      else g.error("level", fmt::format("'{}' is not a level: use \"once\", \"session\" or "
                                        "\"permanent\"", *lv));
    }
    if (auto sc = g.string("scope")) {
      if (*sc == "runtime") gr.scope = Scope::runtime;
      else if (*sc == "build") gr.scope = Scope::build;
      else g.error("scope", fmt::format("'{}' is not a scope: use \"runtime\" or \"build\"", *sc));
    }
    auto expires = g.timestamp_ms("expires");
    auto granted = g.timestamp_ms("granted");
    (void)g.string("why");  // the operator's note; not used by the proxy
    if (auto ps = g.strings("principals")) {
      if (ps->empty()) g.error("principals", "an empty list names nobody: leave it out for "
                                             "everyone, or drop the grant");
      for (const std::string& sel : *ps)
        if (auto err = selector_error(sel)) g.error("principals", *err);
      gr.principals = *ps;
    }
    if (expires) {
      gr.expires_ms = *expires;
    } else if (gr.level == Level::once) {
      if (granted) {
        gr.expires_ms = *granted + kOnceGrantMs;
      } else if (!g.has("expires") && !g.has("granted")) {
        g.error("level", "a once grant needs expires (or granted, for the default 120 s)");
      }
    }
    g.finish();
    ++p->grants_;
    if (!gr.principals.empty()) {
      if (p->scoping_) {
        ++p->scoped_grants_;
      } else {
        p->warnings_.push_back(fmt::format("{}: principals are not applied: [scope] mode is "
                                           "\"off\", so this grant is everyone's",
                                           g.where("principals")));
        gr.principals.clear();
      }
    }
    if (gr.expires_ms != 0 || !gr.principals.empty()) {
      TimedGrant tg{std::move(gr), {}};
      tg.set.add(tg.grant.pattern);
      p->timed_.push_back(std::move(tg));
    } else {
      (gr.scope == Scope::build ? p->build_allow_ : p->allow_).add(gr.pattern);
    }
  }

  if (auto list = root.strings("passthrough")) {
    for (const std::string& s : *list) {
      if (!s.empty() && s[0] == '@') {
        const auto& hosts = bundle_hosts(std::string_view(s).substr(1));
        if (hosts.empty()) {
          // The reference's rule: an unknown bundle adds nothing. Say so.
          p->warnings_.push_back(fmt::format("{}: passthrough: unknown bundle '{}' adds no "
                                             "hosts (known: @{})",
                                             root.where("passthrough"), s,
                                             fmt::join(bundle_names(), ", @")));
        }
        for (std::string_view h : hosts) p->passthrough_.add(*parse_pattern(h, false));
        continue;
      }
      auto pat = parse_pattern(s, /*allow_port=*/false);
      if (!pat) {
        root.error("passthrough", pat.error().message);
        continue;
      }
      p->passthrough_.add(*pat);
    }
  }
  inject::parse_rules(root, &p->rules_);
  if (!p->scoping_) {
    for (const inject::Rule& r : p->rules_.inject)
      if (!r.principals.empty())
        p->warnings_.push_back(fmt::format("{}: switch '{}': principals are not applied: [scope] "
                                           "mode is \"off\", so its credential goes to every "
                                           "principal",
                                           r.where, r.id));
  }
  root.finish();
  FY_TRY(doc.result());
  return std::shared_ptr<const Policy>(std::move(p));
}

bool Policy::enforcing(int64_t now_ms) const {
  switch (mode_) {
    case Mode::enforce: return true;
    case Mode::observe: return false;
    case Mode::learn: return now_ms >= learn_until_ms_;
  }
  return true;
}

Verdict Policy::judge(const Target& t, int64_t now_ms, bool implicit) const {
  bool granted = allow_.covers(t.host, t.port, t.kind) ||
                 (t.build && build_allow_.covers(t.host, t.port, t.kind));
  if (!granted) {
    for (const TimedGrant& tg : timed_) {
      const Grant& g = tg.grant;
      if (g.expires_ms != 0 && g.expires_ms <= now_ms) continue;
      if (g.scope == Scope::build && !t.build) continue;
      if (!g.principals.empty() && t.asker && t.asker->state != Asker::State::unknown &&
          !names(g.principals, *t.asker))
        continue;
      if (tg.set.covers(t.host, t.port, t.kind)) {
        granted = true;
        break;
      }
    }
  }
  if (!granted && implicit && t.port == 443) {
    // Implicit allows: an injector host over HTTPS :443 (never cleartext); a
    // held or overlap host's CONNECT :443, so the proxy can answer inside.
    if (t.kind != Kind::cleartext && rules_.is_injector_host(t.host)) granted = true;
    if (t.kind == Kind::connect && rules_.is_answer_host(t.host)) granted = true;
  }
  if (granted) return Verdict::allow;
  return enforcing(now_ms) ? Verdict::block : Verdict::would_block;
}

bool Policy::names(std::span<const std::string> selectors, const Asker& a) const {
  for (const std::string& sel : selectors) {
    if (sel == "box") {
      for (const std::string& b : scope_box_)
        if (selector_names(b, a)) return true;
    } else if (selector_names(sel, a)) {
      return true;
    }
  }
  return false;
}

std::span<const std::string> Policy::principals_of(const inject::Rule& rule) const {
  return rule.principals.empty() ? std::span<const std::string>(scope_credentials_)
                                 : std::span<const std::string>(rule.principals);
}

bool Policy::may_inject(const inject::Rule& rule, const Asker& a) const {
  if (!scoping_ || a.state == Asker::State::unknown) return true;
  return names(principals_of(rule), a);
}

std::string Policy::scope_summary() const {
  if (!scoping_) return "off";
  return fmt::format("on: credentials to {} (box = {}) · {} scoped grant{}",
                     fmt::join(scope_credentials_, ", "), fmt::join(scope_box_, ", "),
                     scoped_grants_, scoped_grants_ == 1 ? "" : "s");
}

bool Policy::tunnel(std::string_view dest, std::string_view sni, bool build) const {
  if (!sni.empty() && sni != dest) return false;
  // Hosts the proxy acts on are always decrypted, whatever passthrough says.
  for (std::string_view h : {dest, sni}) {
    if (!h.empty() && (rules_.is_injector_host(h) || rules_.is_answer_host(h))) return false;
  }
  if (build) return true;  // builds are tunnelled (and still walled)
  return passthrough_.names_host(dest);
}

int64_t Policy::next_change_ms(int64_t now_ms) const {
  int64_t next = 0;
  auto consider = [&](int64_t t) {
    if (t > now_ms && (next == 0 || t < next)) next = t;
  };
  if (mode_ == Mode::learn) consider(learn_until_ms_);
  for (const TimedGrant& tg : timed_) consider(tg.grant.expires_ms);
  return next;
}

std::string Policy::summary(int64_t now_ms) const {
  std::string mode = mode_name(mode_);
  if (mode_ == Mode::learn) {
    mode = enforcing(now_ms) ? "learn window over: enforcing"
                             : fmt::format("learn: observing until {}",
                                           iso8601_utc(learn_until_ms_, false, true));
  }
  std::string inj;
  for (const auto& r : rules_.inject) inj += (inj.empty() ? "" : ", ") + r.host;
  return fmt::format("allowlist {} · {} grants · {} passthrough entries · injecting {}", mode,
                     grants_, passthrough_.size(), inj.empty() ? "nothing" : inj);
}

}  // namespace fy::policy
