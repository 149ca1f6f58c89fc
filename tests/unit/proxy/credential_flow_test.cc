// CredentialFlow and CredentialWait (proxy/server/credential_flow.h) on their
// own: the steps of an exchange's flow against a Rules value and a real store
// (its row fields, the injection, the kept body, the replay-once rule), and
// the wait on a loop of its own with a command minter (a /bin/sh child that
// counts its runs in a file). Each case ends with uv_loop_close() == 0.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "proxy/http/rewrite.h"
#include "proxy/inject/store.h"
#include "proxy/netlog/row.h"
#include "proxy/server/credential_flow.h"
#include "tests/unit/proxy/loop_util.h"
#include "tests/unit/proxy/mint_util.h"

using fy::inject::CredentialStore;
using fy::inject::HostEnv;
using fy::inject::Kind;
using fy::inject::MintOutcome;
using fy::inject::Rule;
using fy::inject::Rules;
using fy::inject::StoreOptions;
using fy::proxy::CredentialFlow;
using fy::proxy::CredentialWait;
using fy::test::command_rule;
using fy::test::lines_in;
using fy::test::run_until;
using fy::test::TempDir;
using Verdict = CredentialFlow::Verdict;
using Arrival = CredentialFlow::Arrival;

namespace {

constexpr const char* kMintTok = R"(printf '{"value":"tok-1","ttl":3600}')";

// A loop, a store on it and a scratch directory, for one case: `body` runs
// with them, then the store is shut down, the loop run out and closed.
void with_store(const std::function<void(uv_loop_t*, CredentialStore&, const std::string&)>& body,
                uint64_t minter_timeout_ms = 10'000) {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    TempDir dir("fy-cred-flow-test");
    HostEnv env(dir.path + "/host.env");  // absent: no secrets, none needed
    env.reload();
    StoreOptions o;
    o.loop = &loop;
    o.host_env = &env;
    o.minter_timeout_ms = minter_timeout_ms;
    CredentialStore store(o);
    body(&loop, store, dir.path);
    store.shutdown();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

// Mints `rule`'s token into `store` (one wait, run to its answer).
void mint(uv_loop_t* loop, CredentialStore& store, const Rule& rule) {
  std::optional<MintOutcome> got;
  store.wait(rule, [&](const MintOutcome& o) { got = o; });
  REQUIRE(run_until(loop, [&] { return got.has_value(); }));
  REQUIRE(got->ok);
}

// The head sent with `token` injected; `flow` has begun.
std::string injected_head(CredentialFlow& flow, const Rules& rules, fy::netlog::Row& row,
                          std::string_view target, bool* injected) {
  fy::http::RequestOut out;
  out.method = "GET";
  out.target = target;
  std::string buf;
  *injected = flow.inject(rules, "tok-1", target, out, buf, row);
  std::string s = std::string(out.target);
  for (auto& [name, value] : out.set) s += "|" + std::string(name) + ": " + value;
  return s;
}

}  // namespace

TEST_CASE(
    "credential flow: the row names the rule, redacts its query parameter, and says "
    "injected once a token is written (header overwritten or parameter set)") {
  Rules rules;
  Rule h = command_rule("/dev/null", kMintTok, false);
  Rule q = h;
  q.id = "search";
  q.header.clear();
  q.query_param = "key";
  q.value_prefix.clear();
  rules.inject = {h, q};

  {
    CredentialFlow flow;
    fy::netlog::Row row;
    row.path = "/v1/issues";
    flow.begin(rules.inject[0], std::nullopt, row);
    CHECK(row.rule == "tracker");
    CHECK(row.path == "/v1/issues");
    CHECK(flow.rule_id() == "tracker");
    CHECK_FALSE(row.injected);
    bool injected = false;
    CHECK(injected_head(flow, rules, row, "/v1/issues", &injected) ==
          "/v1/issues|Authorization: Bearer tok-1");
    CHECK(injected);
    CHECK(row.injected);
    CHECK(flow.injected());
    CHECK_FALSE(row.replayed);
    CHECK_FALSE(row.mint_failed);
    CredentialFlow::mint_failed(row);
    CHECK(row.mint_failed);
  }
  {
    CredentialFlow flow;
    fy::netlog::Row row;
    row.path = "/find?q=x&key=dummy";
    flow.begin(rules.inject[1], std::nullopt, row);
    CHECK(row.rule == "search");
    CHECK(row.path.find("dummy") == std::string::npos);
    CHECK(row.path.find("key=") != std::string::npos);
    bool injected = false;
    std::string sent = injected_head(flow, rules, row, "/find?q=x&key=dummy", &injected);
    CHECK(injected);
    CHECK(sent.find("key=tok-1") != std::string::npos);
    CHECK(sent.find("dummy") == std::string::npos);
    CHECK(sent.find('|') == std::string::npos);  // no header set
  }
  {
    // The rule went away before the head went out: nothing written.
    CredentialFlow flow;
    fy::netlog::Row row;
    flow.begin(rules.inject[0], std::nullopt, row);
    Rules none;
    bool injected = true;
    CHECK(injected_head(flow, none, row, "/v1/issues", &injected) == "/v1/issues");
    CHECK_FALSE(injected);
    CHECK_FALSE(row.injected);
    CHECK_FALSE(flow.injected());
  }
}

TEST_CASE(
    "credential flow: a 401 is replaced once (re-mint forced, body kept), and the "
    "re-issue's 401 goes back to the client") {
  with_store([](uv_loop_t* loop, CredentialStore& store, const std::string& dir) {
    Rules rules;
    rules.inject = {command_rule(dir + "/runs", kMintTok, /*replay=*/true)};
    const Rule& rule = rules.inject[0];
    mint(loop, store, rule);
    REQUIRE(store.has_token("tracker"));

    uint64_t total = 0;
    {
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rule, 5, row);
      CHECK_FALSE(flow.keeps_body());  // nothing injected yet
      bool injected = false;
      (void)injected_head(flow, rules, row, "/", &injected);
      REQUIRE(injected);
      CHECK(flow.keeps_body());
      flow.keep_body(&total, "hello", 5);
      CHECK(total == 5);
      CHECK_FALSE(flow.replayable(/*request_done=*/false));
      CHECK(flow.replayable(true));

      CHECK(flow.response_head(401, true, rules, store) == Verdict::replace);
      CHECK(flow.discarding());
      CHECK(store.has_token("tracker"));  // dropped by start_replay, not before
      CHECK_FALSE(row.replayed);
      const Rule* again = flow.start_replay(rules, store, row);
      CHECK(again == &rule);
      CHECK_FALSE(store.has_token("tracker"));
      CHECK(row.replayed);
      CHECK(flow.replayed());
      CHECK_FALSE(flow.keeps_body());
      CHECK(flow.kept_body().bytes() == "hello");
      CHECK(flow.discarding());

      MintOutcome ok;
      ok.ok = true;
      ok.value = "tok-2";
      CHECK(flow.arrived(ok, rules) == Arrival::same_rule);
      CHECK_FALSE(flow.discarding());
      flow.kept_body().release();  // sent with the re-issue
      CHECK(total == 0);

      // The re-issue is answered 401 again: handed back, never replaced twice.
      mint(loop, store, rule);
      CHECK_FALSE(flow.replayable(true));
      CHECK(flow.response_head(401, true, rules, store) == Verdict::hand_back);
      CHECK_FALSE(flow.discarding());
      CHECK_FALSE(store.has_token("tracker"));
      CHECK(lines_in(dir + "/runs") == 2);
    }
  });
}

TEST_CASE(
    "credential flow: a 401 to a body not kept (still arriving, announced over the bound, "
    "or past the proxy-wide bound) is handed back and its token dropped") {
  with_store([](uv_loop_t* loop, CredentialStore& store, const std::string& dir) {
    Rules rules;
    rules.inject = {command_rule(dir + "/runs", kMintTok, /*replay=*/true)};
    const Rule& rule = rules.inject[0];
    uint64_t total = 0;
    bool injected = false;

    SUBCASE("still arriving") {
      mint(loop, store, rule);
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rule, 10, row);
      (void)injected_head(flow, rules, row, "/", &injected);
      flow.keep_body(&total, "hello", 5);
      CHECK(flow.response_head(401, /*request_done=*/false, rules, store) ==
            Verdict::hand_back_unkept);
      CHECK(flow.kept_body().empty());
      CHECK(total == 0);
      CHECK_FALSE(store.has_token("tracker"));
    }
    SUBCASE("announced over the bound") {
      mint(loop, store, rule);
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rule, fy::inject::kMaxReplayBody + 1, row);
      (void)injected_head(flow, rules, row, "/", &injected);
      CHECK_FALSE(flow.keeps_body());
      CHECK(flow.response_head(401, true, rules, store) == Verdict::hand_back_unkept);
      CHECK_FALSE(store.has_token("tracker"));
    }
    SUBCASE("past the bound of all kept bodies") {
      mint(loop, store, rule);
      total = fy::inject::kMaxReplayBodies - 2;
      uint64_t before = total;
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rule, 5, row);
      (void)injected_head(flow, rules, row, "/", &injected);
      flow.keep_body(&total, "hello", 5);
      CHECK(total == before);  // nothing kept, the total exact
      CHECK_FALSE(flow.keeps_body());
      CHECK(flow.response_head(401, true, rules, store) == Verdict::hand_back_unkept);
      total = 0;
    }
    SUBCASE("a rule that does not replay") {
      Rules plain;
      plain.inject = {command_rule(dir + "/runs", kMintTok, /*replay=*/false)};
      mint(loop, store, plain.inject[0]);
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(plain.inject[0], 5, row);
      (void)injected_head(flow, plain, row, "/", &injected);
      CHECK_FALSE(flow.keeps_body());
      CHECK(flow.response_head(401, true, plain, store) == Verdict::hand_back);
      CHECK_FALSE(store.has_token("tracker"));
    }
    SUBCASE("a 401 to a request that carried no token, and a 200") {
      mint(loop, store, rule);
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rule, std::nullopt, row);
      CHECK(flow.response_head(401, true, rules, store) == Verdict::pass);
      CHECK(store.has_token("tracker"));
      CredentialFlow sent;
      sent.begin(rule, std::nullopt, row);
      (void)injected_head(sent, rules, row, "/", &injected);
      CHECK(sent.response_head(200, true, rules, store) == Verdict::pass);
      CHECK(store.has_token("tracker"));
    }
  });
}

TEST_CASE(
    "credential flow: a rule changed during the mint or the replay drops the rule; a "
    "failed re-mint after a replaced 401 is told apart") {
  with_store([](uv_loop_t*, CredentialStore& store, const std::string& dir) {
    Rules rules;
    rules.inject = {command_rule(dir + "/runs", kMintTok, /*replay=*/true)};
    Rules changed = rules;
    changed.inject[0].header = "X-Api-Key";  // another spec, the same switch
    REQUIRE(changed.inject[0].spec() != rules.inject[0].spec());
    MintOutcome ok;
    ok.ok = true;
    ok.value = "tok-1";
    MintOutcome failed;
    failed.reason = "exit 3";
    bool injected = false;

    {
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rules.inject[0], std::nullopt, row);
      CHECK(flow.arrived(ok, changed) == Arrival::rule_changed);
      CHECK(flow.same_rule(changed) == nullptr);
      CHECK(flow.rule(changed) == &changed.inject[0]);           // by switch only
      CHECK(flow.arrived(failed, rules) == Arrival::same_rule);  // the owner answers !ok
      flow.drop_rule(&row);
      CHECK(flow.rule_id().empty());
      CHECK(row.rule.empty());
    }
    {
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rules.inject[0], std::nullopt, row);
      (void)injected_head(flow, rules, row, "/", &injected);
      REQUIRE(flow.response_head(401, true, rules, store) == Verdict::replace);
      CHECK(flow.start_replay(changed, store, row) == nullptr);
      CHECK(row.replayed);
      CHECK(row.rule == "tracker");  // the row keeps the rule that was injected
      CHECK(flow.rule_id().empty());
      CHECK_FALSE(flow.discarding());
    }
    {
      CredentialFlow flow;
      fy::netlog::Row row;
      flow.begin(rules.inject[0], std::nullopt, row);
      (void)injected_head(flow, rules, row, "/", &injected);
      REQUIRE(flow.response_head(401, true, rules, store) == Verdict::replace);
      REQUIRE(flow.start_replay(rules, store, row) != nullptr);
      CHECK(flow.arrived(failed, rules) == Arrival::failed_after_401);
      CHECK_FALSE(flow.discarding());
    }
  });
}

TEST_CASE(
    "credential wait: two waits share one mint and both get its token, never from inside "
    "start(), each over before its callback; a withdrawn wait is never called") {
  with_store([](uv_loop_t* loop, CredentialStore& store, const std::string& dir) {
    Rule rule = command_rule(dir + "/runs", kMintTok, false);
    CredentialWait a, b, c;
    std::optional<MintOutcome> got_a, got_b;
    bool a_waiting_inside = true, b_waiting_inside = true, c_called = false;
    a.start(store, rule, [&](const MintOutcome& o) {
      a_waiting_inside = a.waiting();
      got_a = o;
    });
    b.start(store, rule, [&](const MintOutcome& o) {
      b_waiting_inside = b.waiting();
      got_b = o;
    });
    c.start(store, rule, [&](const MintOutcome&) { c_called = true; });
    CHECK(a.waiting());
    CHECK(b.waiting());
    CHECK_FALSE(got_a);
    CHECK_FALSE(got_b);
    CHECK(c.cancel(store));
    CHECK_FALSE(c.waiting());
    CHECK_FALSE(c.cancel(store));  // nothing left to withdraw
    REQUIRE(run_until(loop, [&] { return got_a && got_b; }));
    CHECK(got_a->ok);
    CHECK(got_a->value == "tok-1");
    CHECK(got_b->value == "tok-1");
    CHECK_FALSE(a_waiting_inside);
    CHECK_FALSE(b_waiting_inside);
    CHECK_FALSE(a.waiting());
    CHECK_FALSE(a.cancel(store));
    CHECK_FALSE(c_called);
    CHECK(lines_in(dir + "/runs") == 1);

    // A forced wait (the replay after a 401) drops the cached token first.
    REQUIRE(store.has_token("tracker"));
    std::optional<MintOutcome> forced;
    a.start(
        store, rule, [&](const MintOutcome& o) { forced = o; }, /*force=*/true);
    CHECK_FALSE(store.has_token("tracker"));
    REQUIRE(run_until(loop, [&] { return forced.has_value(); }));
    CHECK(forced->ok);
    CHECK(store.has_token("tracker"));
    CHECK(lines_in(dir + "/runs") == 2);
  });
}

TEST_CASE(
    "credential wait: a minter that never answers ends the wait with a failure at the "
    "store's timeout") {
  with_store(
      [](uv_loop_t* loop, CredentialStore& store, const std::string& dir) {
        Rule rule = command_rule(dir + "/runs", "exec sleep 30", false);
        CredentialWait w;
        std::optional<MintOutcome> got;
        uint64_t started = uv_now(loop);
        w.start(store, rule, [&](const MintOutcome& o) { got = o; });
        REQUIRE(run_until(
            loop, [&] { return got.has_value(); }, 5000));
        CHECK(uv_now(loop) - started >= 300);
        CHECK_FALSE(got->ok);
        CHECK(got->reason.find("hung") != std::string::npos);
        CHECK_FALSE(w.waiting());
      },
      /*minter_timeout_ms=*/300);
}
