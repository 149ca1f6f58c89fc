// The credential store's single flight (proxy/inject/store.h) on a loop of its
// own: a command minter (a /bin/sh child) that counts its runs in a file.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "proxy/inject/store.h"
#include "tests/unit/proxy/loop_util.h"
#include "tests/unit/proxy/mint_util.h"

using fy::inject::CredentialStore;
using fy::inject::HostEnv;
using fy::inject::Kind;
using fy::inject::MintOutcome;
using fy::inject::Rule;
using fy::inject::StoreOptions;
using fy::test::command_rule;
using fy::test::lines_in;
using fy::test::run_until;
using fy::test::TempDir;

namespace {

StoreOptions options(uv_loop_t* loop, HostEnv* env) {
  StoreOptions o;
  o.loop = loop;
  o.host_env = env;
  o.minter_timeout_ms = 10'000;
  return o;
}

}  // namespace

TEST_CASE("store: two waiters for one credential cause one mint, and both get its token") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    TempDir dir("fy-store-test");
    HostEnv env(dir.path + "/host.env");  // absent: no secrets, none needed
    env.reload();
    CredentialStore store(options(&loop, &env));
    std::string count = dir.path + "/runs";
    Rule rule = command_rule(count, R"(printf '{"value":"tok-1","ttl":3600}')");

    CHECK(store.lookup(rule).state == CredentialStore::State::pending);
    std::optional<MintOutcome> first, second;
    store.wait(rule, [&](const MintOutcome& o) { first = o; });
    store.wait(rule, [&](const MintOutcome& o) { second = o; });
    CHECK_FALSE(first);  // never called back from inside wait()
    CHECK_FALSE(second);
    REQUIRE(run_until(&loop, [&] { return first && second; }));
    CHECK(first->ok);
    CHECK(first->value == "tok-1");
    CHECK(second->ok);
    CHECK(second->value == "tok-1");
    CHECK(lines_in(count) == 1);  // the minter ran once
    CHECK(store.stats().mints == 1);
    CHECK(store.stats().mint_failures == 0);
    // The token is cached for the requests that come after.
    auto l = store.lookup(rule);
    CHECK(l.state == CredentialStore::State::ready);
    CHECK(l.value == "tok-1");
    CHECK(store.has_token("tracker"));
    store.shutdown();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("store: a failed mint answers every waiter with its reason, and is remembered") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    TempDir dir("fy-store-test");
    HostEnv env(dir.path + "/host.env");
    env.reload();
    CredentialStore store(options(&loop, &env));
    std::string count = dir.path + "/runs";
    Rule rule = command_rule(count, "echo 'the issuer said no' >&2; exit 3");

    std::optional<MintOutcome> first, second;
    store.wait(rule, [&](const MintOutcome& o) { first = o; });
    store.wait(rule, [&](const MintOutcome& o) { second = o; });
    REQUIRE(run_until(&loop, [&] { return first && second; }));
    CHECK_FALSE(first->ok);
    CHECK_FALSE(second->ok);
    CHECK(first->reason.find("exit 3") != std::string::npos);
    CHECK(first->reason.find("the issuer said no") != std::string::npos);
    CHECK(second->reason == first->reason);
    CHECK(first->value.empty());
    CHECK(lines_in(count) == 1);
    CHECK(store.stats().mint_failures == 1);
    CHECK(store.stats().mints == 0);
    auto l = store.lookup(rule);
    CHECK(l.state == CredentialStore::State::failed);
    CHECK(l.failure == first->reason);

    // A waiter inside the failure memory is answered without another run.
    std::optional<MintOutcome> third;
    store.wait(rule, [&](const MintOutcome& o) { third = o; });
    CHECK_FALSE(third);
    REQUIRE(run_until(&loop, [&] { return third.has_value(); }));
    CHECK_FALSE(third->ok);
    CHECK(third->reason == first->reason);
    CHECK(lines_in(count) == 1);
    CHECK(store.stats().mint_failures == 1);  // not counted twice
    store.shutdown();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("store: a waiter that cancels is not called back; the mint goes on for the other") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    TempDir dir("fy-store-test");
    HostEnv env(dir.path + "/host.env");
    env.reload();
    CredentialStore store(options(&loop, &env));
    std::string count = dir.path + "/runs";
    Rule rule = command_rule(count, R"(printf '{"value":"tok-2","ttl":3600}')");

    bool cancelled_called = false;
    std::optional<MintOutcome> kept;
    uint64_t t1 = store.wait(rule, [&](const MintOutcome&) { cancelled_called = true; });
    uint64_t t2 = store.wait(rule, [&](const MintOutcome& o) { kept = o; });
    CHECK(t1 != t2);
    store.cancel(t1);
    REQUIRE(run_until(&loop, [&] { return kept.has_value(); }));
    CHECK(kept->ok);
    CHECK(kept->value == "tok-2");
    CHECK_FALSE(cancelled_called);
    CHECK(lines_in(count) == 1);
    store.shutdown();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("store: shutdown() with a mint in flight kills the minter, calls no waiter, and leaves "
          "no handle open") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    TempDir dir("fy-store-test");
    HostEnv env(dir.path + "/host.env");
    env.reload();
    CredentialStore store(options(&loop, &env));
    Rule rule = command_rule(dir.path + "/runs", "exec sleep 30");
    bool called = false;
    store.wait(rule, [&](const MintOutcome&) { called = true; });
    REQUIRE(run_until(&loop, [&] { return lines_in(dir.path + "/runs") == 1; }));
    store.shutdown();
    uv_run(&loop, UV_RUN_DEFAULT);  // returns: the child was killed, handles closed
    CHECK_FALSE(called);
  }
  CHECK(uv_loop_close(&loop) == 0);
}
