// Fuzzes the request path: the head scanner, llhttp with the proxy's checks,
// and body framing, over input split at a fuzzer-chosen point (heads and
// bodies arrive in pieces). Also fuzzes the response parser on the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "proxy/http/parser.h"
#include "proxy/http/rewrite.h"

using namespace fy::http;

namespace {

void run(llhttp_type_t type, const uint8_t* data, size_t size) {
  Limits lim;
  lim.max_head_bytes = 4096;
  lim.max_headers = 32;
  if (size < 1) return;
  size_t split = data[0] % (size);
  std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  Parser parser(type, lim);
  // As fy-proxy's request parser: a trailer field named like this ends the
  // body with a 400 (the stamp's name; any name works for the parser).
  if (type == HTTP_REQUEST)
    parser.refuse_trailer = [](std::string_view n) {
      return n.size() == 8 && (n[0] | 0x20) == 'f' && (n[1] | 0x20) == 'y' && n[2] == '-';
    };
  HeadScanner scan(lim);
  std::string head;
  size_t pos = 0;
  // Messages in a row, as on a kept-alive connection.
  for (int message = 0; message < 4 && pos < input.size(); ++message) {
    scan.reset();
    head.clear();
    size_t used = 0;
    ParseError err;
    bool complete = false;
    // First piece up to the split point, then the rest.
    while (pos < input.size()) {
      size_t end = (pos < split && split < input.size()) ? split : input.size();
      auto st = scan.scan(std::string_view(input).substr(pos, end - pos), &used, &err);
      if (st == HeadScanner::Status::error) return;
      if (st == HeadScanner::Status::need_more) {
        head.append(input, pos, end - pos);
        pos = end;
        continue;
      }
      head.append(input, pos, used);
      pos += used;
      complete = true;
      break;
    }
    if (!complete) return;
    Head h;
    if (type == HTTP_RESPONSE) parser.expect_response_to(message % 2 ? HTTP_HEAD : HTTP_GET);
    if (!parser.parse_head(head, &h, &err)) return;
    if (type == HTTP_REQUEST) {
      if (!check_request_framing(h, &err)) return;
      RequestOut out;
      out.method = h.method;
      out.target = "/";
      out.host = "a.test";
      out.upgrade = h.upgrade;
      std::string rebuilt;
      build_request_head(rebuilt, h, out);
      if (rebuilt.find("\r\n\r\n") + 4 != rebuilt.size()) __builtin_trap();
    } else {
      std::string rebuilt;
      build_response_head(rebuilt, h, true, false);
    }
    if (h.upgrade) return;
    size_t body_budget = 1 << 16;
    while (!parser.message_complete() && pos < input.size() && body_budget > 0) {
      auto n = parser.parse_body(input.data() + pos, input.size() - pos, &err);
      if (!n) {
        if (err.status != 400) __builtin_trap();  // a body framing error, a refused trailer
        return;
      }
      if (*n == 0) break;
      pos += *n;
      body_budget -= std::min(body_budget, *n);
    }
    if (!parser.message_complete()) {
      if (type == HTTP_RESPONSE) parser.finish();
      return;
    }
    parser.next_message();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(HTTP_REQUEST, data, size);
  run(HTTP_RESPONSE, data, size);
  return 0;
}
