#include "proxy/policy/stamp_binding.h"

#include "core/text.h"

namespace fy::stamp_binding {

Found find(std::span<const http::Header> headers) {
  Found f;
  for (const http::Header& h : headers) {
    if (stamp::is_stamp_header(h.name)) {
      f.value = h.value;
      ++f.count;
    }
  }
  return f;
}

Found scan_raw(std::string_view raw) {
  Found f;
  for (size_t at = raw.find("\r\n"); at != std::string_view::npos;) {
    size_t start = at + 2;
    size_t end = raw.find("\r\n", start);
    if (end == std::string_view::npos) break;
    std::string_view line = raw.substr(start, end - start);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos && stamp::is_stamp_header(line.substr(0, colon))) {
      f.value = trim_ows(line.substr(colon + 1));
      ++f.count;
    }
    at = end;
  }
  return f;
}

Binding bind(const Found& found, std::string_view key, stamp::ReplayGuard& guard) {
  Binding b;
  if (key.empty()) return b;  // attribution not expected
  b.attribution = netlog::Attribution::unattributed;
  if (found.count != 1) {
    b.outcome = found.count == 0 ? Outcome::none : Outcome::several;
    return b;
  }
  auto f = stamp::verify(found.value, key);
  if (!f) {
    b.outcome = Outcome::invalid;
    b.error = f.error().message;
    return b;
  }
  b.fields = std::move(*f);
  if (!guard.accept(b.fields.boot, b.fields.seq)) {
    b.outcome = Outcome::replayed;
    return b;
  }
  b.outcome = Outcome::valid;
  b.attribution = netlog::Attribution::attributed;
  return b;
}

}  // namespace fy::stamp_binding
