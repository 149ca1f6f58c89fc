// libFuzzer target: the create-body rewrite, with its property. Input: a
// family byte, then the body. When the rewrite accepts:
//   - nlohmann-json (the reference decoder) accepts the input and the output;
//   - the input has no key repeated in its object, exactly or in another case
//     (found with nlohmann's parse callback), as podman's merging decoder
//     would otherwise unite them;
//   - the output, parsed, equals the input parsed minus the stripped fields
//     (removed from the reference tree by folded key, as jsoniter binds them);
//   - nothing stripped means the output is the input, byte for byte.
// When the input repeats a key (folded), the rewrite must refuse it.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "src/rewrite.h"
#include "src/route.h"

using namespace fy::sockfilter;
using nlohmann::json;

namespace {

void strip_annotations(json& a) {
  if (!a.is_object()) return;
  for (auto it = a.begin(); it != a.end();) {
    if (is_runtime_annotation(fold(it.key()))) it = a.erase(it);
    else ++it;
  }
}

void strip_model(json& v, Family f) {
  if (!v.is_object()) return;
  for (auto it = v.begin(); it != v.end();) {
    std::string k = fold(it.key());
    if (f == Family::libpod && k == "oci_runtime") {
      it = v.erase(it);
      continue;
    }
    if (f == Family::libpod && k == "annotations") strip_annotations(it.value());
    if (f == Family::compat && k == "hostconfig" && it.value().is_object()) {
      json& hc = it.value();
      for (auto h = hc.begin(); h != hc.end();) {
        std::string hk = fold(h.key());
        if (hk == "runtime") {
          h = hc.erase(h);
          continue;
        }
        if (hk == "annotations") strip_annotations(h.value());
        ++h;
      }
    }
    ++it;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Family f = data[0] & 1 ? Family::compat : Family::libpod;
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  Rewrite r = rewrite_create(body, f);

  bool dup = false;
  std::vector<std::unordered_set<std::string>> stack;
  json in;
  bool in_ok = true;
  try {
    in = json::parse(body, [&](int, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::object_start) stack.emplace_back();
      else if (ev == json::parse_event_t::object_end) stack.pop_back();
      else if (ev == json::parse_event_t::key && !stack.empty() &&
               !stack.back().insert(fold(parsed.get<std::string>())).second) {
        dup = true;
      }
      return true;
    });
  } catch (const json::out_of_range&) {
    // A number past a double (9e999999): valid JSON by its grammar, which the
    // filter keeps byte-exact; nlohmann cannot hold it and podman's decoder
    // refuses it as out of range, so there is no parity to check.
    return 0;
  } catch (const json::exception&) {
    in_ok = false;
  }
  if (dup && r.ok) abort();
  if (!r.ok || body.empty()) return 0;
  if (!in_ok) abort();  // accepted what the reference decoder refuses
  json out;
  try {
    out = json::parse(r.body);
  } catch (const json::exception&) {
    abort();  // emitted invalid JSON
  }
  strip_model(in, f);
  if (in != out) abort();
  if (r.stripped == 0 && r.body != body) abort();
  if (r.stripped > 0 && r.body.size() >= body.size()) abort();
  return 0;
}
