#include "proxy/netlog/snapshot.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/clock.h"
#include "core/json.h"

namespace fy::netlog {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxSnapshotLine = 256 * 1024;
constexpr size_t kMaxEndpoints = 64;
constexpr size_t kMaxField = 512;


// A string field: absent -> "", present and not a string (or too long) -> false.
bool get_str(const Json& o, const char* key, std::string* out) {
  auto it = o.find(key);
  if (it == o.end()) return true;
  if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxField) return false;
  *out = it->get_ref<const std::string&>();
  return true;
}

}  // namespace

void append_snapshot_json(std::string& out, const Snapshot& s) {
  JsonObject o(out);
  o.str("ts", iso8601_utc(s.ts_ms, true, true));
  if (s.kind == Snapshot::Kind::watch) {
    o.str("kind", "watch").str("event", s.event);
    if (s.event == "list" || s.event == "resync" || s.event == "start")
      o.unum("containers", s.containers);
    o.close();
    out += '\n';
    return;
  }
  o.str("kind", "container").str("event", s.event).str("id", s.id).str("state", s.state);
  if (s.engine_ms >= 0) o.str("engine_time", iso8601_utc(s.engine_ms, true, true));
  std::string claims;
  {
    JsonObject c(claims);
    c.str("name", s.claims.name);
    if (!s.claims.project.empty()) c.str("project", s.claims.project);
    if (!s.claims.service.empty()) c.str("service", s.claims.service);
    c.close();
  }
  o.raw("claims", claims);
  std::string eps = "[";
  for (size_t i = 0; i < s.endpoints.size(); ++i) {
    if (i) eps += ',';
    JsonObject e(eps);
    e.str("net", s.endpoints[i].net).str("iface", s.endpoints[i].iface).str("ip", s.endpoints[i].ip);
    e.close();
  }
  eps += ']';
  o.raw("endpoints", eps);
  o.close();
  out += '\n';
}

Result<Snapshot> parse_snapshot(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() > kMaxSnapshotLine)
    return make_error(Errc::too_large, "longer than {} bytes", kMaxSnapshotLine);
  if (json_nesting_exceeds(line, 8)) return make_error(Errc::parse, "nested deeper than 8 levels");
  Json j = Json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded()) return make_error(Errc::parse, "not JSON");
  if (!j.is_object()) return make_error(Errc::parse, "not a JSON object");
  Snapshot s;
  auto ts = j.find("ts");
  if (ts == j.end() || !ts->is_string())
    return make_error(Errc::parse, "no `ts` string");
  auto ms = parse_iso8601(ts->get_ref<const std::string&>());
  if (!ms) return make_error(Errc::parse, "field `ts` is not an ISO 8601 time with an offset");
  s.ts_ms = *ms;
  std::string kind;
  if (!get_str(j, "kind", &kind) || !get_str(j, "event", &s.event))
    return make_error(Errc::parse, "field `kind` or `event` is not a string");
  if (kind == "watch") {
    s.kind = Snapshot::Kind::watch;
    if (auto c = j.find("containers"); c != j.end()) {
      if (!c->is_number_unsigned()) return make_error(Errc::parse, "field `containers` is not a count");
      s.containers = c->get<uint64_t>();
    }
    return s;
  }
  if (kind != "container") return make_error(Errc::parse, "field `kind` is not container or watch");
  if (!get_str(j, "id", &s.id) || s.id.empty())
    return make_error(Errc::parse, "field `id` is not a non-empty string");
  if (!get_str(j, "state", &s.state)) return make_error(Errc::parse, "field `state` is not a string");
  if (auto et = j.find("engine_time"); et != j.end()) {
    auto e = et->is_string() ? parse_iso8601(et->get_ref<const std::string&>()) : std::nullopt;
    if (!e) return make_error(Errc::parse, "field `engine_time` is not an ISO 8601 time");
    s.engine_ms = *e;
  }
  if (auto c = j.find("claims"); c != j.end()) {
    if (!c->is_object() || !get_str(*c, "name", &s.claims.name) ||
        !get_str(*c, "project", &s.claims.project) || !get_str(*c, "service", &s.claims.service))
      return make_error(Errc::parse, "field `claims` is not an object of strings");
  }
  if (auto eps = j.find("endpoints"); eps != j.end()) {
    if (!eps->is_array() || eps->size() > kMaxEndpoints)
      return make_error(Errc::parse, "field `endpoints` is not an array of at most {}", kMaxEndpoints);
    for (const auto& e : *eps) {
      Endpoint ep;
      if (!e.is_object() || !get_str(e, "net", &ep.net) || !get_str(e, "iface", &ep.iface) ||
          !get_str(e, "ip", &ep.ip) || ep.ip.empty())
        return make_error(Errc::parse, "an endpoint is not {{net, iface, ip}}");
      s.endpoints.push_back(std::move(ep));
    }
    std::sort(s.endpoints.begin(), s.endpoints.end());
  }
  return s;
}

// ---- Principals ----------------------------------------------------------------

std::string Principal::label() const {
  switch (kind) {
    case Kind::container:
      if (!claims.project.empty() && !claims.service.empty())
        return "svc:" + claims.project + "/" + claims.service;
      if (!claims.name.empty()) return "ctr:" + claims.name;
      return "ctr:" + id.substr(0, 12);
    case Kind::build:
      return "build:" + id;
    case Kind::user:
      return "user";
    case Kind::uid:
      return "uid:" + id;
    case Kind::unresolved:
      return "unresolved";
    case Kind::unattributed:
      return "unattributed";
    case Kind::none:
      return "-";
  }
  return "-";
}

void Resolver::add(const Snapshot& s) {
  snaps_.push_back(s);
  finished_ = false;
}

void Resolver::finish() {
  std::stable_sort(snaps_.begin(), snaps_.end(),
                   [](const Snapshot& a, const Snapshot& b) { return a.ts_ms < b.ts_ms; });
  by_addr_.clear();
  latest_.clear();
  gaps_.clear();
  // What each container was last seen holding, to know what a snapshot dropped.
  std::map<std::string, std::vector<Endpoint>> held;
  std::optional<int64_t> last_ts;
  for (size_t i = 0; i < snaps_.size(); ++i) {
    const Snapshot& s = snaps_[i];
    if (i == 0) gaps_.emplace_back(INT64_MIN, s.ts_ms);  // before the record begins
    if (s.kind == Snapshot::Kind::watch) {
      if ((s.event == "start" || s.event == "resync") && last_ts) gaps_.emplace_back(*last_ts, s.ts_ms);
      last_ts = s.ts_ms;
      continue;
    }
    last_ts = s.ts_ms;
    // The latest snapshot that names the container, else its latest at all.
    if (auto l = latest_.find(s.id);
        l == latest_.end() || !s.claims.name.empty() ||
        snaps_[static_cast<size_t>(l->second)].claims.name.empty())
      latest_[s.id] = static_cast<int>(i);
    auto& before = held[s.id];
    for (const Endpoint& e : s.endpoints)
      by_addr_[{e.iface, e.ip}].push_back(Entry{s.ts_ms, static_cast<int>(i), ""});
    for (const Endpoint& e : before)
      if (!std::binary_search(s.endpoints.begin(), s.endpoints.end(), e)) {
        // Dropped, unless another endpoint of this snapshot keeps the same address.
        bool kept = std::any_of(s.endpoints.begin(), s.endpoints.end(), [&](const Endpoint& n) {
          return n.iface == e.iface && n.ip == e.ip;
        });
        if (!kept) by_addr_[{e.iface, e.ip}].push_back(Entry{s.ts_ms, -1, s.id});
      }
    before = s.endpoints;
  }
  finished_ = true;
}

bool Resolver::in_gap(int64_t ts, std::pair<int64_t, int64_t>* gap) const {
  for (const auto& g : gaps_)
    if (ts > g.first && ts < g.second) {
      *gap = g;
      return true;
    }
  return false;
}

const Snapshot* Resolver::latest(std::string_view id) const {
  auto it = latest_.find(id);
  return it == latest_.end() ? nullptr : &snaps_[static_cast<size_t>(it->second)];
}

Principal Resolver::resolve(const Row& row) const {
  Principal p;
  p.src = row.src;
  p.net = row.net;
  if (row.attribution == Attribution::none) return p;
  if (row.attribution == Attribution::unattributed) {
    p.kind = Principal::Kind::unattributed;
    return p;
  }
  auto from_snap = [&](const Snapshot& s) {
    p.kind = Principal::Kind::container;
    p.id = s.id;
    p.claims = s.claims;
    p.claim = true;
  };
  // The VM listener names the owner itself.
  std::string_view who = row.who;
  if (who.rfind("container:", 0) == 0) {
    p.kind = Principal::Kind::container;
    p.id = std::string(who.substr(10));
    if (const Snapshot* s = latest(p.id)) from_snap(*s);
    return p;  // by id: a container the watcher never saw keeps only its id
  }
  if (who.rfind("build:", 0) == 0) {
    p.kind = Principal::Kind::build;
    p.id = std::string(who.substr(6));
    return p;
  }
  if (who == "user") {
    p.kind = Principal::Kind::user;
    return p;
  }
  if (who.rfind("uid:", 0) == 0) {
    p.kind = Principal::Kind::uid;
    p.id = std::string(who.substr(4));
    return p;
  }
  p.kind = Principal::Kind::unresolved;
  if (!who.empty()) {
    p.reason = "the stamp's owner `" + std::string(who) + "` is not one fy-netlog knows";
    return p;
  }
  auto it = by_addr_.find({row.net, row.src});
  if (it == by_addr_.end()) it = by_addr_.find({std::string(), row.src});
  if (it == by_addr_.end()) {
    p.reason = snaps_.empty() ? "no engine snapshots (is fy-engine-watch running?)"
                              : "no snapshot ever showed " + row.src + " on " + row.net;
    return p;
  }
  const auto& tl = it->second;
  // Last entry at or before the row, first after it.
  auto after = std::upper_bound(tl.begin(), tl.end(), row.ts_ms,
                                [](int64_t t, const Entry& e) { return t < e.ts_ms; });
  const Entry* b = after == tl.begin() ? nullptr : &*(after - 1);
  const Entry* a = after == tl.end() ? nullptr : &*after;
  std::pair<int64_t, int64_t> gap;
  if (in_gap(row.ts_ms, &gap)) {
    if (b && a && b->snap >= 0 && a->snap >= 0 &&
        snaps_[static_cast<size_t>(b->snap)].id == snaps_[static_cast<size_t>(a->snap)].id) {
      from_snap(snaps_[static_cast<size_t>(b->snap)]);
      return p;
    }
    p.reason = gap.first == INT64_MIN
                   ? "before the first engine snapshot (" + iso8601_utc(gap.second, true, true) + ")"
                   : "fy-engine-watch was not running from " + iso8601_utc(gap.first, true, true) +
                         " to " + iso8601_utc(gap.second, true, true) +
                         ", and the address's holder then is not known";
    return p;
  }
  if (b && b->snap >= 0) {
    from_snap(snaps_[static_cast<size_t>(b->snap)]);
    return p;
  }
  if (a && a->snap >= 0) {
    from_snap(snaps_[static_cast<size_t>(a->snap)]);
    return p;
  }
  if (b)
    p.reason = "no container held " + row.src + " then (" + b->dropped_by.substr(0, 12) +
               " dropped it at " + iso8601_utc(b->ts_ms, true, true) + ")";
  else
    p.reason = "no container held " + row.src + " then";
  return p;
}

}  // namespace fy::netlog
