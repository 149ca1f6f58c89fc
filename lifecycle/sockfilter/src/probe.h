// The fail-closed probe (ADR-0025 §3): through the filtered socket, create a
// throwaway container that asks for crun, inspect the runtime the engine gave
// it, remove it. `podman info` is not enough: it names a runtime whose binary
// may be missing. Blocking I/O: it runs alone, from the lifecycle.
#pragma once

#include <string>

namespace fy::sockfilter {

// Returns the exit code: 0 when the container's OCIRuntime is `runtime`,
// 1 otherwise (with a line on stderr saying what was seen).
int run_probe(const std::string& socket, const std::string& image, const std::string& runtime);

}  // namespace fy::sockfilter
