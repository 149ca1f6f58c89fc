// Fuzzes the stamp binding's raw line scanner (proxy/policy/stamp_binding.h)
// differentially against the request parser: scan_raw reads a head that
// llhttp refused, so on every head the parser accepts the two must find the
// same stamp fields (how many, and the value kept), or a stamp would be
// bound differently depending on whether the head happened to parse.
#include <cstddef>
#include <cstdint>
#include <string>

#include "proxy/http/parser.h"
#include "proxy/policy/stamp_binding.h"

using namespace fy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  // Never trusted to parse: whatever the bytes, the scan terminates.
  stamp_binding::Found raw = stamp_binding::scan_raw(input);
  if (raw.count > 0 && raw.value.data() < input.data()) __builtin_trap();

  http::Limits lim;
  lim.max_head_bytes = 8192;
  lim.max_headers = 64;
  http::HeadScanner scan(lim);
  size_t used = 0;
  http::ParseError err;
  if (scan.scan(input, &used, &err) != http::HeadScanner::Status::complete) return 0;
  std::string_view head = input.substr(0, used);
  http::Parser parser(HTTP_REQUEST, lim);
  http::Head h;
  if (!parser.parse_head(head, &h, &err)) return 0;
  stamp_binding::Found parsed = stamp_binding::find(h.headers);
  stamp_binding::Found scanned = stamp_binding::scan_raw(head);
  if (parsed.count != scanned.count) __builtin_trap();
  if (parsed.count > 0 && parsed.value != scanned.value) __builtin_trap();
  return 0;
}
