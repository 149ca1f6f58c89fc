// What fy-engine-watch reads from the engine (the podman API's Docker-compatible
// endpoints) and the decisions it takes on it: which events matter, what a
// container's state is, which snapshots to append. Pure: no sockets here
// (client.{h,cc} does the I/O, exe/fy_engine_watch.cc the loop).
//
// Everything the engine sends is untrusted bytes: a container's creator chose
// its name and labels, and the socket is the box's to use. The parsers bound
// what they accept and say what was wrong (fuzz target tests/engine/fuzz_engine.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "proxy/netlog/snapshot.h"

namespace fy::engine {

using netlog::Claims;
using netlog::Endpoint;
using netlog::Snapshot;

// Bounds on what the engine may send.
inline constexpr size_t kMaxEventLine = 256 * 1024;       // one event
inline constexpr size_t kMaxListBody = 32 * 1024 * 1024;  // /containers/json
inline constexpr size_t kMaxContainers = 20000;
inline constexpr size_t kMaxName = 256;

// One line of the event stream (`/events`), as much of it as matters.
struct Event {
  std::string type;    // "container", "network"
  std::string action;  // "start", "die", "connect", ...
  std::string id;      // the container's id (for network events too)
  int64_t time_ms = -1;
  // A container event's own claims (Actor.Attributes: `name` and the compose
  // labels, as podman sends them): what names a container already gone when
  // the watcher asks about it.
  Claims claims;
};
Result<Event> parse_event(std::string_view line);
// start, restart, die, stop, remove of a container; connect, disconnect of one to a network.
bool relevant(const Event& e);

// One container of `/containers/json?all=true` (Docker's list shape).
struct Container {
  std::string id;
  std::string state;  // "running", "exited", "created", ...
  Claims claims;
  std::vector<Endpoint> endpoints;  // iface left empty; networks without an address skipped
};
Result<std::vector<Container>> parse_containers(std::string_view body);

// libpod's `/libpod/networks/json`: network name -> bridge interface.
using Ifaces = std::map<std::string, std::string>;
Result<Ifaces> parse_networks(std::string_view body);

// The watcher's memory: the last state it recorded per container. Seeded from
// engine.jsonl at start, so a restart neither repeats nor loses anything: a
// container that went away while the watcher was down gets its "removed"
// snapshot at the first list.
class Tracker {
 public:
  // The last recorded state of each container in the log (a "removed" one forgotten).
  void seed(const Snapshot& s);
  // A container after an event: one snapshot, whatever changed (`c` null: the
  // engine no longer has it, so it is recorded removed).
  Snapshot on_event(const Event& e, const Container* c, const Ifaces& ifaces, int64_t now_ms);
  // A whole list. `all`: a snapshot of every listed container (after a start or
  // a gap, and at the top of a rotated file); otherwise only of those whose
  // state or endpoints changed since last recorded. Either way a "removed"
  // snapshot for each known container the list lacks.
  std::vector<Snapshot> on_list(const std::vector<Container>& list, const Ifaces& ifaces,
                                int64_t now_ms, bool all);
  size_t size() const { return known_.size(); }
  // Networks named by endpoints that `ifaces` does not know (worth a re-fetch).
  static bool missing_iface(const std::vector<Container>& list, const Ifaces& ifaces);

 private:
  Snapshot record(const Container& c, const Ifaces& ifaces, int64_t now_ms, std::string event,
                  int64_t engine_ms);
  std::map<std::string, Snapshot> known_;
  // Claims of containers recently gone, so the removal that follows a die still
  // names them; bounded (cleared past kMaxContainers).
  std::map<std::string, Claims> gone_;
};

}  // namespace fy::engine
