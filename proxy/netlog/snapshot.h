// Engine snapshots (engine.jsonl, beside the Network Log) and the resolution
// of a row's stamp to the principal that made it, at read time.
//
// fy-engine-watch writes one record per line: a container's whole state as the
// engine reported it at `ts` (a snapshot), or a record of the watcher itself
// (started, re-synced after a gap, listed, stopped). The format is the
// contract in docs/engine-watch.md. Rows of the Network Log store the stamp
// (src, net, who), never a resolution: fy-netlog resolves them here, so a fix
// to the rule applies to the stored history.
//
// Clocks: a snapshot's `ts` is the watcher's wall clock on the host when it
// learned the state, the same clock fy-proxy stamps its rows with. The engine's
// own event time (`engine_time`, the VM's clock) is kept for the operator but
// never used to order anything: a guest clock drifts (suspend, no NTP), the
// host's is the one both records share.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "proxy/netlog/row.h"

namespace fy::netlog {

// One network endpoint of a container: the engine's network name, the bridge
// interface it is on (what the forwarder writes as the stamp's `net`), the
// container's address there.
struct Endpoint {
  std::string net;    // the engine's network name ("shop_default")
  std::string iface;  // its bridge interface ("podman1"); "" when not known
  std::string ip;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
  friend bool operator<(const Endpoint& a, const Endpoint& b) {
    return a.iface != b.iface ? a.iface < b.iface : a.ip != b.ip ? a.ip < b.ip : a.net < b.net;
  }
};

// What the engine says of a container. Every name here is the engine's
// claim: the container's creator chose it (docs/engine-watch.md).
struct Claims {
  std::string name;     // the container's name, without podman's leading '/'
  std::string project;  // com.docker.compose.project or io.podman.compose.project
  std::string service;  // com.docker.compose.service or io.podman.compose.service
  friend bool operator==(const Claims&, const Claims&) = default;
};

struct Snapshot {
  enum class Kind : uint8_t {
    container,  // a container's state at ts
    watch,      // the watcher's own record (event says which)
  };
  Kind kind = Kind::container;
  int64_t ts_ms = 0;         // the watcher's (host) clock
  std::string event;         // container: what prompted it ("start", "die", "list", ...);
                             // watch: "start", "resync", "list", "stop"
  std::string id;            // container id (64 hex)
  std::string state;         // "running", "exited", "removed", ...
  int64_t engine_ms = -1;    // the engine's event time, -1 when none (a list)
  Claims claims;
  std::vector<Endpoint> endpoints;  // sorted; empty when the container holds no address
  uint64_t containers = 0;          // watch "list"/"resync": containers listed
};

// Appends one snapshot as a JSON line (with '\n').
void append_snapshot_json(std::string& out, const Snapshot& s);

// Parses one line of engine.jsonl. Untrusted as any file is: a line that is not
// a snapshot is an error saying why. Never throws.
Result<Snapshot> parse_snapshot(std::string_view line);

// ---- Principals --------------------------------------------------------------

// Who made a row, as far as the records tell.
struct Principal {
  enum class Kind : uint8_t {
    container,     // a container (by its address on a bridge, or by id on the VM listener)
    build,         // a build step (who=build:<scope>)
    user,          // the VM user (who=user)
    uid,           // a non-walled uid (who=uid:<n>)
    unresolved,    // attributed, but no snapshot names the holder: `reason` says why
    unattributed,  // the proxy has a key and the connection had no valid stamp
    none,          // the proxy has no stamp key: attribution not recorded
  };
  Kind kind = Kind::none;
  std::string id;        // container id; build scope; uid
  Claims claims;         // container: the engine's claims (names chosen by its creator)
  std::string reason;    // unresolved: why
  std::string src, net;  // the stamp's address and network, for display
  // Container names come from the engine (its claims), never from foldyard's
  // own records; true marks that for the operator (always true today: foldyard
  // does not yet create the networks itself, docs/engine-watch.md).
  bool claim = false;

  // The grouping key and short label: "svc:shop/web", "ctr:name", "ctr:3f2a9c1b7d0e",
  // "build:<scope>", "user", "uid:0", "unresolved", "unattributed", "-".
  std::string label() const;
};

// Resolution of stamps over a set of snapshots (all of engine.jsonl and its
// backups, in file order). Pure: build it once, then ask per row.
//
// The rule (ADR-0034): per (interface, address), the snapshots that gave or
// took the address form a timeline. A row at time t takes the last entry at or
// before t when that entry holds the address; otherwise the first entry after t
// when that one holds it; so a holder is never carried past a snapshot that
// dropped the address. Inside a gap (the watcher was not running: between the
// last record before a watch "start"/"resync" and that record), the engine may
// have changed hands unseen, so a row there resolves only when the holders on
// both sides of the gap are the same container; else it is unresolved and says
// so. A stamp whose `net` names an interface no snapshot knew is matched on the
// address alone among endpoints whose interface is unknown.
class Resolver {
 public:
  void add(const Snapshot& s);  // in file order; ts out of order is tolerated (stable sort)
  void finish();                // call once after the last add()

  Principal resolve(const Row& row) const;
  // The latest claims recorded for a container id ("" when never seen).
  const Snapshot* latest(std::string_view id) const;
  size_t snapshots() const { return snaps_.size(); }
  // Gaps in the watcher's record: [from, to] in ms.
  const std::vector<std::pair<int64_t, int64_t>>& gaps() const { return gaps_; }

 private:
  struct Entry {
    int64_t ts_ms;
    int snap;  // index into snaps_ of the holder, -1 when the address was dropped
    std::string dropped_by;  // the container that dropped it
  };
  bool in_gap(int64_t ts, std::pair<int64_t, int64_t>* gap) const;
  std::vector<Snapshot> snaps_;
  std::map<std::pair<std::string, std::string>, std::vector<Entry>> by_addr_;  // (iface, ip)
  std::map<std::string, int, std::less<>> latest_;                              // id -> snap
  std::vector<std::pair<int64_t, int64_t>> gaps_;
  bool finished_ = false;
};

}  // namespace fy::netlog
