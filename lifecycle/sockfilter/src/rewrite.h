// The create-body rewrite: strips every runtime-selecting field from a
// container-create body and keeps every other byte as written.
//
// podman decodes create bodies with a stream decoder of Go's: encoding/json
// (podman 4.3 and 5.x) or json-iterator's std-compatible config (podman 6).
// A key binds to a struct field exactly or, failing that, case-insensitively
// by Go's Unicode case mapping: encoding/json by simple folding (fold() in
// route.h: `HoſtConfig`, `annotationſ` bind), json-iterator by
// strings.ToLower (fold_lower(): `oci_runtİme` binds). A repeated key merges
// into the same map, and trailing data after the value is ignored. So this
// rewrite, to see exactly what either engine will see:
//   - refuses a key that repeats another in the same object, exactly or as
//     either decoder folds it, at every level;
//   - strips every key that either decoder binds to: libpod `oci_runtime`; compat
//     `HostConfig.Runtime`; and in libpod `annotations` / compat
//     `HostConfig.Annotations` every key that starts `dev.gvisor.` or names
//     the sandbox runsc would join (io.kubernetes.cri.sandbox-id and
//     .container-type, io.kubernetes.cri-o.SandboxID and .ContainerType);
//   - refuses anything after the JSON value but whitespace, invalid JSON,
//     invalid UTF-8 or a lone \u surrogate, a top level that is not an object,
//     and nesting deeper than kMaxDepth;
//   - keeps the rest byte for byte: numbers as written, key order, spacing.
// Pure: the input is read, the output is a new string.
#pragma once

#include <string>
#include <string_view>

namespace fy::sockfilter {

enum class Family { libpod, compat };

inline constexpr int kMaxDepth = 128;

// The kinds of stripped member, as the counters name them.
enum class Stripped { oci_runtime, hostconfig_runtime, gvisor_annotation, sandbox_annotation };
inline constexpr int kStrippedKinds = 4;
std::string_view stripped_name(Stripped s);

struct Rewrite {
  bool ok = false;
  std::string body;    // the body to forward (when ok)
  std::string error;   // what was wrong, for the 400 (when !ok)
  int stripped = 0;    // how many members were removed
  int by_kind[kStrippedKinds] = {};  // the same, by Stripped
};

Rewrite rewrite_create(std::string_view body, Family family);

// True when a folded annotation key selects runsc behaviour or a sandbox.
bool is_runtime_annotation(std::string_view folded_key);

}  // namespace fy::sockfilter
