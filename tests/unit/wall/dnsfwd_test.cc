// fy-dnsfwd's pure half (wall/dnsfwd/judge.h, config.h), without a loop.
#include <doctest/doctest.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>

#include <string>
#include <vector>

#include "wall/dnsfwd/config.h"
#include "wall/dnsfwd/redirect.h"
#include "wall/dnsfwd/judge.h"

using namespace fy::dnsfwd;

namespace {

std::vector<uint8_t> query(const std::string& name, uint16_t qtype = 1, uint16_t id = 0x1234) {
  std::vector<uint8_t> q = {static_cast<uint8_t>(id >> 8), static_cast<uint8_t>(id), 0x01, 0x00,
                            0, 1, 0, 0, 0, 0, 0, 0};
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q.push_back(static_cast<uint8_t>(dot - start));
    q.insert(q.end(), name.begin() + static_cast<long>(start), name.begin() + static_cast<long>(dot));
    start = dot + 1;
  }
  q.push_back(0);
  q.push_back(static_cast<uint8_t>(qtype >> 8));
  q.push_back(static_cast<uint8_t>(qtype));
  q.push_back(0);
  q.push_back(1);
  return q;
}

Policy policy() {
  Policy p;
  p.allow = {"github.com"};
  p.rate = 10;
  p.burst = 2;
  return p;
}

}  // namespace

TEST_CASE("judge: an allowed name is forwarded, another is REFUSED, non-DNS is dropped") {
  Policy p = policy();
  RateBound rate(p.rate, p.burst, 16);
  auto q = query("api.github.com");
  Verdict v = judge(q, "10.0.0.1", 1000, p, rate);
  CHECK(v.action == Action::forward);
  CHECK(v.query.name == "api.github.com");
  auto t = query("mzxw6ytb.t.example", 16);
  v = judge(t, "10.0.0.2", 1000, p, rate);
  CHECK(v.action == Action::answer);
  CHECK(std::string(v.verdict) == "refused");
  REQUIRE(v.answer.size() == t.size());
  CHECK((v.answer[3] & 0xF) == 5);
  CHECK((v.answer[2] & 0x80) != 0);
  const std::string ssh = "SSH-2.0-OpenSSH_9.2\r\n";
  v = judge({reinterpret_cast<const uint8_t*>(ssh.data()), ssh.size()}, "10.0.0.3", 1000, p, rate);
  CHECK(v.action == Action::drop);
  CHECK(std::string(v.verdict) == "malformed");
}

TEST_CASE("judge: the rate is per source, refilled with time; size is bounded") {
  Policy p = policy();
  RateBound rate(p.rate, p.burst, 16);
  auto q = query("github.com");
  CHECK(judge(q, "a", 0, p, rate).action == Action::forward);
  CHECK(judge(q, "a", 0, p, rate).action == Action::forward);
  Verdict v = judge(q, "a", 0, p, rate);
  CHECK(v.action == Action::drop);
  CHECK(std::string(v.verdict) == "rate-limited");
  CHECK(judge(q, "b", 0, p, rate).action == Action::forward);  // its own bucket
  CHECK(judge(q, "a", 100, p, rate).action == Action::forward);  // 10/s: one token in 100 ms
  CHECK(judge(q, "a", 100, p, rate).action == Action::drop);
  p.max_query = 20;
  RateBound r2(100, 100, 16);
  v = judge(q, "c", 0, p, r2);
  CHECK(std::string(v.verdict) == "too-large");
}

TEST_CASE("RateBound keeps at most max_sources buckets, evicting the least recent") {
  RateBound r(1, 1, 2);
  CHECK(r.take("a", 0));
  CHECK(r.take("b", 10));
  CHECK(r.take("c", 20));  // evicts a
  CHECK(r.sources() == 2);
  CHECK(r.take("a", 30));  // a new full bucket
  CHECK_FALSE(r.take("c", 30));
}

TEST_CASE("check_response: the id restored, the question must match, over the limit TC") {
  auto sent = query("api.github.com", 1, 0xBEEF);
  auto q = fy::wall::dns::parse_query(sent);
  REQUIRE(q);
  std::vector<uint8_t> resp = sent;
  resp[2] |= 0x80;
  resp.insert(resp.end(), {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4});
  resp[7] = 1;
  auto out = check_response(resp, sent, *q, 0x1234, 512);
  REQUIRE(out);
  CHECK((*out)[0] == 0x12);
  CHECK((*out)[1] == 0x34);
  CHECK(out->size() == resp.size());
  auto tc = check_response(resp, sent, *q, 0x1234, 20);
  REQUIRE(tc);
  CHECK(tc->size() == q->question_end);
  CHECK(((*tc)[2] & 0x02) != 0);
  auto other = resp;
  other[14] = 'x';  // a different name
  CHECK_FALSE(check_response(other, sent, *q, 1, 512));
  auto notresp = sent;
  CHECK_FALSE(check_response(notresp, sent, *q, 1, 512));
  auto upper = resp;
  upper[13] = 'A';  // 0x20 case: the same name
  CHECK(check_response(upper, sent, *q, 1, 512));
}

TEST_CASE("TcpFramer: split and joined messages; a zero or oversized length refuses") {
  TcpFramer f(512);
  auto q = query("github.com");
  std::vector<uint8_t> wire = {0, static_cast<uint8_t>(q.size())};
  wire.insert(wire.end(), q.begin(), q.end());
  wire.insert(wire.end(), wire.begin(), wire.end());  // two messages
  REQUIRE(f.feed({wire.data(), 5}));
  CHECK(f.next().empty());
  REQUIRE(f.feed({wire.data() + 5, wire.size() - 5}));
  auto m = f.next();
  CHECK(m.size() == q.size());
  CHECK(f.next().size() == q.size());
  CHECK(f.next().empty());
  TcpFramer g(512);
  const uint8_t big[] = {0x10, 0x00, 'x'};
  CHECK_FALSE(g.feed(big));
  CHECK_FALSE(g.feed(big));  // stays refused
  TcpFramer z(512);
  const uint8_t zero[] = {0, 0};
  CHECK_FALSE(z.feed(zero));
}

TEST_CASE("a TCP upstream's large answer: framed in pieces, relayed whole at the TCP limit") {
  auto sent = query("large.github.com", 16, 0xBEEF);
  auto q = fy::wall::dns::parse_query(sent);
  REQUIRE(q);
  std::vector<uint8_t> resp = sent;
  resp[2] |= 0x80;
  resp[7] = 1;
  const size_t rdlen = 8 * 201;  // eight 200-byte strings
  resp.insert(resp.end(), {0xc0, 0x0c, 0, 16, 0, 1, 0, 0, 0, 0,
                           static_cast<uint8_t>(rdlen >> 8), static_cast<uint8_t>(rdlen)});
  for (int i = 0; i < 8; ++i) {
    resp.push_back(200);
    resp.insert(resp.end(), 200, static_cast<uint8_t>('a' + i));
  }
  std::vector<uint8_t> wire = {static_cast<uint8_t>(resp.size() >> 8),
                               static_cast<uint8_t>(resp.size())};
  wire.insert(wire.end(), resp.begin(), resp.end());
  TcpFramer f(kTcpAnswerMax);
  REQUIRE(f.feed({wire.data(), 700}));
  CHECK(f.next().empty());  // more to come
  REQUIRE(f.feed({wire.data() + 700, wire.size() - 700}));
  auto m = f.next();
  REQUIRE(m.size() == resp.size());
  auto whole = check_response(m, sent, *q, 0x1234, kTcpAnswerMax);
  REQUIRE(whole);
  CHECK(whole->size() == resp.size());
  CHECK(((*whole)[2] & 0x02) == 0);
  auto cut = check_response(m, sent, *q, 0x1234, 512);  // a UDP client's limit: TC
  REQUIRE(cut);
  CHECK(cut->size() == q->question_end);
  CHECK(((*cut)[2] & 0x02) != 0);
}

TEST_CASE("udp_answer_limit: 512 without EDNS, the advertised size clamped") {
  auto q = query("github.com");
  auto pq = fy::wall::dns::parse_query(q);
  REQUIRE(pq);
  CHECK(udp_answer_limit(q, *pq) == 512);
  auto e = q;
  e[11] = 1;
  e.insert(e.end(), {0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0});  // 4096
  auto pe = fy::wall::dns::parse_query(e);
  REQUIRE(pe);
  CHECK(udp_answer_limit(e, *pe) == 1232);
}

TEST_CASE("config: every problem at once, with file:line") {
  auto c = parse_config("upstream = [\"192.168.5.3\", \"10.0.0.1:5353\"]\n"
                        "allow = [\"GitHub.com.\"]\n"
                        "[[listen]]\naddress = \"127.42.0.53\"\n"
                        "[[listen]]\naddress = \"10.89.0.1\"\nnetns = \"/run/netns/b\"\n",
                        "f.toml");
  REQUIRE(c);
  CHECK(c->upstream[1].port == 5353);
  CHECK(c->policy.allow == std::vector<std::string>{"github.com"});
  CHECK(c->listen[0].name == "vm");
  CHECK(c->listen[0].address.port == 53);
  CHECK(c->listen[1].name == "/run/netns/b");
  auto bad = parse_config("upstream = [\"x.lan\"]\nrate = -1\nbogus = 1\n", "f.toml");
  REQUIRE_FALSE(bad);
  const std::string m = bad.error().message;
  CHECK(m.find("f.toml:1:") != std::string::npos);
  CHECK(m.find("'x.lan' is not an IP address") != std::string::npos);
  CHECK(m.find("rate") != std::string::npos);
  CHECK(m.find("bogus") != std::string::npos);
  CHECK(m.find("[[listen]]") != std::string::npos);
}

TEST_CASE("RateBound::set_limits: a reload's bounds apply at once, no refill") {
  RateBound r(100, 100, 4);
  for (int i = 0; i < 10; ++i) CHECK(r.take("a", 0));  // 90 left
  CHECK(r.take("b", 0));
  r.set_limits(1, 2, 1);  // max_sources 1: one bucket kept
  CHECK(r.sources() == 1);
  RateBound s(100, 100, 4);
  CHECK(s.take("a", 0));
  s.set_limits(1, 2, 4);
  CHECK(s.take("a", 0));
  CHECK(s.take("a", 0));  // clamped to the new burst: two
  CHECK_FALSE(s.take("a", 0));
  CHECK_FALSE(s.take("a", 500));  // the new rate: 1/s
  CHECK(s.take("a", 1000));
}

TEST_CASE("the allow file: one suffix a line, comments and blanks skipped, errors with line") {
  auto a = parse_allow_file("# rendered\n\nGitHub.com.\n  pypi.org \r\n", "a.txt");
  REQUIRE(a);
  CHECK(*a == std::vector<std::string>{"github.com", "pypi.org"});
  auto bad = parse_allow_file("github.com\nnot a name!\n10.0.0.1\n", "a.txt");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message.find("a.txt:2: 'not a name!'") != std::string::npos);
  CHECK(bad.error().message.find("a.txt:3: '10.0.0.1'") != std::string::npos);
  auto c = parse_config("upstream = [\"192.168.5.3\"]\nallow_file = \"rel.txt\"\n"
                        "[[listen]]\naddress = \"127.42.0.53\"\n",
                        "f.toml");
  REQUIRE_FALSE(c);
  CHECK(c.error().message.find("not an absolute path") != std::string::npos);
}

TEST_CASE("read_allow_file: what --check-allow reads, file:line, under 1 MiB, a missing file said") {
  char dir[] = "/tmp/fy18a-allow-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string good = std::string(dir) + "/good.txt", bad = std::string(dir) + "/bad.txt",
              big = std::string(dir) + "/big.txt";
  auto put = [](const std::string& p, const std::string& t) {
    FILE* f = fopen(p.c_str(), "we");
    REQUIRE(f != nullptr);
    fwrite(t.data(), 1, t.size(), f);
    fclose(f);
  };
  put(good, "# fy-dnsfwd-allow\ngithub.com\n");
  put(bad, "github.com\n\nnot a name\n");
  std::string lots;
  while (lots.size() < (1u << 20)) lots += "a.example\n";
  put(big, lots);
  auto g = read_allow_file(good);
  REQUIRE(g);
  CHECK(*g == std::vector<std::string>{"github.com"});
  auto b = read_allow_file(bad);
  REQUIRE(!b);
  CHECK(b.error().message.find(bad + ":3: 'not a name' is not a host name suffix") != std::string::npos);
  auto l = read_allow_file(big);
  REQUIRE(!l);
  CHECK(l.error().message.find("1 MiB or more") != std::string::npos);
  auto m = read_allow_file(std::string(dir) + "/none.txt");
  REQUIRE(!m);
  CHECK(m.error().message.find("cannot read the allow file") != std::string::npos);
  for (const auto& p : {good, bad, big}) unlink(p.c_str());
  rmdir(dir);
}

TEST_CASE("needs_restart names what a reload keeps as it runs") {
  const char* base = "upstream = [\"192.168.5.3\"]\n[[listen]]\naddress = \"127.42.0.53\"\n";
  auto a = parse_config(base, "f.toml");
  auto b = parse_config("rate = 1\nallow = [\"x.org\"]\n" + std::string(base), "f.toml");
  auto c = parse_config("upstream = [\"192.168.5.4\"]\nlog = \"/x\"\n[[listen]]\n"
                        "address = \"127.42.0.54\"\n",
                        "f.toml");
  REQUIRE((a && b && c));
  CHECK(needs_restart(*a, *b) == "");
  CHECK(needs_restart(*a, *c) == "[[listen]], upstream, log");
}

TEST_CASE("config: a listener's redirect needs a netns and an address off loopback") {
  const char* up = "upstream = [\"192.168.5.3\"]\n";
  auto a = parse_config(std::string(up) + "[[listen]]\naddress = \"127.42.0.53\"\n"
                        "[[listen]]\naddress = \"10.89.0.1:5353\"\nnetns = \"/run/netns/b\"\n",
                        "f.toml");
  REQUIRE(a);
  CHECK_FALSE(a->listen[0].redirect);
  CHECK(a->listen[1].redirect);  // the default with a netns
  auto b = parse_config(std::string(up) + "[[listen]]\naddress = \"127.42.0.53\"\nredirect = true\n",
                        "f.toml");
  REQUIRE_FALSE(b);
  CHECK(b.error().message.find("needs netns") != std::string::npos);
  auto c = parse_config(std::string(up) + "[[listen]]\naddress = \"127.0.0.1\"\nnetns = \"/n\"\n",
                        "f.toml");
  REQUIRE_FALSE(c);
  CHECK(c.error().message.find("martians") != std::string::npos);
  auto d = parse_config(std::string(up) + "[[listen]]\naddress = \"127.0.0.1\"\nnetns = \"/n\"\n"
                        "redirect = false\n",
                        "f.toml");
  CHECK(d);
}

TEST_CASE("config: follow needs a netns; a wildcard bridge listener is reached by redirect") {
  const char* up = "upstream = [\"192.168.5.3\"]\n";
  auto a = parse_config(std::string(up) + "[[listen]]\naddress = \"127.42.0.53\"\n"
                        "[[listen]]\naddress = \"0.0.0.0:5353\"\n"
                        "netns = \"/run/user/1000/netns/rootless-netns\"\nfollow = true\n",
                        "f.toml");
  REQUIRE(a);
  CHECK_FALSE(a->listen[0].follow);
  CHECK(a->listen[1].follow);
  CHECK(a->listen[1].redirect);
  std::string rules = bridge_redirect_ruleset(a->listen[1]);
  CHECK(rules.find("udp dport 53 redirect to :5353") != std::string::npos);
  CHECK(rules.find("tcp dport 53 redirect to :5353") != std::string::npos);
  CHECK(rules.find("dnat") == std::string::npos);
  // a fixed address keeps its dnat
  auto f = parse_config(std::string(up) + "[[listen]]\naddress = \"10.89.0.1:5353\"\n"
                        "netns = \"/n\"\n", "f.toml");
  REQUIRE(f);
  CHECK(bridge_redirect_ruleset(f->listen[0]).find("udp dport 53 dnat to 10.89.0.1:5353") !=
        std::string::npos);
  auto b = parse_config(std::string(up) + "[[listen]]\naddress = \"127.42.0.53\"\nfollow = true\n",
                        "f.toml");
  REQUIRE_FALSE(b);
  CHECK(b.error().message.find("follow") != std::string::npos);
  CHECK(b.error().message.find("needs netns") != std::string::npos);
  // follow is part of what a reload cannot change
  auto c = parse_config(std::string(up) + "[[listen]]\naddress = \"0.0.0.0:5353\"\n"
                        "netns = \"/run/user/1000/netns/rootless-netns\"\n", "f.toml");
  REQUIRE(c);
  CHECK(needs_restart(*a, *c) == "[[listen]]");
}

#include "wall/config.h"
#include "wall/parse.h"
#include "wall/render.h"

TEST_CASE("the machine wall's dns_forwarder: read from [machine], rendered as the redirect") {
  auto s = fy::wall::read_config("[machine]\ndns_forwarder = \"127.42.0.53\"\n", "w.toml");
  REQUIRE(s);
  REQUIRE(s->machine.dns_forwarder);
  CHECK(s->machine.dns_forwarder->value == *fy::wall::parse_ipv4("127.42.0.53"));
  auto off = fy::wall::read_config("[machine]\ndns_forwarder = \"192.168.5.3\"\n", "w.toml");
  REQUIRE_FALSE(off);
  CHECK(off.error().message.find("w.toml:2:") != std::string::npos);
  CHECK(off.error().message.find("127.0.0.0/8") != std::string::npos);

  fy::wall::MachineSpec m;
  m.walled.uid = 4242;
  m.walled.name = "alice";
  m.walled.subuids = {{100000, 165535}};
  m.gateway = *fy::wall::parse_ipv4("192.168.5.2");
  m.ports = {{41000, 41089}};
  m.resolvers = {{*fy::wall::parse_ipv4("192.168.5.3"), 32}};
  m.forward_allow = {{*fy::wall::parse_ipv4("10.0.0.0"), 8}};
  const std::string without = fy::wall::render_machine(m);
  CHECK(without.find("dns_redirect") == std::string::npos);
  CHECK(without.find("ip daddr 192.168.5.3 udp dport 53 accept") != std::string::npos);
  m.dns_forwarder = *fy::wall::parse_ipv4("127.42.0.53");
  const std::string with = fy::wall::render_machine(m);
  CHECK(with.find("type nat hook output priority -100;") != std::string::npos);
  for (const char* r : {"meta skuid 4242 meta nfproto ipv4 udp dport 53 dnat ip to 127.42.0.53:53",
                        "meta skuid 100000-165535 meta nfproto ipv4 tcp dport 53 dnat ip to "
                        "127.42.0.53:53",
                        "ip daddr 127.42.0.53 udp dport 53 accept",
                        "ip daddr 127.42.0.53 tcp dport 53 accept"})
    CHECK_MESSAGE(with.find(r) != std::string::npos, r);
  // the resolvers are no longer reachable directly
  CHECK(with.find("ip daddr 192.168.5.3 udp dport 53 accept") == std::string::npos);
  CHECK(fy::wall::describe_machine(m).find("redirected to fy-dnsfwd at 127.42.0.53") !=
        std::string::npos);
}
