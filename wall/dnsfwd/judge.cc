#include "wall/dnsfwd/judge.h"

#include <algorithm>

#include "core/text.h"

namespace fy::dnsfwd {
namespace {

uint16_t be16(std::span<const uint8_t> w, size_t at) {
  return static_cast<uint16_t>((w[at] << 8) | w[at + 1]);
}

}  // namespace

bool RateBound::take(std::string_view source, uint64_t now_ms) {
  auto it = buckets_.find(std::string(source));
  if (it == buckets_.end()) {
    if (buckets_.size() >= max_sources_ && !buckets_.empty()) {
      auto oldest = std::min_element(buckets_.begin(), buckets_.end(), [](auto& a, auto& b) {
        return a.second.last_ms < b.second.last_ms;
      });
      buckets_.erase(oldest);
    }
    it = buckets_.emplace(std::string(source), Bucket{burst_, now_ms}).first;
  }
  Bucket& b = it->second;
  if (now_ms > b.last_ms) {
    b.tokens = std::min(burst_, b.tokens + rate_ * static_cast<double>(now_ms - b.last_ms) / 1000.0);
    b.last_ms = now_ms;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

void RateBound::set_limits(double rate, double burst, size_t max_sources) {
  rate_ = rate;
  burst_ = burst;
  max_sources_ = max_sources;
  for (auto& [src, b] : buckets_) b.tokens = std::min(b.tokens, burst_);
  while (buckets_.size() > max_sources_) {
    auto oldest = std::min_element(buckets_.begin(), buckets_.end(), [](auto& a, auto& b) {
      return a.second.last_ms < b.second.last_ms;
    });
    buckets_.erase(oldest);
  }
}

Verdict judge(std::span<const uint8_t> wire, std::string_view source, uint64_t now_ms,
              const Policy& policy, RateBound& rate) {
  Verdict v;
  if (!rate.take(source, now_ms)) {
    v.verdict = "rate-limited";
    v.reason = "over the source's rate";
    return v;
  }
  if (wire.size() > policy.max_query) {
    v.verdict = "too-large";
    v.reason = fmt::format("{} bytes: a query is at most {}", wire.size(), policy.max_query);
    return v;
  }
  auto q = wall::dns::parse_query(wire);
  if (!q) {
    v.verdict = "malformed";
    v.reason = q.error().message;
    return v;
  }
  v.query = std::move(*q);
  v.parsed = true;
  if (!wall::dns::name_allowed(v.query.name, policy.allow)) {
    v.action = Action::answer;
    v.verdict = "refused";
    v.reason = "not a name the policy could allow";
    v.answer = wall::dns::local_answer(wire, v.query, 5);
    return v;
  }
  v.action = Action::forward;
  v.verdict = "forwarded";
  return v;
}

Result<std::vector<uint8_t>> check_response(std::span<const uint8_t> resp,
                                            std::span<const uint8_t> sent,
                                            const wall::dns::Query& q, uint16_t client_id,
                                            size_t limit) {
  if (resp.size() < q.question_end || resp.size() < 12) {
    return make_error(Errc::parse, "a {}-byte answer: shorter than its question", resp.size());
  }
  if (be16(resp, 0) != be16(sent, 0)) return make_error(Errc::parse, "the answer's id differs");
  if (!(resp[2] & 0x80)) return make_error(Errc::parse, "the answer is not a response (QR clear)");
  if (((resp[2] >> 3) & 0xF) != 0) return make_error(Errc::parse, "the answer's opcode is not QUERY");
  if (be16(resp, 4) != 1) return make_error(Errc::parse, "the answer has QDCOUNT {}", be16(resp, 4));
  for (size_t i = 12; i < q.question_end; ++i) {
    if (ascii_lower(static_cast<char>(resp[i])) != ascii_lower(static_cast<char>(sent[i]))) {
      return make_error(Errc::parse, "the answer's question is not the query's");
    }
  }
  std::vector<uint8_t> out;
  if (resp.size() > limit) {
    out.assign(resp.begin(), resp.begin() + static_cast<ptrdiff_t>(q.question_end));
    out[2] |= 0x02;  // TC
    for (size_t i = 6; i < 12; ++i) out[i] = 0;
  } else {
    out.assign(resp.begin(), resp.end());
  }
  out[0] = static_cast<uint8_t>(client_id >> 8);
  out[1] = static_cast<uint8_t>(client_id);
  return out;
}

size_t udp_answer_limit(std::span<const uint8_t> wire, const wall::dns::Query& q) {
  if (!q.edns) return 512;
  // The OPT record follows the question: root name (1), type (2), class = size (2).
  const size_t size = be16(wire, q.question_end + 3);
  return std::clamp<size_t>(size, 512, 1232);
}

Result<void> TcpFramer::feed(std::span<const uint8_t> bytes) {
  if (!state_) return state_;
  if (at_ > 0) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(at_));
    at_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
  // Every length visible so far is checked now, so a client that announces
  // 65535 bytes is refused at once rather than after sending them.
  size_t at = 0;
  while (buf_.size() - at >= 2) {
    const size_t len = be16(buf_, at);
    if (len == 0 || len > max_) {
      state_ = make_error(Errc::too_large, "a TCP message of {} bytes: a query is 1..{}", len, max_);
      return state_;
    }
    if (buf_.size() - at - 2 < len) break;
    at += 2 + len;
  }
  return ok();
}

std::span<const uint8_t> TcpFramer::next() {
  if (!state_ || buf_.size() - at_ < 2) return {};
  const size_t len = be16(buf_, at_);
  if (buf_.size() - at_ - 2 < len) return {};
  std::span<const uint8_t> m(buf_.data() + at_ + 2, len);
  at_ += 2 + len;
  return m;
}

std::string qtype_name(uint16_t t) {
  switch (t) {
    case 1: return "A";
    case 2: return "NS";
    case 5: return "CNAME";
    case 6: return "SOA";
    case 12: return "PTR";
    case 15: return "MX";
    case 16: return "TXT";
    case 28: return "AAAA";
    case 33: return "SRV";
    case 64: return "SVCB";
    case 65: return "HTTPS";
    case 255: return "ANY";
    default: return std::to_string(t);
  }
}

}  // namespace fy::dnsfwd
