// Fuzzes what a credential minter prints ({"value", "ttl"}) and the redaction
// applied to what it writes on stderr.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proxy/inject/redact.h"
#include "proxy/inject/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto r = fy::inject::parse_minter_output(in);
  if (r && (r->first.empty() || r->second < 0)) __builtin_trap();
  auto tail = fy::inject::stderr_tail(in);
  if (tail.size() > 500) __builtin_trap();
  (void)fy::inject::redact_query_param(in, "token");
  (void)fy::inject::set_query_param(in, "token", "v");
  return 0;
}
