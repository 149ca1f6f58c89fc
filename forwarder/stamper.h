// Writes the forwarder's stamps (core/stamp.h, docs/stamp.md): the key, the
// boot id and the per-boot sequence.
//
// The sequence is unique per boot across forwarder restarts, so the proxy's
// replay guard never mistakes a restarted forwarder's stamps for replays: the
// next unreserved value is kept in <state_dir>/seq (a tmpfs under /run, so it
// resets with the boot), reserved in blocks before any value of the block is
// used. A crash loses at most the rest of one block.
//
// Thread-safe: every worker stamps through the one Stamper, and SIGHUP
// reloads the key from the main thread. The lock covers the sequence and a
// copy of the key; the HMAC is computed outside it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/result.h"
#include "core/stamp.h"

namespace fy::fwd {

class Stamper {
 public:
  static constexpr uint64_t kBlock = 4096;

  Result<void> init(const std::string& key_file, const std::string& boot_id_file,
                    const std::string& state_dir);
  // Re-reads the key file; on error the old key stays in use.
  Result<void> reload_key();

  // The complete header line for one new connection: "Fy-Stamp: <value>\r\n".
  // Takes the next sequence number.
  std::string line(const std::string& src, const std::string& net, const std::string& who);

  const std::string& boot() const { return boot_; }
  uint64_t issued() const;
  // True when the last block reservation could not be written (stamps still
  // go out; a restart may then repeat sequences, which the proxy refuses).
  bool persist_failed() const { return persist_failed_.load(std::memory_order_relaxed); }

 private:
  void reserve();  // with mu_ held (or before any worker runs)

  std::string key_file_;
  std::string boot_;
  std::string seq_path_;
  mutable std::mutex mu_;
  std::string key_;        // guarded by mu_
  uint64_t next_ = 1;      // guarded by mu_
  uint64_t reserved_ = 0;  // guarded by mu_; values < reserved_ are on record as used
  std::atomic<bool> persist_failed_{false};
};

}  // namespace fy::fwd
