// The client side of fy-forwarder's control socket: one line out, one line
// back. Used by `fy-forwarder --probe` and by fy-forwarder-hook.
#pragma once

#include <string>

#include "core/result.h"

namespace fy::fwd {

// Connects to `path`, sends `command` + "\n" and returns the answer line
// (without its newline). Gives up after `timeout_ms`.
Result<std::string> control_query(const std::string& path, const std::string& command,
                                  int timeout_ms);

}  // namespace fy::fwd
