// Feeds arbitrary bytes, split at an arbitrary point, to the stripper: the
// result must hold no ESC, no C0 byte but '\n' and '\t', no DEL, no UTF-8 C1
// (0xC2 0x80-0x9f), and must not depend on where the input was split.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "printable.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  size_t cut = in.empty() ? 0 : data[0] % (in.size() + 1);
  std::string whole = fy::compose::printable(in);
  fy::compose::Printable p;
  std::string split;
  p.feed(in.substr(0, cut), split);
  p.feed(in.substr(cut), split);
  if (split != whole) std::abort();
  for (size_t i = 0; i < whole.size(); ++i) {
    unsigned char c = whole[i];
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) std::abort();
    if (c == 0xC2 && i + 1 < whole.size() && (unsigned char)whole[i + 1] >= 0x80 &&
        (unsigned char)whole[i + 1] <= 0x9f)
      std::abort();
  }
  return 0;
}
