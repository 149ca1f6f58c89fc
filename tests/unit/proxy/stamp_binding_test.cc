// Binding a connection to its first head's stamp (proxy/policy/stamp_binding.h):
// the raw line scanner a head llhttp refused is read with, and the outcomes
// of binding, with real stamps under a real key.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/stamp.h"
#include "proxy/policy/stamp_binding.h"

namespace sb = fy::stamp_binding;
namespace stamp = fy::stamp;
using fy::netlog::Attribution;

namespace {

const std::string kKey(32, '\x5a');

std::string stamp_for(uint64_t seq, const std::string& key = kKey) {
  stamp::Fields f;
  f.src = "10.89.1.7";
  f.net = "podman1";
  f.who = "user";
  f.seq = seq;
  f.boot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
  return stamp::format(f, key);
}

}  // namespace

TEST_CASE("scan_raw: one stamp line in a canonical head") {
  auto f = sb::scan_raw("BREW /pot HTTP/1.1\r\nHost: a.test\r\nFy-Stamp:  v=1;x  \r\n"
                        "Accept: */*\r\n\r\n");
  CHECK(f.count == 1);
  CHECK(f.value == "v=1;x");  // optional whitespace trimmed both sides
}

TEST_CASE("scan_raw: the name in any case, every stamp line counted, the last kept") {
  auto f = sb::scan_raw("GET / HTTP/1.1\r\nfy-stamp: a\r\nFY-STAMP: b\r\n\r\n");
  CHECK(f.count == 2);
  CHECK(f.value == "b");
}

TEST_CASE("scan_raw: what is not a stamp field") {
  // The request line is never a field, even when it looks like one.
  CHECK(sb::scan_raw("Fy-Stamp: a\r\nHost: a.test\r\n\r\n").count == 0);
  // Another name that ends or starts like it.
  CHECK(sb::scan_raw("GET / HTTP/1.1\r\nX-Fy-Stamp: a\r\nFy-Stamps: b\r\n\r\n").count == 0);
  // A space before the colon makes another name (the forwarder never writes one).
  CHECK(sb::scan_raw("GET / HTTP/1.1\r\nFy-Stamp : a\r\n\r\n").count == 0);
  // A line with no colon is skipped, and the scan goes on past it.
  auto f = sb::scan_raw("GET / HTTP/1.1\r\nno colon here\r\nFy-Stamp: c\r\n\r\n");
  CHECK(f.count == 1);
  CHECK(f.value == "c");
  // Lines are CRLF lines only: a bare LF does not start one.
  CHECK(sb::scan_raw("GET / HTTP/1.1\r\nA: b\nFy-Stamp: d\r\n\r\n").count == 0);
  // Nothing at all (a head that never arrived).
  CHECK(sb::scan_raw("").count == 0);
  CHECK(sb::scan_raw("GET / HTTP/1.1").count == 0);
}

TEST_CASE("scan_raw: a line is read only once its CRLF has arrived") {
  CHECK(sb::scan_raw("GET / HTTP/1.1\r\nFy-Stamp: partial").count == 0);
  auto f = sb::scan_raw("GET / HTTP/1.1\r\nFy-Stamp: whole\r\nHost: a.te");
  CHECK(f.count == 1);
  CHECK(f.value == "whole");
}

TEST_CASE("find: the stamp fields among parsed fields") {
  std::vector<fy::http::Header> h = {{"Host", "a.test"}, {"fy-stamp", "v"}};
  auto f = sb::find(h);
  CHECK(f.count == 1);
  CHECK(f.value == "v");
  h.push_back({"Fy-Stamp", "w"});
  CHECK(sb::find(h).count == 2);
  CHECK(sb::find({}).count == 0);
}

TEST_CASE("bind: every outcome") {
  stamp::ReplayGuard guard;
  // No key: attribution is not expected, whatever the head carries.
  std::string v1 = stamp_for(1);
  auto b = sb::bind({v1, 1}, "", guard);
  CHECK(b.outcome == sb::Outcome::not_expected);
  CHECK(b.attribution == Attribution::none);

  b = sb::bind({{}, 0}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::none);
  CHECK(b.attribution == Attribution::unattributed);

  b = sb::bind({v1, 2}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::several);
  CHECK(b.attribution == Attribution::unattributed);

  b = sb::bind({"v=1;garbage", 1}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::invalid);
  CHECK(b.attribution == Attribution::unattributed);
  CHECK(!b.error.empty());

  // Another key's stamp does not verify (and is not remembered).
  std::string other = stamp_for(1, std::string(32, '\x01'));
  b = sb::bind({other, 1}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::invalid);

  b = sb::bind({v1, 1}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::valid);
  CHECK(b.attribution == Attribution::attributed);
  CHECK(b.fields.src == "10.89.1.7");
  CHECK(b.fields.net == "podman1");
  CHECK(b.fields.who == "user");
  CHECK(b.fields.seq == 1);

  // The same (boot, seq) again: a copied stamp.
  b = sb::bind({v1, 1}, kKey, guard);
  CHECK(b.outcome == sb::Outcome::replayed);
  CHECK(b.attribution == Attribution::unattributed);
  CHECK(b.fields.seq == 1);

  CHECK(sb::bind({stamp_for(2), 1}, kKey, guard).outcome == sb::Outcome::valid);
}
