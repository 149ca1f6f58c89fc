#include "proxy/policy/admission.h"

#include "core/text.h"
#include "proxy/http/answers.h"
#include "proxy/inject/redact.h"

namespace fy::admission {

namespace {

using policy::Kind;
using policy::Verdict;

Decision answer(Decision d, Answer a, bool close_after, std::string detail = {}) {
  d.action = Action::answer;
  d.answer = a;
  d.close_after = close_after;
  d.detail = std::move(detail);
  return d;
}

Decision closing(Why why) {
  Decision d;
  d.action = Action::close;
  d.why = why;
  return d;
}

// Step 4: the wall, the build proof and the 407 rule. `challenge_allowed`:
// the 407 applies (no Proxy-Authorization came; never inside a tunnel).
// `connect`: a refused CONNECT closes (no dial, no TLS); the 407 to a
// CONNECT keeps the connection for the retry that carries the secret.
Decision wall(Decision d, const Request& r, const policy::Policy& pol, bool connect) {
  policy::Asker asker = asker_of(r.principal, r.build.proved);
  auto verdict = pol.judge({d.dest.host, d.dest.port, d.kind, r.build.proved, &asker}, r.now_ms);
  if (verdict == Verdict::block) {
    if (!r.inside && !r.build.proxy_auth_seen &&
        pol.judge({d.dest.host, d.dest.port, d.kind, true, &asker}, r.now_ms) == Verdict::allow) {
      d.action = Action::challenge;
      d.close_after = !connect && !r.message_complete;
      return d;
    }
    return answer(std::move(d), Answer::allowlist, connect || !r.message_complete);
  }
  d.would_block = verdict == Verdict::would_block;
  d.action = connect ? Action::establish : Action::forward;
  if (connect) {
    // Step 5: admitted only so the proxy can act (inject, answer a held
    // dummy or an overlap)? Then only HTTPS it decrypts may pass.
    d.implicit_only =
        verdict == Verdict::allow &&
        pol.judge({d.dest.host, d.dest.port, Kind::connect, r.build.proved, &asker}, r.now_ms,
                  /*implicit=*/false) != Verdict::allow;
    d.inner_kind = d.dest.port == 80 ? Kind::cleartext : Kind::https;
  }
  return d;
}

Decision decide_connect(const Request& r, const policy::Policy& pol) {
  Decision d;
  // Step 1: CONNECT host:port, the port required.
  auto hp = parse_authority(r.target, 0);
  if (!hp) return answer(std::move(d), Answer::bad_connect, true, hp.error().message);
  d.has_dest = true;
  d.dest = *hp;
  d.kind = Kind::connect;
  d.key = hp->key(443);
  // Step 2: a CONNECT's Host, when sent, names the same authority.
  if (r.host) {
    auto hh = parse_authority(*r.host, hp->port);
    if (!hh || *hh != *hp) return answer(std::move(d), Answer::claim, true);
  }
  // Step 3 does not apply: nothing is decrypted yet.
  return wall(std::move(d), r, pol, /*connect=*/true);
}

// Step 7's refusal body: the rule's own, a held entry's for the same host and
// path (what the provider answers a dummy with), else foldyard's own JSON.
std::string scoped_body(const inject::Rule& rule, const policy::Policy& pol, std::string_view host,
                        std::string_view path, const policy::Asker& asker) {
  if (!rule.refused_body.empty()) return rule.refused_body;
  if (const inject::Held* h = pol.rules().held_for(host, path); h && !h->body.empty())
    return h->body;
  return answers::scoped_json(host, rule.id, policy::asker_text(asker));
}

}  // namespace

policy::Asker asker_of(const Principal& p, bool build_proved) {
  policy::Asker a;
  a.build = build_proved;
  switch (p.attribution) {
    case netlog::Attribution::none: a.state = policy::Asker::State::unknown; break;
    case netlog::Attribution::unattributed: a.state = policy::Asker::State::unattributed; break;
    case netlog::Attribution::attributed: a.state = policy::Asker::State::attributed; break;
  }
  a.src = p.src;
  a.net = p.net;
  a.who = p.who;
  return a;
}

const char* why_text(Why w) {
  switch (w) {
    case Why::none: return "";
    case Why::malformed_hello: return "malformed ClientHello";
    case Why::implicit_only_not_tls: return "not TLS to a host admitted only for decryption";
    case Why::require_stamp:
      return "the policy now requires a forwarder stamp and this connection has none";
    case Why::refused_now: return "the policy now refuses its destination";
    case Why::left_passthrough: return "its host left passthrough: it would now be decrypted";
  }
  return "";
}

bool split_absolute(std::string_view target, std::string_view* scheme,
                    std::string_view* authority, std::string_view* path) {
  size_t sep = target.find("://");
  if (sep == std::string_view::npos) return false;
  *scheme = target.substr(0, sep);
  std::string_view rest = target.substr(sep + 3);
  size_t slash = rest.find_first_of("/?");
  *authority = rest.substr(0, slash);
  *path = slash == std::string_view::npos ? std::string_view("/") : rest.substr(slash);
  return !authority->empty() && authority->find('@') == std::string_view::npos;
}

bool refuses_principal(const Principal& p, const policy::Policy& pol) {
  return p.attribution == netlog::Attribution::unattributed && pol.require_attribution();
}

Decision decide_request(const Request& r, const policy::Policy& pol) {
  // Step 0: who asked.
  if (refuses_principal(r.principal, pol)) return answer({}, Answer::unattributed, true);
  if (!r.inside && r.method == "CONNECT") return decide_connect(r, pol);

  // Step 1: the destination is the CONNECT target for requests inside a
  // tunnel, the absolute-form URL's authority otherwise. Never the Host.
  Decision d;
  HostPort dest;
  Kind kind;
  std::string_view target = r.target;
  std::string_view path = target;
  if (r.inside) {
    dest = r.inside->dest;
    kind = r.inside->kind;
    std::string_view scheme, authority;
    if (split_absolute(target, &scheme, &authority, &path)) {
      // Step 2 for a URL inside a tunnel: it must name the CONNECT target.
      auto hp = parse_authority(authority, policy::default_port(kind));
      if (!hp || *hp != dest) {
        d.key = dest.key(policy::default_port(kind));
        return answer(std::move(d), Answer::claim, !r.message_complete);
      }
    } else if (target.empty() || (target[0] != '/' && target != "*")) {
      return answer(std::move(d), Answer::bad_head, true, "the request target is not a path");
    }
  } else {
    std::string_view scheme, authority;
    if (!split_absolute(target, &scheme, &authority, &path))
      return answer(std::move(d), Answer::origin_form, true);
    if (iequals(scheme, "http")) {
      kind = Kind::cleartext;
    } else if (iequals(scheme, "https")) {
      kind = Kind::https;
    } else {
      return answer(std::move(d), Answer::bad_scheme, true, std::string(scheme));
    }
    auto hp = parse_authority(authority, policy::default_port(kind));
    if (!hp) return answer(std::move(d), Answer::bad_authority, true, hp.error().message);
    dest = std::move(*hp);
  }
  d.has_dest = true;
  d.dest = dest;
  d.kind = kind;
  d.key = dest.key(policy::default_port(kind));
  d.path = path;

  // Step 2: a Host header must name the destination.
  if (r.host) {
    auto hp = parse_authority(*r.host, policy::default_port(kind));
    if (!hp || hp->host != dest.host || hp->port != dest.port)
      return answer(std::move(d), Answer::claim, !r.message_complete);
  } else if (r.http_minor >= 1) {
    return answer(std::move(d), Answer::bad_head, true, "an HTTP/1.1 request needs a Host header");
  }

  // Step 3: an overlap (502) and a held dummy (401) come before the wall:
  // the proxy answers them itself, for HTTPS it decrypted. Step 7's rule is
  // found here because an active rule wins over a held dummy; a credential
  // is injected only when the destination, the Host and the SNI agree.
  const inject::Rule* rule = nullptr;
  if (r.inside && kind == Kind::https) {
    const inject::Rules& rules = pol.rules();
    if (const inject::Overlap* ov = rules.overlap_for(dest.host, path)) {
      d.overlap = ov;
      return answer(std::move(d), Answer::overlap, !r.message_complete);
    }
    if (dest.port == 443 && r.inside->sni == dest.host) rule = rules.rule_for(dest.host, path);
    if (!rule) {
      if (const inject::Held* held = rules.held_for(dest.host, path);
          held && holds_dummy(*held, path, r.headers)) {
        d.held = held;
        return answer(std::move(d), Answer::held, !r.message_complete);
      }
    }
  }

  // Step 4, then the rule rides on the forward, if it is for who asked.
  d = wall(std::move(d), r, pol, /*connect=*/false);
  if (d.action == Action::forward && rule) {
    policy::Asker asker = asker_of(r.principal, r.build.proved);
    d.rule = rule;
    if (!pol.may_inject(*rule, asker)) {
      std::string body = scoped_body(*rule, pol, dest.host, path, asker);
      return answer(std::move(d), Answer::scoped, !r.message_complete, std::move(body));
    }
  }
  return d;
}

Decision decide_unruled(const HostPort& dest, policy::Kind kind, const Principal& principal,
                        const BuildProof& build, bool message_complete, int64_t now_ms,
                        const policy::Policy& pol) {
  policy::Asker asker = asker_of(principal, build.proved);
  Decision d;
  d.has_dest = true;
  d.dest = dest;
  d.kind = kind;
  d.key = dest.key(policy::default_port(kind));
  if (pol.judge({dest.host, dest.port, kind, build.proved, &asker}, now_ms) == Verdict::block)
    return answer(std::move(d), Answer::allowlist, !message_complete);
  d.action = Action::forward;
  return d;
}

Decision decide_minted(const inject::Rule& rule, const HostPort& dest, std::string_view path,
                       const Principal& principal, const BuildProof& build,
                       bool message_complete, const policy::Policy& pol) {
  Decision d;
  d.has_dest = true;
  d.dest = dest;
  d.kind = Kind::https;
  d.key = dest.key(443);
  d.path = path;
  d.rule = &rule;
  policy::Asker asker = asker_of(principal, build.proved);
  if (!pol.may_inject(rule, asker))
    return answer(std::move(d), Answer::scoped, !message_complete,
                  scoped_body(rule, pol, dest.host, path, asker));
  d.action = Action::forward;
  return d;
}

Decision decide_hello(const Hello& h, const policy::Policy& pol) {
  Decision d;
  switch (h.shape) {
    case Hello::Shape::malformed: return closing(Why::malformed_hello);
    case Hello::Shape::http:
      // Cleartext HTTP inside the tunnel: served like any request, judged on
      // the CONNECT target.
      d.action = Action::serve_plain;
      d.inner_kind = Kind::cleartext;
      return d;
    case Hello::Shape::other:
    case Hello::Shape::silence:
      // Step 5. (A silent CONNECT is probed only off :443, and implicit
      // admission is only ever for :443, so silence never meets
      // implicit_only; it is refused here all the same, failing closed.)
      if (h.implicit_only) return closing(Why::implicit_only_not_tls);
      d.action = Action::tunnel;
      d.tunnel = TunnelKind::opaque;
      return d;
    case Hello::Shape::tls: break;
  }
  // Step 6. A server name that is present but not a host name disagrees
  // with every destination: decrypted, never tunnelled.
  std::string_view sni_seen = h.sni;
  if (!h.sni_present) sni_seen = "";
  else if (h.sni.empty()) sni_seen = "\x01";
  if (pol.tunnel(h.dest->host, sni_seen, h.build.marker)) {
    d.action = Action::tunnel;
    d.tunnel = TunnelKind::passthrough;
  } else {
    d.action = Action::decrypt;
    d.inner_kind = Kind::https;
  }
  return d;
}

Decision decide_open(const Open& o, const policy::Policy& pol) {
  Decision keep;
  keep.action = Action::keep;
  if (refuses_principal(o.principal, pol)) return closing(Why::require_stamp);
  policy::Asker asker = asker_of(o.principal, o.build.proved);
  auto blocked = [&](const HostPort& d, Kind k) {
    return pol.judge({d.host, d.port, k, o.build.proved, &asker}, o.now_ms) == Verdict::block;
  };
  if (o.inside) {
    if (blocked(o.inside->dest, Kind::connect)) return closing(Why::refused_now);
    if (o.tunnel && o.passthrough && !pol.tunnel(o.inside->dest.host, o.inside->sni, o.build.marker))
      return closing(Why::left_passthrough);
    return keep;
  }
  if (!o.origin && !o.tunnel) return keep;
  if (o.tunnel || o.exchange) {
    if (blocked(o.exchange_dest, o.exchange_kind)) return closing(Why::refused_now);
    return keep;
  }
  // Idle: the next request is judged anyway; only the origin connection goes.
  if (blocked(*o.origin, o.origin_tls ? Kind::https : Kind::cleartext)) {
    Decision d;
    d.action = Action::retire_origin;
    return d;
  }
  return keep;
}

bool holds_dummy(const inject::Held& held, std::string_view target,
                 std::span<const http::Header> headers) {
  auto is_dummy = [&](std::string_view v) {
    v = trim_ows(v);
    if (v == held.dummy) return true;
    if (!held.any_scheme) return false;
    size_t sp = v.find(' ');
    if (sp == std::string_view::npos) return false;
    std::string_view scheme = v.substr(0, sp);
    for (char ch : scheme)
      if (ch == ' ' || ch == '\t') return false;
    return trim_ows(v.substr(sp + 1)) == held.dummy;
  };
  if (!held.query_param.empty()) {
    size_t q = target.find('?');
    if (q == std::string_view::npos) return false;
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      size_t amp = query.find('&');
      std::string_view kv = query.substr(0, amp);
      size_t eq = kv.find('=');
      if (eq != std::string_view::npos &&
          inject::percent_decode(kv.substr(0, eq)) == held.query_param &&
          inject::percent_decode(kv.substr(eq + 1)) == held.dummy)
        return true;
      if (amp == std::string_view::npos) break;
      query.remove_prefix(amp + 1);
    }
    return false;
  }
  for (const http::Header& h : headers)
    if (iequals(h.name, held.header) && is_dummy(h.value)) return true;
  return false;
}

}  // namespace fy::admission
