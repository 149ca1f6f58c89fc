// libFuzzer target for the stamp parser (core/stamp.h, docs/stamp.md).
//
// Random bytes almost never carry a valid MAC, which would stop the parser at
// step 3. So the input is treated as the signed part: the target computes the
// right MAC itself and appends it, which drives verify() through the whole
// grammar. Properties: no crash; a value that verifies has exactly one
// spelling (format(verify(v)) == v); a value with a wrong MAC never verifies.
// The raw input is verified as well, as a peer would send it.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/crypto.h"
#include "core/stamp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string key(32, '\x5a');
  std::string in(reinterpret_cast<const char*>(data), size);
  (void)fy::stamp::verify(in, key);

  std::string value = in + ";mac=" + fy::hex(fy::hmac_sha256(key, "fy-stamp\n" + in));
  auto f = fy::stamp::verify(value, key);
  if (f.ok()) {
    if (fy::stamp::format(*f, key) != value) abort();
    std::string other(32, '\x5b');
    if (fy::stamp::verify(value, other).ok()) abort();
    std::string flipped = value;
    flipped[flipped.size() - 1] = flipped.back() == '0' ? '1' : '0';
    if (fy::stamp::verify(flipped, key).ok()) abort();
  }
  return 0;
}
