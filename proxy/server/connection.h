// One client connection and everything it carries: requests in absolute form,
// CONNECT tunnels (passthrough or decrypted), the origin connection behind
// them, and the Network Log rows they produce.
//
// The state machine, in short:
//   http       read a request head -> judge -> dial/reuse the origin ->
//              forward head and body -> relay the response -> next request
//   hello      CONNECT answered 200; the first bytes decide: a ClientHello
//              is tunnelled (passthrough) or decrypted, HTTP is served in the
//              clear, anything else is relayed opaquely
//   handshake  TLS with the client (decrypting), then back to http
//   tunnel     bytes both ways (passthrough, opaque, or after a 101)
//   lingering  answered and shut down: discard input until EOF, then close
//
// Decisions: whether a request, a CONNECT or a tunnel may go on, and how, is
// admission's (proxy/policy/admission.h, pure); this class gathers the facts,
// applies the Decision and records it (metrics, log lines, the rows' fields).
// The texts it answers with are the answers catalogue's (proxy/http/answers.h);
// their bytes on the wire are the codec's (below).
//
// The origin side up to a connected Stream (pool lookup, DNS, the address
// list and its attempts) is the OriginDialer's (origin_dialer.h); this class
// implements its DialOwner, keeps the deferral of a dial that failed at once
// (reported by its timer) and owns the origin Stream once it is handed over.
//
// The relay of the tunnel mode (bytes both ways, half-closes, the counters,
// the bytes held while its origin connects, its row) is the Tunnel's
// (tunnel.h): this class stays the handler of both Streams, passes it their
// events and applies what it returns (a pause, the close).
//
// The credential flow (the rule an exchange injects for, the token written
// into its head, the body kept for a 401 replay and the replay-once rule,
// their row fields) is CredentialFlow's, one per exchange, and the wait for a
// token from the store is CredentialWait's (credential_flow.h): this class
// asks admission again when a mint ends, answers, counts, pauses the client
// while a token is awaited and cancels the wait when it answers or closes.
//
// The exchange in flight (one request: its facts, its response's progress
// and its one Network Log row, begun once and finished once) is the
// Exchange's (exchange.h): this class records into it what happened and
// appends the row it finishes, with this connection's ConnFields (peer,
// attribution, the stamp's fields).
//
// The client's protocol (reading request heads and bodies, the pipelined
// bytes and their replay's turns, keep-alive, and serialising what is sent
// back: the proxy's answers, the 407, the origin's response head rewritten
// for the client, a CONNECT's 200) is the ClientCodec's (client_codec.h;
// HTTP/1 is client_http1.h), held through the interface: this class keeps
// the request state (Req), feeds the codec the client's bytes and applies
// what it returns (a head to judge, an error to answer, a pause), decides
// what to answer and whether the connection closes after it, writes the
// bytes the codec encodes and counts them into the exchange's row.
//
// Ownership: the Server allocates a Connection per accepted socket. The
// Connection owns its client Stream, timer and dialer by value and its origin
// Stream by pointer once connected (a retired origin closes and frees
// itself; one still being dialled is the dialer's). close() is the one kill
// point; the object frees itself after the last close callback.
#pragma once

#include <uv.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/net.h"
#include "proxy/http/answers.h"
#include "proxy/http/parser.h"
#include "proxy/inject/rules.h"
#include "proxy/inject/store.h"
#include "proxy/io/stream.h"
#include "proxy/netlog/error_kind.h"
#include "proxy/netlog/row.h"
#include "proxy/policy/admission.h"
#include "proxy/policy/pattern.h"
#include "proxy/server/client_codec.h"
#include "proxy/server/credential_flow.h"
#include "proxy/server/deadline.h"
#include "proxy/server/exchange.h"
#include "proxy/server/origin_dialer.h"
#include "proxy/server/tunnel.h"

namespace fy::proxy {

class Server;

class Connection final : public StreamHandler, private DialOwner {
 public:
  Connection(Server& srv, uint64_t id);
  ~Connection() override;

  // Takes the pending connection of `listener`. False when it failed (the
  // connection is then closing).
  bool accept(uv_stream_t* listener);
  // The policy changed (or a deadline passed): close what the policy now
  // refuses or would now decrypt.
  void rejudge(int64_t now_ms);
  // SIGTERM: finish the current exchange, then close.
  void drain();
  // The kill point. `why` is logged at debug level.
  void close(std::string_view why);

  uint64_t id() const { return id_; }
  bool closing() const { return closing_; }

  Connection* prev = nullptr;  // the server's list
  Connection* next = nullptr;

 private:
  using Mode = ConnMode;  // the states of the comment at the top (deadline.h's table)
  // wait: the head is parsed and judged, a credential is being minted; the
  // body (if any) waits in the stash until the head goes out.
  enum class Req : uint8_t { head, wait, body, done };
  enum class Resp : uint8_t { none, head, body };
  // Why a side is not being read; reading resumes when the mask is empty.
  enum PauseReason : uint8_t { kPeerFull = 1, kStashFull = 2, kWaitCredential = 4 };

  const http::Limits& req_limits() const;
  const http::Limits& resp_limits() const;

  // StreamHandler.
  void on_read(Stream& s, const ChunkRef& c, const char* p, size_t n) override;
  void on_eof(Stream& s) override;
  void on_error(Stream& s, Errc kind, const std::string& detail) override;
  void on_ready(Stream& s) override;
  void on_drain(Stream& s) override;
  void on_shutdown(Stream& s) override;
  void on_closed(Stream& s) override;

  // DialOwner (the dialer's callbacks come from the loop, never from inside
  // dial()).
  bool descriptor_spare() override;
  void on_dialed(Stream& s) override;
  void on_dial_failed(DialFailure f) override;

  // Client side.
  void on_client_bytes(const ChunkRef& c, const char* p, size_t n);
  void process_client(const ChunkRef& c, const char* p, size_t n);
  void on_request_head(std::string_view head);
  // The facts admission reads of this connection.
  admission::Principal principal() const;
  admission::BuildProof build_proof() const;
  // Apply admission's Decision for a request head / the first bytes after a
  // CONNECT's 200; they ask nothing of the policy themselves.
  void apply_request(const admission::Decision& d);
  void establish(const admission::Decision& d);
  void on_hello_bytes(const char* p, size_t n);
  void apply_hello(const admission::Decision& d);
  void start_tunnel(TunnelKind kind);
  void start_decrypt(const std::string& sni);
  // Sends the request head upstream (dialling when needed); `token`, when
  // set, is written as the exchange's rule says (header or query parameter).
  void forward_request(const HostPort& dest, policy::Kind kind, std::string_view target,
                       const std::string* token = nullptr);
  // Credential injection, held dummies, overlaps, build secrets (issue 3).
  void inject(const inject::Rule& rule, const HostPort& dest, policy::Kind kind,
              std::string_view target);
  void on_credential(const inject::MintOutcome& out);
  void answer_mint_failure(const std::string& reason, bool after_401);
  void answer_proxy_auth(const std::string& key, bool close_after);
  void note_build_claim();
  // The 401 replaced (ex_.cred's Verdict::replace) is read: mint once more
  // (forced) and send the request again, head and kept body.
  void replay_after_401();
  void on_request_complete();
  void replay_stash();

  // Origin side.
  void on_origin_bytes(const ChunkRef& c, const char* p, size_t n);
  void on_response_head(std::string_view head);
  void on_response_complete();
  // Dials dest (with TLS when `tls`) through dialer_; a pooled connection
  // becomes origin_ at once. `use_pool`: an idle pooled cleartext connection
  // may serve (HTTP requests only, never a tunnel). Failures arrive later
  // (origin_failed), never from inside dial().
  void dial(const HostPort& dest, bool tls, bool use_pool = false);
  void defer_origin_failure(Errc kind, std::string detail);
  // The origin Stream bytes go to: the connected one, else the one being
  // dialled (the dialer's, borrowed until its next callback); null for none.
  Stream* origin_out() const { return origin_ ? origin_ : dialer_.stream(); }
  // Drops the origin connection (and cancels a dial): into the pool when
  // `reusable` and it is idle, healthy and cleartext; closed otherwise.
  void retire_origin(bool reusable = false);
  // `row_kind`: the Network Log's kind when it is not `kind`'s own (a
  // certificate refused is Errc::tls, written tls_verify).
  void origin_failed(Errc kind, const std::string& detail,
                     std::optional<netlog::ErrorKind> row_kind = std::nullopt);
  // Answers the exchange in flight 502 (504 for a timeout) with `reason`.
  void fail_exchange(Errc kind, const std::string& reason, const std::string& dest);
  bool retry_on_fresh_origin();

  // Answers and rows.
  // Writes `reply` (the answers catalogue's), writes the exchange's row and
  // resets the exchange; closes (lingers) after it when `close_after`, when
  // draining, or when the client will not keep the connection alive.
  void answer(answers::Reply reply, bool close_after);
  void answer_parse_error(const http::ParseError& e);
  void refuse(const std::string& key, bool close_after);
  void log_would_block(const std::string& key, std::string_view method);
  // This connection's fields of its rows (exchange.h).
  ConnFields conn_fields() const;
  // Begins the exchange's row (ex_.begin) at this moment.
  void begin_row(std::string_view method);
  // Appends the exchange's finished row (ex_.finish), when one is begun.
  void write_exchange_row();
  // The tunnel's row (tunnel_.row()), with this connection's fields.
  void write_tunnel_row();
  // Binds the connection to its first head's stamp (once; later calls do
  // nothing). `parsed` is the head as llhttp read it, or null when it could
  // not be parsed; then `raw` (possibly empty) is scanned line by line.
  void bind_first_head(std::string_view raw, const http::Head* parsed);

  // Flow control and lifecycle.
  void pause_client(uint8_t reason);
  void resume_client(uint8_t reason);
  void pause_origin(uint8_t reason);
  void resume_origin(uint8_t reason);
  void linger();
  void finish_tunnel_if_done();
  void touch();
  // What deadline.h's table reads of this connection; arm_timer() and
  // handle_timer() both ask next_deadline() with it, so they always agree.
  ConnTimes times() const;
  void arm_timer();
  // A setup phase (hello, handshake, first_bytes) ran out: counted, logged
  // (rate-limited) and written as a row that says what did not arrive.
  void setup_timed_out(Phase phase);
  static void on_timer(uv_timer_t* t);
  void handle_timer();
  static void on_timer_closed(uv_handle_t* h);
  void maybe_release();

  Server& srv_;
  uint64_t id_;
  Stream client_;
  Stream* origin_ = nullptr;  // connected (or pooled); owned
  OriginDialer dialer_;
  uv_timer_t timer_;
  int pending_closes_ = 0;
  bool closing_ = false;
  bool accepted_ = false;

  Mode mode_ = Mode::http;
  Req req_ = Req::head;
  Resp resp_ = Resp::none;
  uint8_t client_pause_ = 0;
  uint8_t origin_pause_ = 0;
  std::string peer_;

  // Timing (uv_now, ms).
  uint64_t accepted_ms_ = 0;
  uint64_t last_io_ms_ = 0;
  uint64_t head_start_ms_ = 0;  // 0: no byte of the next head yet
  uint64_t mode_start_ms_ = 0;  // hello / handshake / lingering / tunnel start
  uint64_t setup_start_ms_ = 0;  // a CONNECT's 200: hello and handshake count from it
  uint64_t origin_ready_ms_ = 0;  // a blind tunnel's origin connected (first_bytes counts from it)

  // Destination of a CONNECT (decrypted, cleartext or tunnelled inside it).
  bool in_connect_ = false;
  bool implicit_only_ = false;  // the CONNECT was admitted only for injection
  HostPort connect_dest_;
  policy::Kind inner_kind_ = policy::Kind::https;
  std::string sni_;
  std::string tls_mode_;  // "decrypted", "passthrough", "plain", "opaque"
  std::string hello_;     // bytes read while waiting for the ClientHello
  // The relay of a passthrough or opaque CONNECT, or an upgrade (tunnel.h):
  // its state and row; this connection feeds it the Streams' events while
  // mode_ is tunnel and applies what it returns (pauses, the close).
  Tunnel tunnel_;
  bool build_ = false;         // the connection proved a build secret
  bool build_marker_ = false;  // it presented the (public) build marker
  bool proxy_auth_seen_ = false;
  CredentialWait cred_wait_;   // a credential this connection waits for
  bool client_eof_ = false;
  bool origin_eof_ = false;

  // Attribution (bound at the first head).
  bool first_head_ = true;
  netlog::Attribution attribution_ = netlog::Attribution::none;
  std::string st_src_, st_net_, st_who_, st_boot_;
  uint64_t st_seq_ = 0;

  // The client's protocol (client_codec.h): request heads and bodies, the
  // pipelined bytes, keep-alive. HTTP/1 today (client_http1.h).
  std::unique_ptr<ClientCodec> codec_;

  // The origin.
  HostPort origin_dest_;
  bool origin_tls_ = false;
  bool origin_fresh_ = true;  // no exchange has used it yet
  bool out_of_files_ = false;  // the dial found no descriptor to spare: 503, not 502
  // The eager dial of a decrypted tunnel (started while the client
  // handshakes) is the origin the first request will use; until that request
  // is forwarded, the dial's failure is kept for it in early_failure_. An
  // idle kept-alive origin failing between requests is not: it is retired,
  // and the next request dials again.
  bool eager_dial_ = false;
  std::string early_failure_;  // the eager dial of a decrypted tunnel failed
  std::string deferred_failure_;  // a dial that failed at once, reported by the timer
  Errc deferred_failure_kind_ = Errc::connect;
  Errc early_failure_kind_ = Errc::connect;

  // Response parsing.
  http::HeadReader resp_reader_;
  http::Parser resp_parser_;
  http::Head resp_head_;

  // The exchange in flight and its row (exchange.h).
  Exchange ex_;
};

}  // namespace fy::proxy
