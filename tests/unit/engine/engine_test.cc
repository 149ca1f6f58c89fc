// fy-engine-watch's reading of the engine (events, container and network lists
// as podman 4.3's API service writes them) and the Tracker's decisions.
#include <doctest/doctest.h>

#include "proxy/engine/engine.h"

using namespace fy::engine;

namespace {
const std::string ID = "c776e0db4d5f74858ec576a83ade6d42fb9ca85bfdb6a4fb88469ee4ba73dbd0";

// A start and a network connect, as podman 4.3.1's /v1.40/events wrote them.
const std::string kStart =
    R"({"status":"start","id":")" + ID +
    R"(","from":"localhost/fy17-bb:1","Type":"container","Action":"start","Actor":{"ID":")" + ID +
    R"(","Attributes":{"com.docker.compose.project":"shop","com.docker.compose.service":"web","image":"localhost/fy17-bb:1","name":"fy17a","podId":""}},"scope":"local","time":1796191915,"timeNano":1796191915816660872})";
const std::string kConnect = R"({"status":"connect","id":")" + ID +
                             R"(","Type":"network","Action":"connect","Actor":{"ID":")" + ID +
                             R"(","Attributes":{"name":"fy17a"}},"time":1796191915,"timeNano":1796191915895707060})";
const std::string kList =
    R"([{"Id":")" + ID +
    R"(","Names":["/fy17a"],"Labels":{"com.docker.compose.project":"shop","com.docker.compose.service":"web"},"State":"running","NetworkSettings":{"Networks":{"fy17net":{"IPAddress":"10.89.0.3","GlobalIPv6Address":""},"podman":{"IPAddress":"10.88.0.2"}}}}])";
const std::string kNets =
    R"([{"name":"podman","network_interface":"cni-podman0"},{"name":"fy17net","network_interface":"cni-podman1"}])";
}  // namespace

TEST_CASE("events: the container and network actions that matter") {
  auto e = parse_event(kStart);
  REQUIRE(e.ok());
  CHECK(e->type == "container");
  CHECK(e->action == "start");
  CHECK(e->id == ID);
  CHECK(e->time_ms == 1796191915816);
  CHECK(relevant(*e));
  auto c = parse_event(kConnect);
  REQUIRE(c.ok());
  CHECK(c->type == "network");
  CHECK(relevant(*c));
  // Docker's shape: the network is the actor, the container an attribute.
  auto d = parse_event(R"({"Type":"network","Action":"disconnect","Actor":{"ID":"net1","Attributes":{"container":")" +
                       ID + R"("}}})");
  REQUIRE(d.ok());
  CHECK(d->id == ID);
  CHECK(relevant(*d));
  CHECK_FALSE(relevant(*parse_event(R"({"Type":"image","Action":"pull","Actor":{"ID":""}})")));
  CHECK_FALSE(relevant(*parse_event(R"({"Type":"container","Action":"start","Actor":{"ID":"../x"}})")));
  CHECK_FALSE(parse_event("not json").ok());
  CHECK_FALSE(parse_event("[1]").ok());
  CHECK_FALSE(parse_event(std::string(100, '[')).ok());
}

TEST_CASE("the container list: names, compose claims, endpoints") {
  auto l = parse_containers(kList);
  REQUIRE(l.ok());
  REQUIRE(l->size() == 1);
  const Container& c = (*l)[0];
  CHECK(c.claims.name == "fy17a");
  CHECK(c.claims.project == "shop");
  CHECK(c.claims.service == "web");
  CHECK(c.endpoints.size() == 2);
  // podman-compose's own labels when Docker's are absent.
  auto p = parse_containers(R"([{"Id":")" + ID +
                            R"(","Labels":{"io.podman.compose.project":"p","io.podman.compose.service":"s"}}])");
  REQUIRE(p.ok());
  CHECK((*p)[0].claims.project == "p");
  CHECK((*p)[0].claims.service == "s");
  CHECK_FALSE(parse_containers(R"([{"Id":"nothex"}])").ok());
  CHECK_FALSE(parse_containers(R"({"Id":1})").ok());
  auto n = parse_networks(kNets);
  REQUIRE(n.ok());
  CHECK(n->at("fy17net") == "cni-podman1");
}

TEST_CASE("the tracker: one snapshot per event, lists record only changes, removals once") {
  Tracker t;
  auto nets = *parse_networks(kNets);
  auto list = *parse_containers(kList);
  auto first = t.on_list(list, nets, 1000, true);
  REQUIRE(first.size() == 1);
  CHECK(first[0].endpoints.size() == 2);
  CHECK(first[0].endpoints[0].iface == "cni-podman0");
  CHECK(t.on_list(list, nets, 2000, false).empty());  // nothing changed
  CHECK(t.on_list(list, nets, 2000, true).size() == 1);
  // A disconnect: one snapshot, with the endpoint gone.
  list[0].endpoints.pop_back();
  auto s = t.on_event(*parse_event(kConnect), &list[0], nets, 3000);
  CHECK(s.endpoints.size() == 1);
  // Removed while nobody looked: the next list says so, with its last claims.
  auto gone = t.on_list({}, nets, 4000, false);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].state == "removed");
  CHECK(gone[0].claims.name == "fy17a");
  CHECK(t.on_list({}, nets, 5000, false).empty());
  // Seeded from the log (a restart): a known container gone now is removed once.
  Tracker t2;
  t2.seed(first[0]);
  CHECK(t2.on_list({}, nets, 6000, false).size() == 1);
  auto ev = t2.on_event(*parse_event(kStart), nullptr, nets, 7000);
  CHECK(ev.state == "removed");
  // A die seen gone, then its remove: both name it.
  Tracker t3;
  t3.on_list(*parse_containers(kList), nets, 1000, true);
  CHECK(t3.on_event(*parse_event(kStart), nullptr, nets, 2000).claims.name == "fy17a");
  CHECK(t3.on_event(*parse_event(kStart), nullptr, nets, 2001).claims.name == "fy17a");
}

TEST_CASE("a container gone before the watcher asks is named from its event's claims") {
  auto e = parse_event(kStart);
  REQUIRE(e.ok());
  CHECK(e->claims.name == "fy17a");
  CHECK(e->claims.project == "shop");
  CHECK(e->claims.service == "web");
  Tracker t;
  // The start's list came back empty: the container was already removed.
  Snapshot s = t.on_event(*e, nullptr, {}, 1000);
  CHECK(s.state == "removed");
  CHECK(s.endpoints.empty());
  CHECK(s.claims.name == "fy17a");
  CHECK(s.claims.service == "web");
  // Its later die and remove events carry the same claims.
  auto rm = parse_event(R"({"Type":"container","Action":"remove","Actor":{"ID":")" + ID +
                        R"(","Attributes":{}}})");
  REQUIRE(rm.ok());
  CHECK(t.on_event(*rm, nullptr, {}, 1001).claims.name == "fy17a");
  // A network event's attributes are not a container's claims.
  CHECK(parse_event(kConnect)->claims.name.empty());
}
