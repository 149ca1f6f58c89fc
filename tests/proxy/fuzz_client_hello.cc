// Fuzzes the ClientHello reader that decides tunnel vs decrypt.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proxy/tls/client_hello.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // Whole, and every prefix the proxy could see on the way there.
  auto full = fy::tls::parse_client_hello(in);
  for (size_t n = 0; n < size && n < 64; ++n) (void)fy::tls::parse_client_hello(in.substr(0, n));
  if (full.status == fy::tls::ClientHello::Status::ok && full.sni.size() > 253) __builtin_trap();
  return 0;
}
