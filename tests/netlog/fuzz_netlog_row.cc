// libFuzzer target for reading the Network Log: the input is both one line
// and a whole file. What clients control reaches this parser (paths, user
// agents, hosts, error bodies), so it must never crash, and:
//   - a line it accepts as a row survives the writer's round trip: written
//     back with append_json and parsed again, the row is the same (strings
//     cut to the writer's limits);
//   - a file splits into lines the same way whatever the read size;
//   - every view line stays within its width, with no raw control character.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/netlog/reader.h"
#include "proxy/netlog/view.h"

using namespace fy::netlog;

namespace {

#define FUZZ_CHECK(cond)       \
  do {                         \
    if (!(cond)) std::abort(); \
  } while (0)

bool has_raw_control(std::string_view s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n') || c == 0x7F) return true;
  return false;
}

void check_lines(const std::string& text, size_t width) {
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    FUZZ_CHECK(display_width(std::string_view(text).substr(start, nl - start)) <= width);
    start = nl + 1;
  }
  FUZZ_CHECK(!has_raw_control(text));
}

void round_trip(const Row& r) {
  std::string line;
  append_json(line, r);
  FUZZ_CHECK(!line.empty() && line.back() == '\n');
  FUZZ_CHECK(line.find('\n') == line.size() - 1);
  line.pop_back();
  auto back = parse_row(line);
  FUZZ_CHECK(back.ok());
  const Row& b = *back;
  FUZZ_CHECK(b.ts_ms == r.ts_ms);
  FUZZ_CHECK(b.host == r.host);
  FUZZ_CHECK(b.status == r.status);
  FUZZ_CHECK(b.method == r.method);
  FUZZ_CHECK(b.conn == r.conn);
  FUZZ_CHECK(b.path == truncate_utf8(r.path, kMaxPath));
  FUZZ_CHECK(b.ua == truncate_utf8(r.ua, kMaxUa));
  FUZZ_CHECK(b.error_body == truncate_utf8(r.error_body, kMaxErrorBody));
  FUZZ_CHECK(b.error == r.error);
  FUZZ_CHECK(b.blocked == r.blocked && b.would_block == r.would_block);
  FUZZ_CHECK(b.passthrough == r.passthrough && b.injected == r.injected);
  FUZZ_CHECK(b.bytes_up == r.bytes_up && b.bytes_down == r.bytes_down);
  FUZZ_CHECK(b.duration_ms == r.duration_ms);
  FUZZ_CHECK(b.attribution == r.attribution);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);

  // One line.
  auto row = parse_row(in);
  if (row.ok()) round_trip(*row);

  // A file: split at two read sizes, same rows, same bad lines.
  ReadStats a, b;
  std::vector<std::string> lines_a, lines_b;
  Summary sum;
  Grants grants;
  const int64_t now = 1796074200000;
  ViewOptions o{80, now, /*utc=*/true};
  RowPrinter rows(RowPrinter::Kind::rows, o), refusals(RowPrinter::Kind::refusals, o);
  std::string rows_text, refusals_text;
  {
    LineParser p("fuzz");
    p.feed(in, a, [&](const Row& r, std::string_view l) {
      lines_a.emplace_back(l);
      sum.add(r);
      grants.add(r);
      rows_text += rows.line(r);
      if (is_refusal(r)) refusals_text += refusals.line(r);
    });
    p.finish(a);
  }
  {
    LineParser p("fuzz");
    size_t step = size ? 1 + data[0] % 13 : 1;
    for (size_t off = 0; off < in.size(); off += step)
      p.feed(in.substr(off, step), b,
             [&](const Row&, std::string_view l) { lines_b.emplace_back(l); });
    p.finish(b);
  }
  FUZZ_CHECK(a.rows == b.rows && a.bad_lines == b.bad_lines && lines_a == lines_b);

  check_lines(rows_text, 80);
  check_lines(refusals_text, 80);
  check_lines(render_summary(sum.hosts(), sum.total(), o), 80);
  std::string g = grants.render(o);
  FUZZ_CHECK(!has_raw_control(g));
  std::string s = sanitize(in);
  FUZZ_CHECK(!has_raw_control(s));
  FUZZ_CHECK(display_width(fit_middle(s, 29)) <= 29);
  FUZZ_CHECK(display_width(fit_end(s, 40)) <= 40);
  return 0;
}
