// fy-dnsfwd's decisions, pure (no I/O, no loop): the TCP framing of DNS
// messages, the per-source rate bound, the judgement of one query (parse it
// strictly with wall/dns, bound it, allow only names the policy could allow),
// and the check of the upstream's answer before it is relayed. The daemon
// (server.h) only applies what these return; the unit tests and the fuzz
// target drive them without a loop.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "wall/dns.h"

namespace fy::dnsfwd {

// A token bucket per source address: `rate` queries a second, up to `burst`
// at once. At most `max_sources` buckets are kept; a new source beyond that
// evicts the one seen least recently (so a flood of spoofed sources cannot
// lock out a real one for longer than it takes to be seen again).
class RateBound {
 public:
  RateBound(double rate, double burst, size_t max_sources)
      : rate_(rate), burst_(burst), max_sources_(max_sources) {}
  // Takes one token from `source`'s bucket; false when it is empty.
  bool take(std::string_view source, uint64_t now_ms);
  size_t sources() const { return buckets_.size(); }
  // A reload's new bounds. The buckets kept: none holds more than the new
  // burst; a source keeps what it has spent (a reload is no refill).
  void set_limits(double rate, double burst, size_t max_sources);

 private:
  struct Bucket {
    double tokens = 0;
    uint64_t last_ms = 0;
  };
  double rate_;
  double burst_;
  size_t max_sources_;
  std::unordered_map<std::string, Bucket> buckets_;
};

struct Policy {
  // Names the proxy's policy could allow, as suffixes (wall::dns::name_allowed):
  // lowercase, no final dot. Empty: no name is resolved.
  std::vector<std::string> allow;
  size_t max_query = wall::dns::kMaxQuery;  // bytes of one query, <= kMaxQuery
  double rate = 20;                          // queries a second per source
  double burst = 40;
  size_t max_sources = 4096;
};

enum class Action {
  forward,  // send the query upstream (under a fresh id)
  answer,   // send `answer` back (REFUSED for a name the policy cannot allow)
  drop,     // send nothing: not DNS, or over the source's rate
};

struct Verdict {
  Action action = Action::drop;
  const char* verdict = "";  // the log's word: forwarded, refused, malformed, rate-limited, too-large
  std::string reason;        // why, for refused/malformed/too-large
  wall::dns::Query query;    // valid when action != drop or verdict is rate-limited
  bool parsed = false;
  std::vector<uint8_t> answer;
};

// Judges one message a client sent. The rate bound is charged first (a
// flood of malformed bytes costs the sender its own budget, and nothing is
// parsed over it), then the size, then the grammar, then the name.
Verdict judge(std::span<const uint8_t> wire, std::string_view source, uint64_t now_ms,
              const Policy& policy, RateBound& rate);

// Checks the upstream's reply to a query we sent as `sent` (the client's
// bytes with our id) before it is relayed: a response (QR), one question
// equal to the query's (name compared case-insensitively), at most `limit`
// bytes. Returns the bytes to relay, with the client's id restored; over
// `limit`, the header and question alone with TC set (the client retries
// over TCP). Anything else is an error (the caller answers SERVFAIL).
Result<std::vector<uint8_t>> check_response(std::span<const uint8_t> resp,
                                            std::span<const uint8_t> sent,
                                            const wall::dns::Query& q, uint16_t client_id,
                                            size_t limit);

// The largest UDP answer a client takes: 512 without EDNS, else the size its
// OPT record advertises, clamped to [512, 1232] (the DNS flag day's value).
size_t udp_answer_limit(std::span<const uint8_t> wire, const wall::dns::Query& q);

// The largest DNS message over TCP (its two-byte length): the limit of a TCP
// client's answer, and the TcpFramer bound of the upstream's TCP answers.
inline constexpr size_t kTcpAnswerMax = 65535;

// DNS over TCP: each message is preceded by its length, two bytes, big
// endian (RFC 1035 4.2.2). Feeds bytes as they arrive; a message longer than
// `max` is an error (the caller closes the connection: it is not a DNS
// client), as is a zero length.
class TcpFramer {
 public:
  explicit TcpFramer(size_t max) : max_(max) {}
  // Appends `bytes`; then next() yields complete messages in order.
  Result<void> feed(std::span<const uint8_t> bytes);
  // The next complete message, or an empty span. Valid until the next feed().
  std::span<const uint8_t> next();
  size_t buffered() const { return buf_.size() - at_; }

 private:
  size_t max_;
  std::vector<uint8_t> buf_;
  size_t at_ = 0;
  Result<void> state_;
};

// "A", "TXT", ... or the number.
std::string qtype_name(uint16_t t);

}  // namespace fy::dnsfwd
