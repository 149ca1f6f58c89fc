// The engine's bytes (events, container and network lists) and the snapshot
// log's lines are untrusted: every parser here must return, never crash, and
// whatever parses as a snapshot must round-trip through the writer.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/engine/engine.h"
#include "proxy/netlog/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (auto e = fy::engine::parse_event(in)) (void)fy::engine::relevant(*e);
  auto list = fy::engine::parse_containers(in);
  auto nets = fy::engine::parse_networks(in);
  if (list) {
    fy::engine::Tracker t;
    auto snaps = t.on_list(*list, nets ? *nets : fy::engine::Ifaces{}, 1, true);
    fy::netlog::Resolver r;
    for (const auto& s : snaps) {
      std::string line;
      fy::netlog::append_snapshot_json(line, s);
      line.pop_back();
      auto back = fy::netlog::parse_snapshot(line);
      if (!back) __builtin_trap();
      r.add(*back);
    }
    r.finish();
  }
  if (auto s = fy::netlog::parse_snapshot(in)) {
    fy::netlog::Resolver r;
    r.add(*s);
    r.finish();
    fy::netlog::Row row;
    row.attribution = fy::netlog::Attribution::attributed;
    for (const auto& e : s->endpoints) {
      row.src = e.ip;
      row.net = e.iface;
      (void)r.resolve(row);
    }
  }
  return 0;
}
