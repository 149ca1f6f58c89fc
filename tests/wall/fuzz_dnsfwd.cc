// libFuzzer target: fy-dnsfwd's path over a client's bytes, which is more than
// wall/dns's parser (fuzz_dns_query): TCP framing, the judgement with its
// rate and size bounds, and the check of an upstream answer. The first byte
// picks how the rest is cut; the input is fed to a TcpFramer in pieces, every
// message judged, and each query the judge forwards is answered with the
// remaining bytes as the upstream's reply. Invariants: a forwarded query's
// name is allowed and within bounds; a refusal is the query's own question
// with REFUSED; a relayed answer carries the client's id and, over the
// limit, only the question with TC. The bytes are also read as an allow
// file (parse_allow_file).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "wall/dnsfwd/config.h"
#include "wall/dnsfwd/judge.h"

using namespace fy::dnsfwd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t cut = 1 + data[0] % 64;
  std::span<const uint8_t> rest(data + 1, size - 1);
  Policy p;
  p.allow = {"github.com", "example"};
  p.rate = 1000;
  p.burst = 1000;
  RateBound rate(p.rate, p.burst, 4);
  // The same bytes as one datagram.
  Verdict dv = judge(rest, "a", 0, p, rate);
  if (dv.action == Action::forward) {
    if (!fy::wall::dns::name_allowed(dv.query.name, p.allow)) abort();
    auto out = check_response(rest, rest, dv.query, 0xABCD, udp_answer_limit(rest, dv.query));
    if (out && ((*out)[0] != 0xAB || (*out)[1] != 0xCD)) abort();
    if (out && out->size() > udp_answer_limit(rest, dv.query)) abort();
  }
  if (dv.action == Action::answer &&
      (dv.answer.size() != dv.query.question_end || (dv.answer[3] & 0xF) != 5))
    abort();
  // As a TCP stream, in pieces of `cut` bytes.
  TcpFramer f(p.max_query);
  for (size_t at = 0; at < rest.size(); at += cut) {
    auto piece = rest.subspan(at, std::min(cut, rest.size() - at));
    if (!f.feed(piece)) break;
    for (auto m = f.next(); !m.empty(); m = f.next()) {
      if (m.size() > p.max_query) abort();
      Verdict v = judge(m, "b", at, p, rate);
      if (v.action == Action::forward && v.query.name.size() > fy::wall::dns::kMaxName) abort();
    }
  }
  // The same bytes as an allow file (the one fy-dnsfwd-allow renders on the
  // host and SIGHUP re-reads): every name it accepts is a normalized host name
  // that allows itself.
  std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());
  if (auto names = parse_allow_file(text, "fuzz.txt")) {
    for (const std::string& n : *names) {
      if (n.empty() || !fy::wall::dns::name_allowed(n, *names)) abort();
    }
  }
  return 0;
}
