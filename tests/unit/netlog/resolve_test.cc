// The resolution rule's edges (ADR-0034; docs/engine-watch.md): a row between
// two snapshots, a snapshot that dropped the address, an address never seen,
// an address reused by a new container, a gap in the watcher's record, the
// VM listener's owners, and clock skew between the engine and the host.
#include <doctest/doctest.h>

#include "proxy/netlog/snapshot.h"

using namespace fy::netlog;

namespace {

constexpr int64_t T = 1796191900000;  // a fixed host time, ms
const std::string A(64, 'a'), B(64, 'b');

Snapshot ctr(int64_t ts, const std::string& id, const std::string& name,
             std::vector<Endpoint> eps, const char* state = "running") {
  Snapshot s;
  s.ts_ms = ts;
  s.event = "start";
  s.id = id;
  s.state = state;
  s.claims.name = name;
  s.endpoints = std::move(eps);
  return s;
}

Snapshot watch(int64_t ts, const char* event) {
  Snapshot s;
  s.kind = Snapshot::Kind::watch;
  s.ts_ms = ts;
  s.event = event;
  return s;
}

Row row(int64_t ts, const char* src = "10.89.0.2", const char* net = "podman1") {
  Row r;
  r.ts_ms = ts;
  r.host = "example.org";
  r.attribution = Attribution::attributed;
  r.src = src;
  r.net = net;
  return r;
}

const Endpoint E{"shop_default", "podman1", "10.89.0.2"};

// Round-trips through the file format, as fy-netlog reads it.
Resolver build(const std::vector<Snapshot>& snaps) {
  Resolver r;
  for (const auto& s : snaps) {
    std::string line;
    append_snapshot_json(line, s);
    line.pop_back();
    auto p = parse_snapshot(line);
    REQUIRE_MESSAGE(p.ok(), line);
    r.add(*p);
  }
  r.finish();
  return r;
}

}  // namespace

TEST_CASE("a row between two snapshots of its holder takes the one before") {
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E}), ctr(T + 5000, A, "web", {E})});
  auto p = r.resolve(row(T + 2000));
  CHECK(p.kind == Principal::Kind::container);
  CHECK(p.id == A);
  CHECK(p.label() == "ctr:web");
  CHECK(p.claim);
}

TEST_CASE("a compose service is named by its claims") {
  auto s = ctr(T + 10, A, "shop_web_1", {E});
  s.claims.project = "shop";
  s.claims.service = "web";
  auto r = build({watch(T, "start"), s});
  CHECK(r.resolve(row(T + 20)).label() == "svc:shop/web");
}

TEST_CASE("a holder is never carried past the snapshot that dropped the address") {
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E}),
                  ctr(T + 1000, A, "web", {}, "exited")});
  auto p = r.resolve(row(T + 2000));
  CHECK(p.kind == Principal::Kind::unresolved);
  CHECK(p.reason.find("dropped it") != std::string::npos);
  // Before the drop it is still the holder.
  CHECK(r.resolve(row(T + 999)).id == A);
}

TEST_CASE("an address reused by a new container: old rows the first, new rows the second") {
  auto r = build({watch(T, "start"), ctr(T + 10, A, "first", {E}),
                  ctr(T + 1000, A, "first", {}, "removed"), ctr(T + 3000, B, "second", {E})});
  CHECK(r.resolve(row(T + 500)).label() == "ctr:first");
  CHECK(r.resolve(row(T + 3500)).label() == "ctr:second");
  // Between the removal and the new start, the one after (the second) holds it:
  // the watcher hears of a start after the container's first request.
  CHECK(r.resolve(row(T + 2999)).label() == "ctr:second");
}

TEST_CASE("an address never seen is unresolved, and says so") {
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E})});
  auto p = r.resolve(row(T + 20, "10.89.0.99"));
  CHECK(p.kind == Principal::Kind::unresolved);
  CHECK(p.reason.find("no snapshot ever showed 10.89.0.99") != std::string::npos);
  Resolver empty;
  empty.finish();
  CHECK(empty.resolve(row(T)).reason.find("fy-engine-watch") != std::string::npos);
}

TEST_CASE("the same address on another bridge is another endpoint") {
  Endpoint other{"other", "podman2", "10.89.0.2"};
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E}), ctr(T + 10, B, "db", {other})});
  CHECK(r.resolve(row(T + 20, "10.89.0.2", "podman1")).id == A);
  CHECK(r.resolve(row(T + 20, "10.89.0.2", "podman2")).id == B);
}

TEST_CASE("a gap: resolved only when the holder is the same on both sides") {
  // Watcher ran, stopped at T+100, restarted at T+5000 (a re-sync lists all).
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E}), watch(T + 100, "list"),
                  watch(T + 5000, "start"), ctr(T + 5000, A, "web", {E})});
  CHECK(r.resolve(row(T + 2000)).id == A);
  // The address changed hands while the watcher was down: not known who.
  auto r2 = build({watch(T, "start"), ctr(T + 10, A, "web", {E}), watch(T + 100, "stop"),
                   watch(T + 5000, "start"), ctr(T + 5000, B, "other", {E})});
  auto p = r2.resolve(row(T + 2000));
  CHECK(p.kind == Principal::Kind::unresolved);
  CHECK(p.reason.find("was not running") != std::string::npos);
  // After the re-sync, the new holder.
  CHECK(r2.resolve(row(T + 5001)).id == B);
  // Before the first record at all.
  CHECK(r2.resolve(row(T - 1)).reason.find("before the first engine snapshot") !=
        std::string::npos);
}

TEST_CASE("clock skew: the host's clock orders, the engine's time is only shown") {
  // The VM's clock is two hours behind: engine_time says the start happened
  // long before the row, and the removal long before the next start. Ordered by
  // the engine's time, the row at T+500 would fall after A's removal.
  auto s1 = ctr(T + 10, A, "first", {E});
  s1.engine_ms = T - 7200000;
  auto s2 = ctr(T + 1000, A, "first", {}, "removed");
  s2.engine_ms = T - 7200000 + 990;
  auto s3 = ctr(T + 3000, B, "second", {E});
  s3.engine_ms = T + 3600000;  // and then ahead
  auto r = build({watch(T, "start"), s1, s2, s3});
  CHECK(r.resolve(row(T + 500)).label() == "ctr:first");
  CHECK(r.resolve(row(T + 4000)).label() == "ctr:second");
  CHECK(r.latest(A)->engine_ms == T - 7200000 + 990);
}

TEST_CASE("the VM listener's owners: container by id, build and user as they are") {
  auto r = build({watch(T, "start"), ctr(T + 10, A, "web", {E})});
  Row vr = row(T + 20, "127.0.0.1", "host");
  vr.who = "container:" + A;
  auto p = r.resolve(vr);
  CHECK(p.kind == Principal::Kind::container);
  CHECK(p.label() == "ctr:web");
  vr.who = "container:" + B;  // never seen: its id only
  CHECK(r.resolve(vr).label() == "ctr:" + B.substr(0, 12));
  vr.who = "build:crun-buildah-buildah1.scope";
  CHECK(r.resolve(vr).label() == "build:crun-buildah-buildah1.scope");
  vr.who = "user";
  CHECK(r.resolve(vr).label() == "user");
  vr.who = "uid:0";
  CHECK(r.resolve(vr).label() == "uid:0");
  Row u = row(T);
  u.attribution = Attribution::unattributed;
  CHECK(r.resolve(u).label() == "unattributed");
  u.attribution = Attribution::none;
  CHECK(r.resolve(u).label() == "-");
}

TEST_CASE("snapshot lines that are not snapshots are refused with a reason") {
  CHECK_FALSE(parse_snapshot("{").ok());
  CHECK_FALSE(parse_snapshot("[]").ok());
  CHECK_FALSE(parse_snapshot(R"({"ts":"2026-12-02T06:00:00Z","kind":"container"})").ok());
  CHECK_FALSE(parse_snapshot(R"({"ts":"x","kind":"watch","event":"start"})").ok());
  CHECK_FALSE(parse_snapshot(
                  R"({"ts":"2026-12-02T06:00:00Z","kind":"container","id":"a","endpoints":[{"ip":1}]})")
                  .ok());
  CHECK(parse_snapshot(R"({"ts":"2026-12-02T06:00:00Z","kind":"watch","event":"start"})").ok());
}

TEST_CASE("by id: the latest snapshot that names the container, not a later nameless one") {
  using namespace fy::netlog;
  Resolver r;
  Snapshot named;
  named.ts_ms = 1000;
  named.event = "start";
  named.id = std::string(64, 'a');
  named.state = "removed";
  named.claims.name = "quick";
  r.add(named);
  Snapshot bare = named;
  bare.ts_ms = 2000;
  bare.event = "list";
  bare.claims = {};
  r.add(bare);
  r.finish();
  Row row;
  row.ts_ms = 1500;
  row.attribution = Attribution::attributed;
  row.src = "10.88.0.9";
  row.net = "podman0";
  row.who = "container:" + std::string(64, 'a');
  Principal p = r.resolve(row);
  CHECK(p.kind == Principal::Kind::container);
  CHECK(p.label() == "ctr:quick");
}
