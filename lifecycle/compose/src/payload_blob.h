// The guest payload, generated at build time by payload/build_payload.py from
// Debian's podman-compose, python3-yaml and python3-dotenv plus the runner.
#pragma once

namespace fy::compose {
extern const unsigned long kPayloadSize;
extern const char kPayloadSha256[];    // hex sha256 of the zip's bytes
extern const char kPayloadVersions[];  // "podman-compose=1.0.3-3 ..."
extern const char kBootstrap[];        // payload/bootstrap.py
extern const unsigned char kPayload[];
}  // namespace fy::compose
