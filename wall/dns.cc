#include "wall/dns.h"

namespace fy::wall::dns {
namespace {

uint16_t be16(std::span<const uint8_t> w, size_t at) {
  return static_cast<uint16_t>((w[at] << 8) | w[at + 1]);
}

bool label_byte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '_';
}

}  // namespace

Result<Query> parse_query(std::span<const uint8_t> w) {
  if (w.size() < 17) return make_error(Errc::parse, "{} bytes: shorter than a DNS query", w.size());
  if (w.size() > kMaxQuery) {
    return make_error(Errc::too_large, "{} bytes: a query is at most {}", w.size(), kMaxQuery);
  }
  Query q;
  q.id = be16(w, 0);
  q.flags = be16(w, 2);
  if (q.flags & 0x8000) return make_error(Errc::parse, "QR set: a response, not a query");
  if ((q.flags >> 11) & 0xF) return make_error(Errc::parse, "opcode {}: only QUERY", (q.flags >> 11) & 0xF);
  if (q.flags & 0x0200) return make_error(Errc::parse, "TC set in a query");
  if (q.flags & 0x000F) return make_error(Errc::parse, "RCODE {} in a query", q.flags & 0xF);
  if (be16(w, 4) != 1) return make_error(Errc::parse, "QDCOUNT {}: exactly one question", be16(w, 4));
  if (be16(w, 6) != 0 || be16(w, 8) != 0) {
    return make_error(Errc::parse, "answer or authority records in a query");
  }
  const uint16_t arcount = be16(w, 10);
  if (arcount > 1) return make_error(Errc::parse, "ARCOUNT {}: at most one (EDNS OPT)", arcount);
  size_t at = 12;
  for (;;) {
    if (at >= w.size()) return make_error(Errc::parse, "the name runs past the end");
    const uint8_t len = w[at++];
    if (len == 0) break;
    if (len & 0xC0) return make_error(Errc::parse, "label type 0x{:02x}: no pointers or extended labels", len & 0xC0);
    if (len > 63) return make_error(Errc::parse, "a label of {} bytes: at most 63", len);
    if (at + len > w.size()) return make_error(Errc::parse, "a label runs past the end");
    if (q.name.size() + (q.name.empty() ? 0 : 1) + len > kMaxName) {
      return make_error(Errc::parse, "the name is longer than {} characters", kMaxName);
    }
    if (!q.name.empty()) q.name += '.';
    for (size_t i = 0; i < len; ++i) {
      uint8_t c = w[at + i];
      if (!label_byte(c)) return make_error(Errc::parse, "byte 0x{:02x} in a label: not a host name", c);
      q.name += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    at += len;
  }
  if (at + 4 > w.size()) return make_error(Errc::parse, "the question has no type and class");
  q.qtype = be16(w, at);
  q.qclass = be16(w, at + 2);
  at += 4;
  q.question_end = at;
  if (q.qclass != 1) return make_error(Errc::parse, "class {}: only IN", q.qclass);
  if (arcount == 1) {
    // OPT: root name, type 41, class = UDP size, TTL = extended rcode and flags, rdata.
    if (at + 11 > w.size()) return make_error(Errc::parse, "the additional record is cut short");
    if (w[at] != 0 || be16(w, at + 1) != 41) {
      return make_error(Errc::parse, "the additional record is not an EDNS OPT at the root");
    }
    const size_t rdlen = be16(w, at + 9);
    at += 11;
    if (at + rdlen != w.size()) return make_error(Errc::parse, "the OPT record's length does not end the query");
    at += rdlen;
    q.edns = true;
  }
  if (at != w.size()) return make_error(Errc::parse, "{} bytes after the question", w.size() - at);
  return q;
}

bool name_allowed(std::string_view name, const std::vector<std::string>& suffixes) {
  for (const std::string& s : suffixes) {
    if (s.empty() || name.size() < s.size()) continue;
    if (name.substr(name.size() - s.size()) != s) continue;
    if (name.size() == s.size() || name[name.size() - s.size() - 1] == '.') return true;
  }
  return false;
}

std::vector<uint8_t> local_answer(std::span<const uint8_t> wire, const Query& q, uint8_t rcode) {
  std::vector<uint8_t> out(wire.begin(), wire.begin() + static_cast<ptrdiff_t>(q.question_end));
  const uint16_t flags = static_cast<uint16_t>(0x8000 | (q.flags & 0x0110) | 0x0080 | (rcode & 0xF));
  out[2] = static_cast<uint8_t>(flags >> 8);
  out[3] = static_cast<uint8_t>(flags);
  for (size_t i = 6; i < 12; ++i) out[i] = 0;  // no answer, authority or additional records
  return out;
}

}  // namespace fy::wall::dns
