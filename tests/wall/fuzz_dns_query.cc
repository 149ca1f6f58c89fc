// libFuzzer target: the DNS forwarder's query parser over arbitrary bytes
// (a walled client's datagram to port 53), and what it builds from a query it
// accepts. Invariants checked: an accepted query's name is within bounds and
// made of label bytes only, and the local answer parses as a response of the
// same question.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "wall/dns.h"

using namespace fy::wall::dns;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> wire(data, size);
  auto q = parse_query(wire);
  if (!q) return 0;
  if (q->name.size() > kMaxName || q->question_end > size) abort();
  for (char c : q->name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
      abort();
  }
  (void)name_allowed(q->name, {"example.com", "github.com"});
  std::vector<uint8_t> a = local_answer(wire, *q, 5);
  if (a.size() != q->question_end || !(a[2] & 0x80) || (a[3] & 0xF) != 5) abort();
  a[2] &= 0x7F;  // as a query again: the same question
  a[3] &= 0xF0;
  auto again = parse_query(a);
  if (a.size() >= 17 && (!again || again->name != q->name || again->qtype != q->qtype)) abort();
  return 0;
}
