// libFuzzer target: the create-body rewrite, with its property. Input: a
// family byte, then the body. When the rewrite accepts:
//   - nlohmann-json (the reference decoder) accepts the input and the output;
//   - the input has no key repeated in its object, exactly or in another case
//     (found with nlohmann's parse callback), as podman's merging decoder
//     would otherwise unite them;
//   - the output, parsed, equals the input parsed minus the stripped fields
//     (removed from the reference tree by key as either of podman's decoders
//     binds it: fold() for encoding/json, fold_lower() for json-iterator);
//   - nothing stripped means the output is the input, byte for byte.
// When the input repeats a key (as either decoder folds it), the rewrite must
// refuse it.
// And, against the Go oracle (go_oracle.h), which decodes as podman 4.3, 5.8
// and 6.0 do (encoding/json, json-iterator, podman's real field sets):
//   - nothing the oracle binds to a protected field in the output survives:
//     no runtime field, no runtime annotation, for any engine that accepts
//     the output;
//   - an engine that accepts the input accepts the output (the rewrite breaks
//     no body podman would take).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "go_oracle.h"
#include "src/rewrite.h"
#include "src/route.h"

using namespace fy::sockfilter;
using nlohmann::json;

namespace {

// A key as either of podman's decoders binds it (encoding/json: fold,
// json-iterator: fold_lower) names `name`.
bool named(const std::string& key, std::string_view name) {
  return fold(key) == name || fold_lower(key) == name;
}

void strip_annotations(json& a) {
  if (!a.is_object()) return;
  for (auto it = a.begin(); it != a.end();) {
    if (is_runtime_annotation(fold(it.key())) || is_runtime_annotation(fold_lower(it.key()))) {
      it = a.erase(it);
    } else {
      ++it;
    }
  }
}

void strip_model(json& v, Family f) {
  if (!v.is_object()) return;
  for (auto it = v.begin(); it != v.end();) {
    const std::string k = it.key();
    if (f == Family::libpod && named(k, "oci_runtime")) {
      it = v.erase(it);
      continue;
    }
    if (f == Family::libpod && named(k, "annotations")) strip_annotations(it.value());
    if (f == Family::compat && named(k, "hostconfig") && it.value().is_object()) {
      json& hc = it.value();
      for (auto h = hc.begin(); h != hc.end();) {
        const std::string hk = h.key();
        if (named(hk, "runtime")) {
          h = hc.erase(h);
          continue;
        }
        if (named(hk, "annotations")) strip_annotations(h.value());
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
  std::vector<std::unordered_set<std::string>> stack, stack_lower;
  json in;
  bool in_ok = true;
  try {
    in = json::parse(body, [&](int, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::object_start) {
        stack.emplace_back();
        stack_lower.emplace_back();
      } else if (ev == json::parse_event_t::object_end) {
        stack.pop_back();
        stack_lower.pop_back();
      } else if (ev == json::parse_event_t::key && !stack.empty()) {
        const std::string k = parsed.get<std::string>();
        if (!stack.back().insert(fold(k)).second) dup = true;
        if (!stack_lower.back().insert(fold_lower(k)).second) dup = true;
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

  fy::sockfilter::test::GoOracle* o = fy::sockfilter::test::GoOracle::get();
  if (!o) {
    fprintf(stderr, "fuzz_sockfilter_rewrite needs the Go oracle (install golang-go)\n");
    abort();
  }
  char kind = f == Family::libpod ? 'L' : 'C';
  auto runtime_annotation = [](const std::string& k) {
    return is_runtime_annotation(fold(k)) || is_runtime_annotation(fold_lower(k));
  };
  json go_in = o->ask(kind, body);
  json go_out = r.stripped == 0 ? go_in : o->ask(kind, r.body);
  for (size_t i = 0; i < go_out["views"].size(); ++i) {
    const json& v = go_out["views"][i];
    if (v["error"].is_null()) {
      if (fy::sockfilter::test::binds_protected(v, runtime_annotation)) abort();
    } else if (go_in["views"][i]["error"].is_null()) {
      abort();  // the engine took the input and refuses the output
    }
  }
  return 0;
}
