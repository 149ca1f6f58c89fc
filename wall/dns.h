// The DNS forwarder's judgement of a query, pure: parsing the bytes a walled
// client sent as a DNS query, strictly (anything that is not one well-formed
// standard query is refused, so port 53 carries only DNS), deciding whether
// the policy could allow its name, and building the answer the forwarder
// gives when it does not forward. No I/O; the daemon that applies it is not
// built yet (docs/fy-wall.md, "Not done here").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace fy::wall::dns {

inline constexpr size_t kMaxQuery = 512;  // a UDP query; EDNS buffer sizes do not widen it
inline constexpr size_t kMaxName = 253;   // presentation form, without the final dot

struct Query {
  uint16_t id = 0;
  uint16_t flags = 0;    // as received (RD, AD, CD may be set)
  std::string name;      // lowercase, dotted, no final dot; "" is the root
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  bool edns = false;     // one OPT record in the additional section
  size_t question_end = 0;  // offset just past the question (the answer echoes it)
};

// Parses one standard query. Refused (Errc::parse, with the reason): fewer
// than 12 + 5 bytes or more than kMaxQuery; QR set (a response); an opcode
// other than QUERY; TC set; a non-zero RCODE; QDCOUNT other than 1; any answer
// or authority record; more than one additional record, or one that is not an
// OPT at the root; a compression pointer or label type other than a plain
// label; an empty label before the end; a label longer than 63 or a name
// longer than kMaxName; a byte in a label outside letters, digits, '-' and
// '_'; a class other than IN; trailing bytes.
Result<Query> parse_query(std::span<const uint8_t> wire);

// Whether `name` is one of `suffixes` or below one ("example.com" allows
// "example.com" and "a.example.com", not "badexample.com"). Suffixes are
// lowercase without a final dot; "" allows nothing.
bool name_allowed(std::string_view name, const std::vector<std::string>& suffixes);

// The answer the forwarder gives itself: the query's header and question
// with QR and RA set, no records, and `rcode` (5 REFUSED, 3 NXDOMAIN, 2
// SERVFAIL). `wire` must be the bytes `q` was parsed from.
std::vector<uint8_t> local_answer(std::span<const uint8_t> wire, const Query& q, uint8_t rcode);

}  // namespace fy::wall::dns
