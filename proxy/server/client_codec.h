// The client side's protocol, behind an interface: how a connection's
// requests are read from the client's bytes (heads, bodies, errors), what
// waits while one is in flight (pipelined bytes), and whether the client
// keeps the connection for another request. HTTP/1 is Http1ClientCodec
// (client_http1.h); another protocol can stand beside it without the
// exchange (exchange.h) or the connection's roles changing.
//
// The cut follows tunnel.h's: the codec owns no handle, never writes,
// pauses, answers or closes; each step changes only the codec and returns
// what the owner must do. The Connection stays the handler of the client
// Stream, keeps the request state (which of head/body/done it reads) and
// the timer, and answers errors with the answers catalogue.
//
// What the proxy sends the client is serialised here too (the encode_*
// calls): an answer of its own, the 407 challenge, the origin's response
// head rewritten for the client, a CONNECT's 200. The codec returns the
// bytes and nothing else; the Connection decides what to answer and when
// (admission's Decision), whether the connection closes after it, writes
// the bytes and counts exactly their size into the exchange's row.
//
// Heads and errors are handed over as http::Head and http::ParseError
// (proxy/http/parser.h): the parsed request admission judges and the head
// forwarded to the origin, whatever protocol the client spoke.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/buffer.h"
#include "proxy/http/answers.h"
#include "proxy/http/parser.h"

namespace fy::proxy {

class ClientCodec {
 public:
  virtual ~ClientCodec() = default;

  // --- A request head.
  struct HeadRead {
    enum class Status : uint8_t { need_more, head, error };
    Status status = Status::need_more;
    size_t used = 0;        // bytes of the input consumed (head: the head's)
    std::string_view head;  // head: its bytes, in the input or the codec's
                            // buffer, valid until the next read_head()
    http::ParseError error;  // error: what to answer (the connection closes)
  };
  // Reads the next request head from `in`, the bytes after those read so far.
  virtual HeadRead read_head(std::string_view in) = 0;
  // Some bytes of the next head arrived.
  virtual bool head_started() const = 0;

  enum class Parsed : uint8_t { unparsed, bad_framing, ok };
  // Parses `head` (from read_head) into head(). unparsed: head() is not to be
  // read; bad_framing: head() is read but the request is refused; both set
  // `*err`.
  virtual Parsed parse_head(std::string_view head, http::ParseError* err) = 0;
  // The request head being handled; its views are into the read bytes until
  // keep_head().
  virtual http::Head& head() = 0;
  // The head outlives this read (a credential awaited, a 401 replayed): its
  // bytes are copied into the codec and head()'s views moved onto the copy.
  virtual void keep_head() = 0;

  // --- Its body.
  struct BodyRead {
    bool ok = true;
    size_t used = 0;         // ok: bytes of the input that are this request's body
    http::ParseError error;  // !ok: the body is malformed
  };
  virtual BodyRead read_body(const char* p, size_t n) = 0;
  // The request's last byte was read (with the head, or by read_body).
  virtual bool request_complete() const = 0;

  // --- Between requests.
  // The head went upstream: its bytes are no longer read.
  virtual void head_forwarded() = 0;
  // This request is over (answered or responded to): the next one is read.
  virtual void next_request() = 0;
  // Starts over as on a new connection (a CONNECT's 200, a 407's challenge).
  virtual void restart() = 0;
  // Whether the client keeps the connection for another request: its
  // request asked for it, and it has not closed (`client_eof`) with nothing
  // more to serve.
  virtual bool keeps_alive(bool client_eof) const = 0;

  // --- Bytes read while a request is in flight (pipelined), in order.
  // True: over the bound; the owner pauses reading the client until
  // take_stash().
  [[nodiscard]] virtual bool stash(const ChunkRef& c, const char* p, size_t n) = 0;
  virtual bool pipelined() const = 0;
  // Hands every stashed slice over (the stash is empty after).
  virtual std::vector<Slice> take_stash() = 0;
  virtual void drop_stash() = 0;
  // The next pipelined request runs on a later loop turn, never from inside
  // the callback that ended this one. schedule_replay(): when bytes wait.
  virtual void schedule_replay() = 0;
  virtual bool replay_pending() const = 0;
  virtual bool replay_blocked() const = 0;
  // The turn came. True: replay now; false (`client_full`: its answers are
  // not read yet): once the client drains (client_drained()).
  [[nodiscard]] virtual bool replay_turn(bool client_full) = 0;
  // The client drained: true when a blocked replay is pending again (the
  // owner arms its timer).
  virtual bool client_drained() = 0;

  // --- What the proxy writes to the client: the bytes, for the owner to
  // write (and count). None changes the codec's state.
  // An answer of the proxy's own (`reply`: status, body, its content type).
  // `close`: the connection closes after it, and the answer says so.
  virtual std::string encode_answer(const answers::Reply& reply, bool close) const = 0;
  // The 407 to a destination open to builds (`reply`: answers::
  // build_challenge's): encode_answer's, also asking for the build's
  // credential (answers::kBuildChallengeHeader: kBuildChallengeValue).
  virtual std::string encode_challenge(const answers::Reply& reply, bool close) const = 0;
  // The origin's response head `head`, rewritten for the client: its
  // hop-by-hop and stamp fields dropped. `upgrade` (a 101 the request asked
  // for): its Upgrade kept, the connection switches; else `close`: the
  // connection closes after this response, and the head says so. An interim
  // head (1xx other than 101) is encoded with neither.
  virtual std::string encode_response_head(const http::Head& head, bool close,
                                           bool upgrade) const = 0;
  // A CONNECT's answer: the tunnel is open (the bytes that follow are the
  // tunnel's).
  virtual std::string encode_connect_established() const = 0;
};

}  // namespace fy::proxy
