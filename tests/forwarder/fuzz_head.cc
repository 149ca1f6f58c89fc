// libFuzzer target for the forwarder's head check (forwarder/head.h).
//
// Beyond "no crash, no sanitizer report", it checks the property the head
// check exists for: whatever head it accepts and a strict HTTP/1 parser
// (llhttp in strict mode, as the proxy uses) accepts too, the stamped head it
// sends on is read by that parser as exactly the same request line and the
// same header lines, minus every client-written stamp, plus exactly one stamp:
// ours; and the rewrite never changes the strict parser's verdict.
#include <llhttp.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/text.h"
#include "forwarder/head.h"

namespace {

struct Seen {
  std::string url;
  std::vector<std::string> names;
  std::string cur;
  bool complete = false;
};

int on_url(llhttp_t* p, const char* at, size_t n) {
  static_cast<Seen*>(p->data)->url.append(at, n);
  return 0;
}
int on_field(llhttp_t* p, const char* at, size_t n) {
  static_cast<Seen*>(p->data)->cur.append(at, n);
  return 0;
}
int on_field_done(llhttp_t* p) {
  auto* s = static_cast<Seen*>(p->data);
  s->names.push_back(s->cur);
  s->cur.clear();
  return 0;
}
int on_headers_complete(llhttp_t* p) {
  static_cast<Seen*>(p->data)->complete = true;
  return 1;  // no body: stop at the end of the head
}

Seen strict_parse(std::string_view bytes) {
  llhttp_settings_t st;
  llhttp_settings_init(&st);
  st.on_url = on_url;
  st.on_header_field = on_field;
  st.on_header_field_complete = on_field_done;
  st.on_headers_complete = on_headers_complete;
  llhttp_t p;
  llhttp_init(&p, HTTP_REQUEST, &st);
  Seen s;
  p.data = &s;
  llhttp_execute(&p, bytes.data(), bytes.size());
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  fy::fwd::Head h;
  fy::fwd::HeadLimits lim{4096, 64};
  auto r = fy::fwd::parse_head(in, lim, &h);
  if (r.status != fy::fwd::ParseStatus::complete) return 0;
  if (h.length > in.size() || h.keep_count > fy::fwd::Head::kMaxKeep) abort();

  const std::string ours = "Fy-Stamp: v=1;ours\r\n";
  iovec iov[fy::fwd::Head::kMaxKeep + 2];
  size_t n = fy::fwd::build_iov(h, in, ours, iov);
  std::string out;
  for (size_t i = 0; i < n; ++i) out.append(static_cast<char*>(iov[i].iov_base), iov[i].iov_len);

  Seen before = strict_parse(in.substr(0, h.length));
  Seen after = strict_parse(out);
  // The strict parser may refuse what the head check lets through (a method it
  // does not know, a Content-Length that is not a number): then the proxy
  // refuses it too, and nothing passes. What must never happen is that our
  // rewrite changes its verdict, or that it reads the head differently.
  if (before.complete != after.complete) abort();
  if (!after.complete) return 0;
  if (after.url != h.target || before.url != h.target) abort();
  std::vector<std::string> expect;
  size_t stamps_in = 0;
  for (const auto& name : before.names) {
    if (fy::iequals(name, "Fy-Stamp"))
      ++stamps_in;
    else
      expect.push_back(name);
  }
  expect.push_back("Fy-Stamp");
  if (stamps_in != h.stamps_removed) abort();
  if (after.names != expect) abort();
  return 0;
}
