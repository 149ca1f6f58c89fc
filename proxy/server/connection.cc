#include "proxy/server/connection.h"

#include <openssl/ssl.h>

#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/loop.h"
#include "core/text.h"
#include "core/json.h"
#include "proxy/http/answers.h"
#include "proxy/http/rewrite.h"
#include "proxy/netlog/error_kind.h"
#include "proxy/inject/build_tokens.h"
#include "proxy/policy/admission.h"
#include "proxy/policy/stamp_binding.h"
#include "proxy/server/client_http1.h"
#include "proxy/server/origin_pool.h"
#include "proxy/server/server.h"
#include "proxy/tls/client_hello.h"

namespace fy::proxy {

namespace {

bool looks_like_http(std::string_view s) {
  // An upper-case token followed by a space: "GET ", "POST ".
  size_t i = 0;
  while (i < s.size() && i < 16 && s[i] >= 'A' && s[i] <= 'Z') ++i;
  return i > 0 && i < s.size() && s[i] == ' ';
}

log::RateLimit g_upstream_log(20, 10'000);
log::RateLimit g_setup_timeout_log(20, 10'000);

}  // namespace

Connection::Connection(Server& srv, uint64_t id)
    : srv_(srv),
      id_(id),
      client_(srv.loop(), this),
      dialer_(srv.loop(), &srv.origin_pool(), *this, *this),
      codec_(std::make_unique<Http1ClientCodec>(req_limits())),
      resp_reader_(resp_limits()),
      resp_parser_(HTTP_RESPONSE, resp_limits()) {
  uv_timer_init(srv.loop(), &timer_);
  timer_.data = this;
  resp_parser_.on_body = [this](std::string_view b) { ex_.body_bytes(b); };
}

const http::Limits& Connection::req_limits() const { return srv_.http_limits(); }
const http::Limits& Connection::resp_limits() const { return srv_.response_limits(); }

Connection::~Connection() = default;

bool Connection::accept(uv_stream_t* listener) {
  accepted_ = true;
  accepted_ms_ = last_io_ms_ = uv_now(srv_.loop());
  if (client_.accept_from(listener) != 0) {
    close("accept failed");
    return false;
  }
  peer_ = client_.peer_address();
  client_.start_reading();
  arm_timer();
  return true;
}

// ---------------------------------------------------------------------------
// Stream callbacks

void Connection::on_read(Stream& s, const ChunkRef& c, const char* p, size_t n) {
  touch();
  if (&s == &client_) {
    srv_.metrics().bytes_up += n;
    on_client_bytes(c, p, n);
  } else {
    srv_.metrics().bytes_down += n;
    on_origin_bytes(c, p, n);
  }
}

void Connection::on_eof(Stream& s) {
  touch();
  log::debug("{} eof from {} (mode {})", log::ConnId{id_}, &s == &client_ ? "client" : "origin", static_cast<int>(mode_));
  if (&s == &client_) {
    client_eof_ = true;
    switch (mode_) {
      case Mode::tunnel:
        tunnel_.client_eof(origin_out());
        finish_tunnel_if_done();
        return;
      case Mode::lingering: close("client closed"); return;
      case Mode::hello:
      case Mode::handshake: close("client closed before the tunnel was set up"); return;
      case Mode::http: {
        // A half-closed client still reads its answers: the exchange in
        // flight and every pipelined request already received are served;
        // the connection closes when nothing is left (on_response_complete).
        bool request_whole =
            req_ == Req::done || (req_ == Req::wait && codec_->request_complete());
        if (ex_.active() && !request_whole && !ex_.response_started) {
          ex_.set_error("closed: the client closed the connection mid-request");
          write_exchange_row();
          close("client closed mid-request");
          return;
        }
        if (ex_.active() || codec_->pipelined() || codec_->replay_pending() ||
            codec_->replay_blocked())
          return;
        close("client closed");
        return;
      }
    }
    return;
  }
  // The origin.
  origin_eof_ = true;
  if (mode_ == Mode::tunnel) {
    tunnel_.origin_eof(client_);
    finish_tunnel_if_done();
    return;
  }
  if (ex_.active() && resp_ == Resp::body && resp_parser_.body_until_eof()) {
    resp_parser_.finish();
    ex_.origin_reuse = false;
    ex_.close_after = true;  // the client reads this body until the connection closes
    on_response_complete();
    return;
  }
  if (ex_.active() && (resp_ == Resp::head || resp_ == Resp::body)) {
    if (resp_ == Resp::head && retry_on_fresh_origin()) return;
    origin_failed(Errc::closed, resp_ == Resp::head
                                    ? "the origin closed the connection before responding"
                                    : "the origin closed the connection mid-response");
    return;
  }
  retire_origin();  // an idle kept-alive origin went away
}

void Connection::on_error(Stream& s, Errc kind, const std::string& detail) {
  if (&s == &client_) {
    if (mode_ == Mode::handshake) {
      ++srv_.metrics().tls_client_handshake_failures;
      log::debug("{} TLS handshake with the client failed: {}", log::ConnId{id_}, detail);
    }
    if (ex_.active() && mode_ == Mode::http) {
      ex_.set_error(std::string(netlog::kClientPrefix) +
                    netlog::error_text(netlog::error_kind_of(kind), detail));
      write_exchange_row();
    }
    close("client error");
    return;
  }
  // The connected origin (a dialled one's errors are the dialer's until it
  // is handed over: on_dial_failed).
  origin_failed(kind, detail);
}

void Connection::on_ready(Stream& s) {
  if (&s == &client_) {
    // TLS with the client is up: serve the decrypted requests.
    ++srv_.metrics().tls_client_handshakes;
    mode_ = Mode::http;
    req_ = Req::head;
    arm_timer();
    return;
  }
  // The origin's on_ready comes to the dialer (on_dialed).
}

// The descriptors beyond one a client are kept for origins and the proxy's
// own files: a dial that would eat into the reserve is refused (the dialer
// reports it as out_of_files) before anything else runs short.
bool Connection::descriptor_spare() { return !srv_.descriptors_short(); }

void Connection::on_dialed(Stream& s) {
  origin_ = &s;
  touch();  // an exchange's silence clock starts at the connect
  if (origin_tls_) ++srv_.metrics().tls_origin_handshakes;
  if (mode_ == Mode::tunnel) origin_ready_ms_ = uv_now(srv_.loop());
  if (mode_ == Mode::tunnel && tunnel_.origin_connected(*origin_)) resume_client(kPeerFull);
  arm_timer();
}

void Connection::on_drain(Stream& s) {
  if (&s == &client_) {
    resume_origin(kPeerFull);
    if (codec_->client_drained()) arm_timer();
  } else {
    resume_client(kPeerFull);
  }
}

void Connection::on_shutdown(Stream& s) {
  log::debug("{} shutdown done on {}", log::ConnId{id_}, &s == &client_ ? "client" : "origin");
  if (&s == &client_ && mode_ == Mode::lingering && client_eof_) {
    close("answered");
    return;
  }
  if (mode_ == Mode::tunnel) finish_tunnel_if_done();
}

void Connection::on_closed(Stream&) {
  // Only the client stream reports here; origins close and free themselves.
  maybe_release();
}

// ---------------------------------------------------------------------------
// Client side

void Connection::on_client_bytes(const ChunkRef& c, const char* p, size_t n) {
  switch (mode_) {
    case Mode::lingering: return;  // discarded
    case Mode::tunnel:
      // Still connecting: kept by the tunnel until on_dialed.
      if (tunnel_.from_client(origin_, dialer_.dialling(), c, p, n)) pause_client(kPeerFull);
      return;
    case Mode::hello: on_hello_bytes(p, n); return;
    case Mode::handshake: return;  // TLS delivers nothing before on_ready
    case Mode::http: process_client(c, p, n); return;
  }
}

void Connection::process_client(const ChunkRef& c, const char* p, size_t n) {
  while (n > 0 && mode_ == Mode::http && !closing_) {
    if (req_ == Req::done || req_ == Req::wait) {
      // Pipelined bytes wait until the response is complete; a body waits
      // until its head (held for a credential) has gone out.
      if (codec_->stash(c, p, n)) pause_client(kStashFull);
      return;
    }
    if (req_ == Req::head) {
      if (head_start_ms_ == 0) {
        head_start_ms_ = uv_now(srv_.loop());
        arm_timer();
      }
      // The head is in place (`c` holds it for this call) or in the codec.
      ClientCodec::HeadRead r = codec_->read_head(std::string_view(p, n));
      if (r.status == ClientCodec::HeadRead::Status::error) {
        begin_row("");
        bind_first_head(std::string_view(), nullptr);
        answer_parse_error(r.error);
        return;
      }
      if (r.status == ClientCodec::HeadRead::Status::need_more) return;
      p += r.used;
      n -= r.used;
      head_start_ms_ = 0;
      on_request_head(r.head);
      continue;
    }
    // Req::body
    ClientCodec::BodyRead b = codec_->read_body(p, n);
    if (!b.ok) {
      ex_.set_error("protocol: " + b.error.reason);
      if (!ex_.response_started) {
        answer_parse_error(b.error);
      } else {
        write_exchange_row();
        close("malformed request body");
      }
      return;
    }
    if (b.used > 0) {
      ex_.add_up(b.used);
      ex_.body_sent = true;
      if (Stream* o = origin_out()) o->write(c, p, b.used);
      if (ex_.cred.keeps_body()) ex_.cred.keep_body(srv_.kept_body_bytes(), p, b.used);
      p += b.used;
      n -= b.used;
    }
    if (codec_->request_complete()) on_request_complete();
    if (Stream* o = origin_out(); o && o->above_high()) pause_client(kPeerFull);
  }
  // A CONNECT (or a lingering answer) changed the mode mid-read: the rest of
  // these bytes belong to the tunnel (e.g. a ClientHello sent with the CONNECT).
  if (n > 0 && !closing_ && mode_ != Mode::http) on_client_bytes(c, p, n);
}

void Connection::replay_stash() {
  // The client stays paused (kStashFull) until the stash is handled: a TLS
  // client's resume() delivers the records it read past the stash at once,
  // from inside resume(), and those are newer than every stashed byte.
  std::vector<Slice> pending = codec_->take_stash();
  for (size_t i = 0; i < pending.size(); ++i) {
    if (closing_ || mode_ != Mode::http || req_ == Req::done || req_ == Req::wait) {
      // Not consumed yet: keep the rest for later, in order.
      bool over = false;
      for (size_t j = i; j < pending.size(); ++j)
        over = codec_->stash(pending[j].chunk, pending[j].data(), pending[j].len);
      if (over)
        pause_client(kStashFull);
      else
        resume_client(kStashFull);
      return;
    }
    Slice& s = pending[i];
    process_client(s.chunk, s.data(), s.len);
  }
  resume_client(kStashFull);
}

void Connection::begin_row(std::string_view method) {
  ex_.begin(method, wall_ms(), uv_now(srv_.loop()));
}

void Connection::on_request_head(std::string_view head) {
  http::ParseError err;
  ++srv_.metrics().requests;
  ClientCodec::Parsed parsed = codec_->parse_head(head, &err);
  const http::Head& req_head = codec_->head();
  bool readable = parsed != ClientCodec::Parsed::unparsed;
  begin_row(readable ? req_head.method : std::string_view());
  ex_.add_up(head.size());
  // Before anything can refuse the head: a refusal's row names who asked.
  bind_first_head(head, readable ? &req_head : nullptr);
  if (parsed != ClientCodec::Parsed::ok) {
    answer_parse_error(err);
    return;
  }
  if (auto ua = req_head.get("user-agent")) ex_.set_ua(std::string(*ua));
  ex_.upgrade = req_head.upgrade && req_head.method_id != HTTP_CONNECT;
  // The build claim is read unless the principal is refused outright (a
  // refused connection's claim is not counted).
  admission::Principal who = principal();
  if (!in_connect_ && !admission::refuses_principal(who, srv_.policy())) note_build_claim();
  admission::Inside inside{connect_dest_, inner_kind_, sni_};
  admission::Request r;
  r.principal = who;
  r.build = build_proof();
  r.inside = in_connect_ ? &inside : nullptr;
  r.method = req_head.method;
  r.target = req_head.target;
  r.host = req_head.get("host");
  r.http_minor = req_head.http_minor;
  r.headers = req_head.headers;
  r.message_complete = codec_->request_complete();
  r.now_ms = wall_ms();
  apply_request(admission::decide_request(r, srv_.policy()));
}

admission::Principal Connection::principal() const {
  return {attribution_, st_src_, st_net_, st_who_};
}

admission::BuildProof Connection::build_proof() const {
  return {build_, build_marker_, proxy_auth_seen_};
}

void Connection::apply_request(const admission::Decision& d) {
  using admission::Action;
  using admission::Answer;
  if (!d.key.empty()) ex_.set_host(d.key);
  if (d.has_dest) {
    ex_.dest = d.dest;
    ex_.kind = d.kind;
    // A CONNECT's target is the connection's from here (a 407's retry
    // replaces it), as before the decision moved to admission.
    if (d.kind == policy::Kind::connect) connect_dest_ = d.dest;
  }
  if (d.path) {
    ex_.set_path(std::string(*d.path));
    ex_.target = std::string(*d.path);
  }
  switch (d.action) {
    case Action::answer: break;
    case Action::challenge: answer_proxy_auth(ex_.row().host, d.close_after); return;
    case Action::establish: establish(d); return;
    case Action::forward:
      if (d.would_block) log_would_block(ex_.row().host, codec_->head().method);
      if (d.rule) {
        inject(*d.rule, ex_.dest, ex_.kind, ex_.target);
        return;
      }
      forward_request(ex_.dest, ex_.kind, ex_.target);
      return;
    default:
      // decide_request answers only the actions above.
      close("admission returned no request action");
      return;
  }
  switch (d.answer) {
    case Answer::unattributed:
      ++srv_.metrics().refused_unattributed;
      answer(answers::unattributed(), d.close_after);
      return;
    case Answer::bad_head: answer_parse_error({400, d.detail}); return;
    case Answer::origin_form:
      answer(answers::origin_form(), d.close_after);
      ++srv_.metrics().bad_requests;
      return;
    case Answer::bad_scheme:
      answer(answers::bad_scheme(d.detail), d.close_after);
      ++srv_.metrics().bad_requests;
      return;
    case Answer::bad_authority:
      answer(answers::bad_authority(d.detail), d.close_after);
      ++srv_.metrics().bad_requests;
      return;
    case Answer::bad_connect:
      answer(answers::bad_connect(d.detail), d.close_after);
      ++srv_.metrics().bad_requests;
      return;
    case Answer::claim:
      ++srv_.metrics().refused_claim;
      answer(answers::claim(), d.close_after);
      return;
    case Answer::overlap:
      ++srv_.metrics().overlaps;
      ex_.set_overlap();
      answer(answers::overlap(d.overlap->message), d.close_after);
      return;
    case Answer::held:
      // The switch is off and this is its dummy: answer as the provider
      // would; nothing goes upstream.
      ++srv_.metrics().held;
      ex_.set_held(d.held->axis);
      answer(answers::held(d.held->body), d.close_after);
      return;
    case Answer::allowlist: refuse(ex_.row().host, d.close_after); return;
    case Answer::scoped:
      // [scope]: the credential is not for who asked. Answered as the
      // provider would answer a missing credential; nothing goes upstream.
      ++srv_.metrics().scoped_out;
      ex_.set_scoped(d.rule->id);
      log::info("{} answered {} {}{} 401: switch '{}' is not for {} ([scope])", log::ConnId{id_},
                ex_.row().method, ex_.row().host, ex_.row().path, d.rule->id,
                policy::asker_text(admission::asker_of(principal(), build_)));
      answer(answers::scoped(d.detail), d.close_after);
      return;
    case Answer::none: break;
  }
  close("admission returned an answer without a kind");
}

void Connection::note_build_claim() {
  // Only the proxy's own hop carries Proxy-Authorization: a build proves
  // itself with fy-build:<secret>; the bare marker only asks for a tunnel.
  auto pa = codec_->head().get("proxy-authorization");
  if (!pa) return;
  proxy_auth_seen_ = true;
  inject::BuildClaim claim = inject::parse_proxy_authorization(*pa);
  if (!claim.marker) return;
  build_marker_ = true;
  if (!build_ && srv_.build_tokens().valid(claim.secret, wall_ms())) {
    build_ = true;
    ++srv_.metrics().builds;
  }
}

void Connection::inject(const inject::Rule& rule, const HostPort& dest, policy::Kind kind,
                        std::string_view target) {
  ex_.cred.begin(rule, codec_->head().content_length, ex_.row_for_roles());
  // The head outlives this read: a credential may be awaited, and a 401 may
  // make the request go out again.
  codec_->keep_head();
  auto l = srv_.credentials().lookup(rule);
  switch (l.state) {
    case inject::CredentialStore::State::ready:
      forward_request(dest, kind, target, &l.value);
      l.value.assign(l.value.size(), '\0');
      return;
    case inject::CredentialStore::State::failed:
      answer_mint_failure(l.failure, false);
      return;
    case inject::CredentialStore::State::pending: break;
  }
  // Hold the head (and any body bytes) until the credential arrives.
  req_ = Req::wait;
  pause_client(kWaitCredential);
  cred_wait_.start(srv_.credentials(), rule,
                   [this](const inject::MintOutcome& out) { on_credential(out); });
  arm_timer();  // the exchange's silence clock stops while it waits
}

void Connection::on_credential(const inject::MintOutcome& out) {
  if (closing_) return;
  touch();
  resume_client(kWaitCredential);
  // The policy may have changed during the mint: the rule must still be the
  // same, or nothing is injected and the request is judged again.
  CredentialFlow::Arrival arrival = ex_.cred.arrived(out, srv_.policy().rules());
  if (arrival == CredentialFlow::Arrival::failed_after_401) {
    answer_mint_failure(out.reason, /*after_401=*/true);
    return;
  }
  const inject::Rule* rule = ex_.cred.same_rule(srv_.policy().rules());
  if (arrival == CredentialFlow::Arrival::rule_changed) {
    log::info("{} switch '{}' changed while its credential was minted: nothing is injected",
              log::ConnId{id_}, ex_.cred.rule_id());
    ex_.cred.drop_rule(&ex_.row_for_roles());
    admission::Decision d =
        admission::decide_unruled(ex_.dest, ex_.kind, principal(), build_proof(),
                                  codec_->request_complete(), wall_ms(), srv_.policy());
    if (d.action != admission::Action::forward) {
      refuse(ex_.row().host, d.close_after);
      return;
    }
    forward_request(ex_.dest, ex_.kind, ex_.target);
  } else if (admission::Decision d = admission::decide_minted(
                 *rule, ex_.dest, ex_.target, principal(), build_proof(),
                 codec_->request_complete(), srv_.policy());
             d.action != admission::Action::forward) {
    // The scope changed during the mint and the credential is no longer for
    // who asked: answered as step 7 answers it, nothing injected.
    log::info("{} switch '{}''s scope changed while its credential was minted: not injected",
              log::ConnId{id_}, ex_.cred.rule_id());
    ex_.cred.drop_rule(&ex_.row_for_roles());
    ++srv_.metrics().scoped_out;
    ex_.set_scoped(rule->id);
    answer(answers::scoped(d.detail), d.close_after);
    return;
  } else if (!out.ok) {
    answer_mint_failure(out.reason, false);
    return;
  } else {
    forward_request(ex_.dest, ex_.kind, ex_.target, &out.value);
  }
  if (!closing_ && codec_->pipelined() && req_ != Req::done) replay_stash();
}

void Connection::replay_after_401() {
  // The origin refused the injected credential: drop it, mint once more and
  // send the request again (head and the kept body: replayable() held).
  ++srv_.metrics().replays;
  const inject::Rule* rule =
      ex_.cred.start_replay(srv_.policy().rules(), srv_.credentials(), ex_.row_for_roles());
  if (!rule) {
    forward_request(ex_.dest, ex_.kind, ex_.target);
    return;
  }
  cred_wait_.start(
      srv_.credentials(), *rule, [this](const inject::MintOutcome& out) { on_credential(out); },
      /*force=*/true);
  arm_timer();
}

void Connection::answer_mint_failure(const std::string& reason, bool after_401) {
  ++srv_.metrics().mint_failures;
  CredentialFlow::mint_failed(ex_.row_for_roles());
  answer(answers::mint_failed(ex_.dest.host, reason, after_401),
         !codec_->request_complete() || req_ == Req::body);
}

void Connection::answer_proxy_auth(const std::string& key, bool close_after) {
  // The destination is open to builds: ask for the build's credential (git
  // sends the one in its proxy URL only after this challenge).
  ++srv_.metrics().proxy_auth_challenges;
  answers::Reply r = answers::build_challenge(key);
  ex_.set_blocked();
  std::string out = codec_->encode_challenge(r, close_after);
  client_.write(out);
  ex_.set_status(407);
  ex_.add_down(out.size());
  write_exchange_row();
  ex_.reset();
  if (close_after) {
    linger();
    return;
  }
  codec_->restart();
  req_ = Req::head;
  arm_timer();
}

void Connection::establish(const admission::Decision& d) {
  if (d.would_block) log_would_block(ex_.row().host, "CONNECT");
  implicit_only_ = d.implicit_only;
  in_connect_ = true;
  inner_kind_ = d.inner_kind;
  codec_->restart();
  tunnel_.set_start(ex_.row().ts_ms, ex_.start_ms());
  client_.write(codec_->encode_connect_established());
  ex_.hand_over();  // the tunnel's own row (or its requests' rows) follow
  mode_ = Mode::hello;
  mode_start_ms_ = setup_start_ms_ = uv_now(srv_.loop());
  arm_timer();
  // Bytes already read past the CONNECT head are the start of the tunnel.
}

void Connection::on_hello_bytes(const char* p, size_t n) {
  hello_.append(p, n);
  auto ch = tls::parse_client_hello(hello_);
  admission::Hello h;
  switch (ch.status) {
    case tls::ClientHello::Status::need_more: return;
    case tls::ClientHello::Status::malformed: h.shape = admission::Hello::Shape::malformed; break;
    case tls::ClientHello::Status::not_tls:
      h.shape = looks_like_http(hello_) ? admission::Hello::Shape::http
                                        : admission::Hello::Shape::other;
      break;
    case tls::ClientHello::Status::ok:
      h.shape = admission::Hello::Shape::tls;
      sni_ = ch.sni;
      break;
  }
  h.dest = &connect_dest_;
  h.sni_present = ch.sni_present;
  h.sni = ch.sni;
  h.implicit_only = implicit_only_;
  h.build = build_proof();
  apply_hello(admission::decide_hello(h, srv_.policy()));
}

void Connection::apply_hello(const admission::Decision& d) {
  using admission::Action;
  switch (d.action) {
    case Action::close:
      if (d.why == admission::Why::malformed_hello) {
        tls_mode_ = "opaque";
        ++srv_.metrics().bad_requests;
        log::info("{} CONNECT {}: the client sent a malformed TLS ClientHello; closing", log::ConnId{id_},
                  connect_dest_.authority());
        begin_row("CONNECT");
        ex_.set_host(connect_dest_.key(443));
        ex_.set_error("protocol: malformed TLS ClientHello");
        write_exchange_row();
      } else if (d.why == admission::Why::implicit_only_not_tls) {
        log::info("{} CONNECT {}: admitted only for HTTPS the proxy decrypts, and this is "
                  "not TLS; closing",
                  log::ConnId{id_}, connect_dest_.authority());
      }
      close(admission::why_text(d.why));
      return;
    case Action::serve_plain: {
      // Cleartext HTTP inside the tunnel: served like any request, judged
      // on the CONNECT target.
      tls_mode_ = "plain";
      inner_kind_ = d.inner_kind;
      mode_ = Mode::http;
      req_ = Req::head;
      std::string bytes;
      bytes.swap(hello_);
      ChunkRef c = ChunkPool::alloc();
      size_t off = 0;
      while (off < bytes.size() && mode_ == Mode::http && !closing_) {
        size_t take = std::min(bytes.size() - off, Chunk::kSize);
        memcpy(c->data(), bytes.data() + off, take);
        process_client(c, c->data(), take);
        off += take;
        if (off < bytes.size()) c = ChunkPool::alloc();
      }
      return;
    }
    case Action::tunnel:
      start_tunnel(d.tunnel == admission::TunnelKind::passthrough ? TunnelKind::passthrough
                                                                  : TunnelKind::opaque);
      return;
    case Action::decrypt: start_decrypt(sni_); return;
    default: close("admission returned no action for the first bytes"); return;
  }
}

void Connection::start_tunnel(TunnelKind kind) {
  std::string held;
  held.swap(hello_);
  tunnel_.open(kind, std::move(held));  // written on_dialed
  tls_mode_ = Tunnel::tls_mode(kind);
  mode_ = Mode::tunnel;
  mode_start_ms_ = uv_now(srv_.loop());
  ++srv_.metrics().tunnels;
  dial(connect_dest_, /*tls=*/false);
  arm_timer();
}

void Connection::start_decrypt(const std::string& sni) {
  tls_mode_ = "decrypted";
  inner_kind_ = policy::Kind::https;
  // The certificate names what the client asked for (its SNI) so it can
  // read the proxy's answer; decisions still use the CONNECT target.
  const std::string& name = sni.empty() ? connect_dest_.host : sni;
  auto leaf = srv_.ca().leaf_for(name, wall_ms());
  if (!leaf) {
    log::error("{} cannot mint a certificate for {}: {}", log::ConnId{id_}, name, leaf.error().message);
    close("certificate minting failed");
    return;
  }
  mode_ = Mode::handshake;
  mode_start_ms_ = uv_now(srv_.loop());
  std::string hello;
  hello.swap(hello_);
  // Dial the origin while the client handshakes.
  eager_dial_ = true;
  dial(connect_dest_, /*tls=*/true);
  if (closing_) return;
  client_.start_tls_server(srv_.server_ctx(), *leaf, srv_.ca().ca_der(), srv_.ca().leaf_key(),
                           hello);
  arm_timer();
}

void Connection::forward_request(const HostPort& dest, policy::Kind kind, std::string_view target,
                                 const std::string* token) {
  bool tls = kind == policy::Kind::https;
  eager_dial_ = false;  // this request takes the eager dial, or dials its own
  if (!early_failure_.empty() && !origin_out()) {
    std::string reason;
    reason.swap(early_failure_);
    fail_exchange(early_failure_kind_, reason, connect_dest_.authority());
    return;
  }
  // An origin still being dialled serves too (the eager dial of a decrypted
  // tunnel): the head waits in its queue until it connects.
  Stream* o = origin_out();
  bool reuse = o && !o->closing() && !origin_eof_ && origin_dest_ == dest && origin_tls_ == tls;
  if (!reuse) {
    dial(dest, tls, /*use_pool=*/true);
    if (closing_) return;
    o = origin_out();
    if (!o) {
      // The dial failed at once (no descriptor to spare, no address that
      // takes a connect): the failure is answered on the next turn. Until
      // then the rest of this request (its body, a pipelined one) is held,
      // never read as a new head.
      req_ = Req::wait;
      return;
    }
  }
  // Sent on a connection an earlier exchange (or another client, through the
  // pool) used: if it turns out closed, the request may be retried once.
  ex_.reused_origin = !origin_fresh_;
  origin_fresh_ = false;

  http::Head& req_head = codec_->head();
  http::RequestOut out;
  out.method = req_head.method;
  out.target = target;
  std::string injected_target;
  if (token &&
      ex_.cred.inject(srv_.policy().rules(), *token, target, out, injected_target,
                      ex_.row_for_roles()))
    ++srv_.metrics().injected;
  std::string host_header = dest.key(policy::default_port(kind));
  out.host = host_header;
  out.upgrade = ex_.upgrade;
  if (ex_.cred.replayed()) {
    // The re-issue after a 401 carries its whole body at once: nothing to
    // wait for, and the client already had its 100 Continue.
    std::erase_if(req_head.headers, [](const http::Header& h) { return iequals(h.name, "expect"); });
  }
  ex_.sent_head.clear();
  http::build_request_head(ex_.sent_head, req_head, out);
  for (auto& [name, value] : out.set) value.assign(value.size(), '\0');
  o->write(ex_.sent_head);
  if (ex_.cred.replayed() && !ex_.cred.kept_body().empty()) {
    // Exactly the body bytes the first attempt sent, framing included.
    o->write(ex_.cred.kept_body().bytes());
    ex_.cred.kept_body().release();
    ex_.body_sent = true;
    if (o->above_high()) pause_client(kPeerFull);
  }
  resp_parser_.expect_response_to(req_head.method_id);
  resp_ = Resp::head;
  resp_reader_.reset();
  codec_->head_forwarded();
  // The head's views die with its bytes: nothing reads them after here.
  // An Upgrade request's body (if any) goes first; the switch happens only
  // on a 101, after which the stash carries the new protocol's bytes.
  if (codec_->request_complete()) {
    on_request_complete();
  } else {
    req_ = Req::body;
  }
  arm_timer();
}

void Connection::on_request_complete() {
  req_ = Req::done;
  if (ex_.upgrade) return;  // the response decides: 101 -> tunnel, else go on
}

// ---------------------------------------------------------------------------
// Origin side

void Connection::on_origin_bytes(const ChunkRef& c, const char* p, size_t n) {
  if (mode_ == Mode::tunnel) {
    if (tunnel_.from_origin(client_, c, p, n)) pause_origin(kPeerFull);
    return;
  }
  while (n > 0 && !closing_) {
    if (resp_ == Resp::none) {
      // Bytes nobody asked for: the origin is confused. Drop the connection.
      log::debug("{} origin {} sent {} unexpected bytes; dropping it", log::ConnId{id_},
                 origin_dest_.authority(), n);
      retire_origin();
      return;
    }
    if (resp_ == Resp::head) {
      size_t used = 0;
      http::ParseError err;
      std::string_view head;
      auto st = resp_reader_.feed(std::string_view(p, n), &used, &head, &err);
      if (st == http::HeadScanner::Status::error) {
        origin_failed(Errc::parse, "the origin's response head is malformed: " + err.reason);
        return;
      }
      if (st == http::HeadScanner::Status::need_more) return;
      p += used;
      n -= used;
      on_response_head(head);
      if (mode_ == Mode::tunnel) {
        // The new protocol's first bytes, behind the 101 (the origin is not
        // paused for them, as it never was).
        if (n > 0) (void)tunnel_.from_origin(client_, c, p, n);
        return;
      }
      if (resp_ == Resp::none && n > 0 && origin_ && !closing_) {
        // A response complete at its head, and more bytes behind it that no
        // request asked for: never let them stand for the next answer.
        log::debug("{} origin {} sent bytes after its response; dropping it", log::ConnId{id_},
                   origin_dest_.authority());
        retire_origin();
        return;
      }
      continue;
    }
    // Resp::body
    http::ParseError err;
    auto used = resp_parser_.parse_body(p, n, &err);
    if (!used) {
      origin_failed(Errc::parse, "the origin's response body is malformed: " + err.reason);
      return;
    }
    if (*used > 0) {
      if (!ex_.cred.discarding()) {
        client_.write(c, p, *used);
        ex_.add_down(*used);
      }
      p += *used;
      n -= *used;
    }
    if (resp_parser_.message_complete()) {
      on_response_complete();
      if (n > 0 && origin_) {
        log::debug("{} origin {} sent bytes after its response; dropping it", log::ConnId{id_},
                   origin_dest_.authority());
        retire_origin();
      }
      return;
    }
  }
  if (client_.above_high()) pause_origin(kPeerFull);
}

void Connection::on_response_head(std::string_view head) {
  http::ParseError err;
  if (!resp_parser_.parse_head(head, &resp_head_, &err)) {
    origin_failed(Errc::parse, "the origin's response head is malformed: " + err.reason);
    return;
  }
  int status = resp_head_.status;
  if (status >= 100 && status < 200 && status != 101) {
    // Interim (100 Continue, 103 Early Hints): pass on, wait for the final one.
    std::string out = codec_->encode_response_head(resp_head_, false, false);
    client_.write(out);
    ex_.add_down(out.size());
    resp_parser_.next_message();
    resp_reader_.reset();
    return;
  }
  ex_.sent_head.assign(ex_.sent_head.size(), '\0');  // it may hold a credential
  ex_.sent_head.clear();
  bool body_until_eof = resp_parser_.body_until_eof();
  ex_.origin_reuse = resp_head_.keep_alive && !body_until_eof;
  switch (ex_.cred.response_head(status, req_ == Req::done, srv_.policy().rules(),
                                 srv_.credentials())) {
    case CredentialFlow::Verdict::replace:
      // Replace this 401: read it to its end, then mint and send again.
      if (resp_parser_.message_complete()) {
        on_response_complete();
      } else {
        resp_ = Resp::body;
      }
      return;
    case CredentialFlow::Verdict::hand_back_unkept:
      log::info("{} switch '{}': 401 to a request whose body is {}: handed back, the token "
                "is dropped",
                log::ConnId{id_}, ex_.cred.rule_id(),
                req_ == Req::done ? "over the 1 MiB replay bound" : "still arriving");
      break;
    case CredentialFlow::Verdict::hand_back:
    case CredentialFlow::Verdict::pass: break;
  }
  ex_.response_head(status);
  ++srv_.metrics().responses_forwarded;
  if (status == 101) {
    if (!ex_.upgrade) {
      origin_failed(Errc::parse, "the origin switched protocols without being asked to");
      return;
    }
    std::string out = codec_->encode_response_head(resp_head_, false, /*upgrade=*/true);
    client_.write(out);
    ex_.add_down(out.size());
    ++srv_.metrics().upgrades;
    tunnel_.open(TunnelKind::upgrade);
    mode_ = Mode::tunnel;
    mode_start_ms_ = uv_now(srv_.loop());
    tunnel_.set_start(ex_.row().ts_ms, ex_.start_ms());
    // Bytes the client sent after its request belong to the new protocol.
    // They go to the tunnel before the client is resumed (a stash past its
    // bound paused it): a TLS client's resume() delivers newer bytes at once
    // (see replay_stash).
    std::vector<Slice> pending = codec_->take_stash();
    for (Slice& s : pending) (void)tunnel_.from_client(origin_, false, s.chunk, s.data(), s.len);
    resume_client(kStashFull);
    arm_timer();
    return;
  }
  if (ex_.upgrade) {
    // Upgrade declined: the request is an ordinary one after all.
    ex_.upgrade = false;
  }
  if (!codec_->keeps_alive(client_eof_) || srv_.draining() || body_until_eof)
    ex_.close_after = true;
  ex_.decide_capture(status, resp_head_.get("content-encoding"));
  std::string out = codec_->encode_response_head(resp_head_, ex_.close_after, false);
  client_.write(out);
  ex_.add_down(out.size());
  if (resp_parser_.message_complete()) {
    on_response_complete();
  } else {
    resp_ = Resp::body;
  }
}

void Connection::on_response_complete() {
  if (ex_.cred.discarding()) {
    resp_ = Resp::none;
    resp_parser_.next_message();
    resp_reader_.reset();
    ex_.discard_captured();
    if (!ex_.origin_reuse) retire_origin();
    replay_after_401();
    return;
  }
  ex_.response_complete();
  write_exchange_row();
  resp_ = Resp::none;
  resp_parser_.next_message();
  resp_reader_.reset();
  if (!ex_.origin_reuse || req_ != Req::done) retire_origin();
  if (req_ != Req::done) {
    // The origin answered before the request body was complete: the rest of
    // that body cannot be told apart from a next request. End here.
    ex_.close_after = true;
  }
  bool close_after = ex_.close_after || (client_eof_ && !codec_->pipelined());
  ex_.reset();
  if (close_after) {
    linger();
    return;
  }
  req_ = Req::head;
  codec_->next_request();
  if (srv_.draining()) {
    linger();
    return;
  }
  // The next pipelined request waits for the next loop turn: this call may be
  // deep inside the origin's read callback, which must finish with the
  // origin it is reading (and see any bytes it sent past this response).
  codec_->schedule_replay();
  arm_timer();
}

void Connection::dial(const HostPort& dest, bool tls, bool use_pool) {
  retire_origin(/*reusable=*/true);
  origin_dest_ = dest;
  origin_tls_ = tls;
  origin_eof_ = false;
  origin_pause_ = 0;
  OriginDialer::Target t;
  t.dest = dest;
  t.tls = tls;
  t.use_pool = use_pool;
  auto [ip, port] = srv_.resolve_target(dest);
  t.port = port;
  if (!ip.empty()) {
    sockaddr_storage ss;
    socklen_t len;
    make_sockaddr(ip, port, &ss, &len);
    t.addrs.push_back(ss);
  }
  if (tls) {
    t.tls_ctx = srv_.client_ctx();
    t.sessions = srv_.origin_sessions();
  }
  OriginDialer::Started st = dialer_.start(t);
  if (st.how == OriginDialer::How::pooled) {
    origin_ = st.pooled;
    origin_fresh_ = false;
    return;
  }
  origin_fresh_ = true;
  arm_timer();  // the connect deadline
  if (st.how == OriginDialer::How::failed_now) on_dial_failed(std::move(st.failure));
}

void Connection::defer_origin_failure(Errc kind, std::string detail) {
  // dial() and the dialer's fallbacks are called from inside request
  // handling: a failure is reported on the next loop turn, never from inside
  // them (the answer it leads to resets the exchange the caller is still
  // building).
  deferred_failure_ = std::move(detail);
  deferred_failure_kind_ = kind;
  arm_timer();
}

void Connection::on_dial_failed(DialFailure f) {
  if (f.out_of_files) {
    // The connection limit admits a client per descriptor, so idle clients
    // can hold them all: answered 503 (fail_exchange), counted.
    ++srv_.metrics().dials_out_of_files;
    out_of_files_ = true;
    f.detail = fmt::format("{} (open-file limit {}, {} clients open)", f.detail,
                           srv_.open_files_limit(), srv_.open_connections());
  }
  if (f.at_once) {
    defer_origin_failure(f.kind, std::move(f.detail));
    return;
  }
  if (f.kind == Errc::tls && f.verify) {
    ++srv_.metrics().tls_origin_verify_failures;
    origin_failed(Errc::tls,
                  f.verify->reason + " (the origin's certificate for " + origin_dest_.host +
                      " is not trusted)",
                  netlog::ErrorKind::tls_verify);
    return;
  }
  origin_failed(f.kind, f.detail);
}

void Connection::retire_origin(bool reusable) {
  dialer_.cancel();
  // An idle, healthy cleartext origin connection goes to the pool for the
  // next client; anything else is closed.
  if (reusable && origin_ && !origin_tls_ && !origin_eof_ && !origin_->closing() &&
      resp_ == Resp::none && origin_->queued() == 0 && mode_ != Mode::tunnel) {
    srv_.origin_pool().put(origin_dest_.authority(), origin_);
    origin_ = nullptr;
  }
  if (origin_) {
    origin_->close_and_delete();
    origin_ = nullptr;
  }
  origin_pause_ = 0;
  resume_client(kPeerFull);
}

bool Connection::retry_on_fresh_origin() {
  // A kept-alive origin may close just as a request goes out. Retry once on
  // a new connection when nothing came back and nothing of a body was sent.
  if (!ex_.reused_origin || ex_.retried || ex_.body_sent || ex_.sent_head.empty() ||
      resp_reader_.started())
    return false;
  ex_.retried = true;
  std::string head;
  head.swap(ex_.sent_head);
  dial(ex_.dest, origin_tls_, /*use_pool=*/false);
  Stream* o = origin_out();
  if (closing_ || !o) return true;
  origin_fresh_ = false;
  ex_.sent_head = head;
  o->write(head);
  resp_reader_.reset();
  return true;
}

void Connection::origin_failed(Errc kind, const std::string& detail,
                               std::optional<netlog::ErrorKind> row_kind) {
  std::string reason =
      netlog::error_text(row_kind.value_or(netlog::error_kind_of(kind)), detail);
  std::string dest = origin_dest_.authority();
  if (mode_ == Mode::http && !ex_.active() && !eager_dial_) {
    // An idle kept-alive origin went away between requests with a reset
    // rather than a FIN: no request failed. It is retired; the next request
    // dials again.
    log::debug("{} idle origin {} went away: {}", log::ConnId{id_}, dest, reason);
    retire_origin();
    return;
  }
  ++srv_.metrics().upstream_errors;
  log::limited(g_upstream_log, log::Level::warn, "{} upstream {} failed: {}", log::ConnId{id_},
               dest, reason);
  retire_origin();
  if (mode_ == Mode::tunnel) {
    ex_.set_error(reason);
    tunnel_.end_with(reason);
    close("the tunnel's origin failed");
    return;
  }
  if (mode_ == Mode::handshake || (mode_ == Mode::http && !ex_.active())) {
    // The eager dial of a decrypted tunnel failed before any request (an
    // idle origin is retired above): the first request is answered with this
    // failure; later ones dial again.
    early_failure_ = reason;
    early_failure_kind_ = kind;
    return;
  }
  if (ex_.active() && !ex_.response_started) {
    fail_exchange(kind, reason, dest);
    return;
  }
  if (ex_.active()) {
    ex_.set_error(reason);
    write_exchange_row();
  }
  close("origin failed mid-response");
}

void Connection::fail_exchange(Errc kind, const std::string& reason, const std::string& dest) {
  ex_.set_error(reason);
  // Out of descriptors (the dialer's out_of_files) is the proxy's own failure: 503, the
  // request may be retried.
  answers::Reply r = kind == Errc::timeout ? answers::upstream_timeout(dest, reason)
                     : out_of_files_        ? answers::out_of_files(dest, reason)
                                            : answers::upstream_failed(dest, reason);
  out_of_files_ = false;
  answer(std::move(r), req_ != Req::done || ex_.upgrade || !codec_->request_complete());
}

// ---------------------------------------------------------------------------
// Answers and rows

void Connection::answer(answers::Reply reply, bool close_after) {
  if (cred_wait_.cancel(srv_.credentials())) resume_client(kWaitCredential);
  bool close = close_after || srv_.draining() || !codec_->keeps_alive(client_eof_);
  std::string out = codec_->encode_answer(reply, close);
  client_.write(out);
  ex_.answered(reply.status, out.size(), reply.body);
  write_exchange_row();
  ex_.reset();
  resp_ = Resp::none;
  if (close || mode_ != Mode::http) {
    linger();
    return;
  }
  // Keep-alive after an answer: only when the request had no body left.
  codec_->next_request();
  req_ = Req::head;
  codec_->schedule_replay();
  arm_timer();
}

void Connection::answer_parse_error(const http::ParseError& e) {
  if (e.status == 431 || e.status == 400 || e.status == 501 || e.status == 505)
    ++srv_.metrics().bad_requests;
  ex_.set_error("client: " + e.reason);
  answer(answers::bad_head(e.status, e.reason), /*close_after=*/true);
}

void Connection::refuse(const std::string& key, bool close_after) {
  ++srv_.metrics().refused_allowlist;
  ex_.set_blocked();
  log::info("{} refused {} {}: not on the allowlist", log::ConnId{id_}, ex_.row().method, key);
  // Refused at CONNECT time: no dial, no TLS. A plain request with a body
  // left unread closes the connection (admission's close_after says which).
  answer(answers::allowlist(key), close_after);
}

void Connection::log_would_block(const std::string& key, std::string_view method) {
  ++srv_.metrics().would_block;
  const auto& pol = srv_.policy();
  if (!srv_.would_block().allow(key, wall_ms(), pol.observing_since_ms() ^ pol.learn_until_ms()))
    return;
  netlog::Row row;
  row.ts_ms = wall_ms();
  row.method = std::string(method);
  row.host = key;
  row.path = ex_.row().path;
  row.ua = ex_.row().ua;
  row.would_block = true;
  conn_fields().fill(row);
  srv_.netlog().append(row);
}

ConnFields Connection::conn_fields() const {
  ConnFields f;
  f.conn = id_;
  f.peer = peer_;
  f.build_marker = build_marker_;
  f.in_connect = in_connect_;
  f.tls_mode = tls_mode_;
  f.sni = sni_;
  f.attribution = attribution_;
  f.src = st_src_;
  f.net = st_net_;
  f.who = st_who_;
  f.seq = st_seq_;
  f.boot = st_boot_;
  return f;
}

void Connection::write_exchange_row() {
  if (const netlog::Row* row = ex_.finish(conn_fields(), wall_ms(), uv_now(srv_.loop())))
    srv_.netlog().append(*row);
}

void Connection::write_tunnel_row() {
  netlog::Row row =
      tunnel_.row(uv_now(srv_.loop()), dialer_.last_error(), ex_.row(), connect_dest_.key(443));
  conn_fields().fill(row);
  srv_.netlog().append(row);
}

void Connection::bind_first_head(std::string_view raw, const http::Head* parsed) {
  if (!first_head_) return;
  first_head_ = false;
  const std::string& key = srv_.stamp_key();
  if (key.empty()) return;  // attribution not expected
  // A head llhttp refused (an unknown method, say), or none at all, is
  // scanned line by line (stamp_binding.h says why that finds the stamp).
  stamp_binding::Found found =
      parsed ? stamp_binding::find(parsed->headers) : stamp_binding::scan_raw(raw);
  stamp_binding::Binding b = stamp_binding::bind(found, key, srv_.replay_guard());
  attribution_ = b.attribution;
  switch (b.outcome) {
    case stamp_binding::Outcome::not_expected: return;
    case stamp_binding::Outcome::none: ++srv_.metrics().unattributed; return;
    case stamp_binding::Outcome::several:
      ++srv_.metrics().stamps_invalid;
      ++srv_.metrics().unattributed;
      return;
    case stamp_binding::Outcome::invalid:
      ++srv_.metrics().stamps_invalid;
      ++srv_.metrics().unattributed;
      log::info("{} {} from {}: recorded as unattributed", log::ConnId{id_}, b.error, peer_);
      return;
    case stamp_binding::Outcome::replayed:
      ++srv_.metrics().stamps_replayed;
      ++srv_.metrics().unattributed;
      log::info("{} stamp seq {} of boot {} was already used: recorded as unattributed", log::ConnId{id_},
                b.fields.seq, b.fields.boot);
      return;
    case stamp_binding::Outcome::valid:
      ++srv_.metrics().stamps_valid;
      st_src_ = std::move(b.fields.src);
      st_net_ = std::move(b.fields.net);
      st_who_ = std::move(b.fields.who);
      st_seq_ = b.fields.seq;
      st_boot_ = std::move(b.fields.boot);
      return;
  }
}

// ---------------------------------------------------------------------------
// Flow control and lifecycle

void Connection::pause_client(uint8_t reason) {
  client_pause_ |= reason;
  client_.pause();
}

void Connection::resume_client(uint8_t reason) {
  if (!(client_pause_ & reason)) return;
  client_pause_ &= static_cast<uint8_t>(~reason);
  if (client_pause_ == 0 && !closing_) client_.resume();
}

void Connection::pause_origin(uint8_t reason) {
  origin_pause_ |= reason;
  if (Stream* o = origin_out()) o->pause();
}

void Connection::resume_origin(uint8_t reason) {
  if (!(origin_pause_ & reason)) return;
  origin_pause_ &= static_cast<uint8_t>(~reason);
  if (Stream* o = origin_out(); origin_pause_ == 0 && o && !closing_) o->resume();
}

void Connection::linger() {
  // Answered: send FIN after the answer, discard what the client still
  // sends, close on its EOF or after kLingerMs. Closing at once could reset
  // the connection before the client read the answer. An idle, healthy
  // origin connection goes to the pool.
  retire_origin(/*reusable=*/true);
  mode_ = Mode::lingering;
  mode_start_ms_ = uv_now(srv_.loop());
  client_pause_ = 0;
  client_.resume();
  client_.shutdown();
  if (client_eof_ && client_.shutdown_done()) {
    close("answered");
    return;
  }
  arm_timer();
}

void Connection::finish_tunnel_if_done() {
  if (tunnel_.finished(client_, origin_out())) close("tunnel finished");
}

void Connection::touch() { last_io_ms_ = uv_now(srv_.loop()); }

ConnTimes Connection::times() const {
  ConnTimes t;
  t.mode = mode_;
  t.deferred = !deferred_failure_.empty() || codec_->replay_pending();
  t.exchange = ex_.active();
  t.waiting_credential = cred_wait_.waiting();
  t.dial_start = dialer_.dial_started();
  t.attempt_start = dialer_.attempt_started();
  t.head_start = head_start_ms_;
  t.last_io = last_io_ms_;
  t.mode_start = mode_start_ms_;
  t.setup_start = setup_start_ms_;
  t.connect_port = connect_dest_.port;
  t.blind_waiting =
      mode_ == Mode::tunnel && tunnel_.kind() != TunnelKind::upgrade && tunnel_.down() == 0;
  t.origin_ready = origin_ready_ms_;
  return t;
}

void Connection::arm_timer() {
  if (closing_) return;
  Deadline d = next_deadline(times(), srv_.config().limits);
  if (d.phase == Phase::none) {
    // A credential wait: the store answers within --minter-timeout.
    uv_timer_stop(&timer_);
    return;
  }
  uint64_t now = uv_now(srv_.loop());
  uint64_t delay = d.phase == Phase::deferred ? 0 : d.at_ms > now ? d.at_ms - now : 1;
  uv_timer_start(&timer_, on_timer, delay, 0);
}

void Connection::on_timer(uv_timer_t* t) { static_cast<Connection*>(t->data)->handle_timer(); }

void Connection::setup_timed_out(Phase phase) {
  const Limits& lim = srv_.config().limits;
  uint64_t secs = lim.head_timeout_ms / 1000;
  std::string what;
  switch (phase) {
    case Phase::hello:
      what = hello_.empty()
                 ? fmt::format("the client sent nothing within {} s of the CONNECT's 200", secs)
                 : fmt::format("the client's TLS ClientHello was incomplete {} s after the "
                               "CONNECT's 200 ({} bytes)",
                               secs, hello_.size());
      break;
    case Phase::handshake:
      ++srv_.metrics().tls_client_handshake_failures;
      what = fmt::format("the client's TLS handshake did not complete within {} s of the "
                         "CONNECT's 200",
                         secs);
      break;
    case Phase::first_bytes:
      what = tunnel_.up() == 0
                 ? fmt::format("the tunnel carried no byte either way within {} s of its "
                               "origin's connect",
                               secs)
                 : fmt::format("the tunnel's origin sent no byte within {} s of its connect",
                               secs);
      break;
    default: return;
  }
  log::limited(g_setup_timeout_log, log::Level::info, "{} CONNECT {}: timed out ({}): {}; closing",
               log::ConnId{id_}, connect_dest_.authority(), phase_name(phase), what);
  std::string error = "timeout: " + what;
  if (mode_ == Mode::tunnel) {
    tunnel_.end_with(error);  // close() writes the tunnel's row with it
  } else {
    begin_row("CONNECT");
    ex_.set_host(connect_dest_.key(443));
    ex_.set_error(error);
    write_exchange_row();
  }
  close(std::string("timed out: ") + phase_name(phase));
}

void Connection::handle_timer() {
  if (closing_) return;
  const Limits& lim = srv_.config().limits;
  uint64_t now = uv_now(srv_.loop());
  Deadline d = next_deadline(times(), lim);
  if (d.phase == Phase::none) return;
  if (now < d.at_ms) {
    arm_timer();  // fired early (or for a deadline that moved): not due yet
    return;
  }
  switch (d.phase) {
    case Phase::connect:
    case Phase::exchange:
    case Phase::head:
    case Phase::idle:
    case Phase::hello:
    case Phase::handshake:
    case Phase::first_bytes:
    case Phase::tunnel_idle: ++srv_.metrics().timeouts[static_cast<int>(d.phase)]; break;
    default: break;
  }
  switch (d.phase) {
    case Phase::none: return;
    case Phase::deferred:
      if (!deferred_failure_.empty()) {
        std::string detail;
        detail.swap(deferred_failure_);
        origin_failed(deferred_failure_kind_, detail);
        break;
      }
      // A full client: on_drain(client) replays when it has room.
      if (codec_->replay_turn(client_.above_high()) && mode_ == Mode::http &&
          req_ == Req::head) {
        replay_stash();
        if (!closing_ && client_eof_ && !ex_.active() && req_ == Req::head &&
            !codec_->pipelined() && !codec_->replay_pending()) {
          close("client closed");  // what it sent is answered
          return;
        }
      }
      break;
    case Phase::next_address: {
      // This address does not answer: try the next one while time remains.
      OriginDialer::Started st = dialer_.next_address();
      if (st.how == OriginDialer::How::failed_now) on_dial_failed(std::move(st.failure));
      break;
    }
    case Phase::connect:
      origin_failed(Errc::timeout,
                    fmt::format("connecting to {} took longer than {} s",
                                origin_dest_.authority(), lim.connect_timeout_ms / 1000));
      return;
    case Phase::exchange:
      if (!ex_.response_started) {
        origin_failed(Errc::timeout,
                      fmt::format("no response within {} s", lim.io_timeout_ms / 1000));
      } else {
        ex_.set_error("timeout: the response stalled");
        write_exchange_row();
        close("exchange stalled");
      }
      return;
    case Phase::head:
      ++srv_.metrics().head_timeouts;
      begin_row("");
      bind_first_head(std::string_view(), nullptr);
      ex_.set_error("client: the request head did not arrive in time");
      answer(answers::head_timeout(lim.head_timeout_ms / 1000), true);
      return;
    case Phase::idle: close("idle"); return;
    case Phase::opaque_probe: {
      // Silence on a port other than 443: a server-speaks-first protocol.
      admission::Hello h;
      h.shape = admission::Hello::Shape::silence;
      h.dest = &connect_dest_;
      h.implicit_only = implicit_only_;
      h.build = build_proof();
      apply_hello(admission::decide_hello(h, srv_.policy()));
      return;
    }
    case Phase::hello:
    case Phase::handshake:
    case Phase::first_bytes: setup_timed_out(d.phase); return;
    case Phase::tunnel_idle: close("tunnel idle"); return;
    case Phase::linger: close("answered"); return;
  }
  if (!closing_) arm_timer();
}

void Connection::rejudge(int64_t now_ms) {
  if (closing_) return;
  admission::Inside inside{connect_dest_, inner_kind_, sni_};
  admission::Open o;
  o.principal = principal();
  o.build = build_proof();
  o.inside = in_connect_ ? &inside : nullptr;
  o.tunnel = mode_ == Mode::tunnel;
  o.passthrough = tunnel_.kind() == TunnelKind::passthrough;
  o.exchange = ex_.active();
  o.exchange_dest = ex_.dest;
  o.exchange_kind = ex_.kind;
  o.origin = origin_out() ? &origin_dest_ : nullptr;
  o.origin_tls = origin_tls_;
  o.now_ms = now_ms;
  admission::Decision d = admission::decide_open(o, srv_.policy());
  if (d.action == admission::Action::retire_origin) {
    retire_origin();  // idle: the next request is judged anyway
    return;
  }
  if (d.action != admission::Action::close) return;
  const char* why = admission::why_text(d.why);
  ++srv_.metrics().connections_closed_by_policy;
  log::info("{} closed: {} ({})", log::ConnId{id_}, why,
            in_connect_ ? connect_dest_.authority() : ex_.dest.authority());
  if (ex_.active() && mode_ == Mode::http) {
    ex_.set_error(std::string("closed: ") + why);
    write_exchange_row();
  }
  if (mode_ == Mode::tunnel) tunnel_.end_with(std::string("closed: ") + why);
  close(why);
}

void Connection::drain() {
  if (closing_) return;
  if (mode_ == Mode::http && !ex_.active() && req_ == Req::head && !codec_->head_started() &&
      head_start_ms_ == 0) {
    close("draining");
    return;
  }
  ex_.close_after = true;
}

void Connection::close(std::string_view why) {
  if (closing_) return;
  closing_ = true;
  log::debug("{} closing: {}", log::ConnId{id_}, why);
  if (mode_ == Mode::tunnel) write_tunnel_row();
  srv_.unlink(this);
  if (origin_out()) retire_origin(/*reusable=*/!ex_.active());
  dialer_.cancel();  // a lookup or a dial that failed at once holds no Stream
  cred_wait_.cancel(srv_.credentials());
  codec_->drop_stash();
  pending_closes_ = 2;
  client_.close();
  uv_timer_stop(&timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), on_timer_closed);
}

void Connection::on_timer_closed(uv_handle_t* h) {
  static_cast<Connection*>(h->data)->maybe_release();
}

void Connection::maybe_release() {
  if (--pending_closes_ > 0) return;
  srv_.released(this);  // deletes this
}

}  // namespace fy::proxy
