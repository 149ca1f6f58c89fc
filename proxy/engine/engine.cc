#include "proxy/engine/engine.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json.h"

namespace fy::engine {
namespace {

using Json = nlohmann::json;

// The engine's documents are a few levels deep; a body nested deeper than this
// is refused before a tree is built for it (nlohmann recurses).
constexpr int kMaxDepth = 32;


Result<Json> parse_json(std::string_view s, size_t max, const char* what) {
  if (s.size() > max) return make_error(Errc::too_large, "{} is longer than {} bytes", what, max);
  if (json_nesting_exceeds(s, kMaxDepth)) return make_error(Errc::parse, "{} is nested deeper than {} levels", what, kMaxDepth);
  Json j = Json::parse(s.begin(), s.end(), nullptr, false);
  if (j.is_discarded()) return make_error(Errc::parse, "{} is not JSON", what);
  return j;
}

// A container id as the engine writes it: 12..64 lower-case hex digits.
bool is_id(std::string_view s) {
  return s.size() >= 12 && s.size() <= 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string str_at(const Json& o, const char* key, size_t max = kMaxName) {
  if (!o.is_object()) return {};
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return {};
  const std::string& s = it->get_ref<const std::string&>();
  return s.size() > max ? s.substr(0, max) : s;
}

// The compose labels: Docker Compose's, else podman-compose's own.
void claims_from_labels(const Json& labels, Claims* c) {
  c->project = str_at(labels, "com.docker.compose.project");
  if (c->project.empty()) c->project = str_at(labels, "io.podman.compose.project");
  c->service = str_at(labels, "com.docker.compose.service");
  if (c->service.empty()) c->service = str_at(labels, "io.podman.compose.service");
}

}  // namespace

Result<Event> parse_event(std::string_view line) {
  auto j = parse_json(line, kMaxEventLine, "an event");
  if (!j) return std::move(j).take_error();
  if (!j->is_object()) return make_error(Errc::parse, "an event is not a JSON object");
  Event e;
  e.type = str_at(*j, "Type", 32);
  e.action = str_at(*j, "Action", 32);
  if (e.action.empty()) e.action = str_at(*j, "status", 32);
  auto actor = j->find("Actor");
  if (actor != j->end() && actor->is_object()) {
    e.id = str_at(*actor, "ID", 64);
    // Docker names the network as the actor and the container as an attribute.
    auto attrs = actor->find("Attributes");
    if (attrs != actor->end() && e.type == "network") {
      std::string c = str_at(*attrs, "container", 64);
      if (!c.empty()) e.id = c;
    }
    if (attrs != actor->end() && attrs->is_object() && e.type == "container") {
      e.claims.name = str_at(*attrs, "name");
      claims_from_labels(*attrs, &e.claims);
    }
  }
  if (e.id.empty()) e.id = str_at(*j, "id", 64);
  auto tn = j->find("timeNano");
  auto t = j->find("time");
  if (tn != j->end() && tn->is_number_unsigned())
    e.time_ms = static_cast<int64_t>(tn->get<uint64_t>() / 1000000);
  else if (t != j->end() && t->is_number_unsigned() && t->get<uint64_t>() < (1ull << 40))
    e.time_ms = static_cast<int64_t>(t->get<uint64_t>() * 1000);
  if (e.type.empty() || e.action.empty())
    return make_error(Errc::parse, "an event without `Type` or `Action`");
  return e;
}

bool relevant(const Event& e) {
  if (!is_id(e.id)) return false;
  if (e.type == "container")
    return e.action == "start" || e.action == "restart" || e.action == "die" ||
           e.action == "stop" || e.action == "remove";
  if (e.type == "network") return e.action == "connect" || e.action == "disconnect";
  return false;
}

Result<std::vector<Container>> parse_containers(std::string_view body) {
  auto j = parse_json(body, kMaxListBody, "the container list");
  if (!j) return std::move(j).take_error();
  if (!j->is_array()) return make_error(Errc::parse, "the container list is not a JSON array");
  if (j->size() > kMaxContainers)
    return make_error(Errc::too_large, "the container list has more than {} containers", kMaxContainers);
  std::vector<Container> out;
  for (const Json& c : *j) {
    if (!c.is_object()) return make_error(Errc::parse, "a container in the list is not an object");
    Container k;
    k.id = str_at(c, "Id", 64);
    if (!is_id(k.id)) return make_error(Errc::parse, "a container's `Id` is not 12..64 hex digits");
    k.state = str_at(c, "State", 32);
    auto names = c.find("Names");
    if (names != c.end() && names->is_array() && !names->empty() && (*names)[0].is_string()) {
      std::string n = (*names)[0].get<std::string>();
      if (!n.empty() && n[0] == '/') n.erase(0, 1);
      k.claims.name = n.substr(0, kMaxName);
    }
    if (auto l = c.find("Labels"); l != c.end()) claims_from_labels(*l, &k.claims);
    auto ns = c.find("NetworkSettings");
    if (ns != c.end() && ns->is_object()) {
      auto nets = ns->find("Networks");
      if (nets != ns->end() && nets->is_object()) {
        for (auto it = nets->begin(); it != nets->end(); ++it) {
          std::string ip = str_at(*it, "IPAddress", 64);
          std::string ip6 = str_at(*it, "GlobalIPv6Address", 64);
          std::string net = it.key().substr(0, kMaxName);
          if (!ip.empty()) k.endpoints.push_back(Endpoint{net, "", ip});
          if (!ip6.empty()) k.endpoints.push_back(Endpoint{net, "", ip6});
          if (k.endpoints.size() > 64)
            return make_error(Errc::too_large, "a container has more than 64 endpoints");
        }
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

Result<Ifaces> parse_networks(std::string_view body) {
  auto j = parse_json(body, kMaxListBody, "the network list");
  if (!j) return std::move(j).take_error();
  if (!j->is_array()) return make_error(Errc::parse, "the network list is not a JSON array");
  Ifaces out;
  for (const Json& n : *j) {
    std::string name = str_at(n, "name");
    std::string iface = str_at(n, "network_interface", 64);
    if (!name.empty() && !iface.empty()) out[name] = iface;
    if (out.size() > kMaxContainers) return make_error(Errc::too_large, "too many networks");
  }
  return out;
}

void Tracker::seed(const Snapshot& s) {
  if (s.kind != Snapshot::Kind::container) return;
  if (s.state == "removed")
    known_.erase(s.id);
  else
    known_[s.id] = s;
}

Snapshot Tracker::record(const Container& c, const Ifaces& ifaces, int64_t now_ms,
                         std::string event, int64_t engine_ms) {
  Snapshot s;
  s.ts_ms = now_ms;
  s.event = std::move(event);
  s.id = c.id;
  s.state = c.state;
  s.engine_ms = engine_ms;
  s.claims = c.claims;
  s.endpoints = c.endpoints;
  for (Endpoint& e : s.endpoints)
    if (auto it = ifaces.find(e.net); it != ifaces.end()) e.iface = it->second;
  std::sort(s.endpoints.begin(), s.endpoints.end());
  return s;
}

Snapshot Tracker::on_event(const Event& e, const Container* c, const Ifaces& ifaces,
                           int64_t now_ms) {
  Snapshot s;
  if (c) {
    s = record(*c, ifaces, now_ms, e.action, e.time_ms);
    known_[s.id] = s;
    return s;
  }
  // Gone from the engine: its last claims, no address.
  s.ts_ms = now_ms;
  s.event = e.action;
  s.id = e.id;
  s.state = "removed";
  s.engine_ms = e.time_ms;
  if (auto it = known_.find(e.id); it != known_.end()) {
    s.claims = it->second.claims;
    if (gone_.size() >= kMaxContainers) gone_.clear();
    gone_[e.id] = s.claims;
    known_.erase(it);
  } else if (auto g = gone_.find(e.id); g != gone_.end()) {
    s.claims = g->second;
  } else {
    // Never listed (it came and went between its event and this list): the
    // event's own claims are all there is.
    s.claims = e.claims;
    if (!s.claims.name.empty()) {
      if (gone_.size() >= kMaxContainers) gone_.clear();
      gone_[e.id] = s.claims;
    }
  }
  return s;
}

std::vector<Snapshot> Tracker::on_list(const std::vector<Container>& list, const Ifaces& ifaces,
                                       int64_t now_ms, bool all) {
  std::vector<Snapshot> out;
  std::map<std::string, bool> seen;
  for (const Container& c : list) {
    seen[c.id] = true;
    Snapshot s = record(c, ifaces, now_ms, "list", -1);
    auto it = known_.find(c.id);
    bool changed = it == known_.end() || it->second.state != s.state ||
                   it->second.endpoints != s.endpoints || !(it->second.claims == s.claims);
    if (all || changed) out.push_back(s);
    known_[c.id] = std::move(s);
  }
  for (auto it = known_.begin(); it != known_.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    Snapshot s;
    s.ts_ms = now_ms;
    s.event = "list";
    s.id = it->first;
    s.state = "removed";
    s.claims = it->second.claims;
    out.push_back(std::move(s));
    it = known_.erase(it);
  }
  return out;
}

bool Tracker::missing_iface(const std::vector<Container>& list, const Ifaces& ifaces) {
  for (const Container& c : list)
    for (const Endpoint& e : c.endpoints)
      if (!ifaces.count(e.net)) return true;
  return false;
}

}  // namespace fy::engine
