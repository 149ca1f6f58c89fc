// libFuzzer target: the framing the filter forwards, read back by Go's
// net/http (the Go oracle, go_oracle.h). Input: the bytes a client sends on one
// connection. They go through the filter's request path as filter.cc runs it
// for a forwarded (pass) request: the raw-head checks, llhttp in strict mode
// (the head executed whole, paused at its end), check_head, emit_head, each
// body piece re-chunked with chunk_size_line() or copied under the new
// Content-Length, kLastChunk at the message's end, a trailer field refused,
// the next request only after a keep-alive one. The bytes emitted are then
// read by net/http.ReadRequest, each body to its end. The property:
//   - net/http reads the requests the filter forwarded, in order, with the
//     same method, target and body, and no trailer;
//   - it may stop early only by refusing a request's head (the engine then
//     answers 400 and closes: nothing after it is read), never inside or after
//     a body the filter framed;
//   - a request the filter did not finish (input ended, or a trailer field)
//     is read by net/http as unfinished (a body error), never as complete;
//   - nothing is left over after the last request net/http read.
// The connection loop itself (libuv, timers, the engine's answers) is
// filter.cc's and is tested through the binary by test_go_oracle.py.
#include <llhttp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "go_oracle.h"
#include "src/http.h"

using namespace fy::sockfilter;
using fy::sockfilter::test::GoOracle;

namespace {

constexpr size_t kMaxHead = 64 * 1024;

struct Forwarded {
  std::string method, target, body;
  bool complete = false;
};

struct Model {
  llhttp_t p{};
  llhttp_settings_t s{};
  RequestHead head;
  bool in_headers = true, new_field = true, head_done = false, msg_done = false;
  bool trailer = false, chunked_out = false;
  std::string* wire = nullptr;
  Forwarded* cur = nullptr;
};

Model* of(llhttp_t* p) {
  return static_cast<Model*>(p->data);
}

int on_url(llhttp_t* p, const char* at, size_t n) {
  if (of(p)->in_headers) of(p)->head.target.append(at, n);
  return 0;
}
int on_field(llhttp_t* p, const char* at, size_t n) {
  Model* m = of(p);
  if (!m->in_headers) {
    m->trailer = true;  // filter.cc: a trailer field is refused
    return HPE_USER;
  }
  if (m->new_field) {
    m->head.headers.push_back({});
    m->new_field = false;
  }
  m->head.headers.back().name.append(at, n);
  return 0;
}
int on_value(llhttp_t* p, const char* at, size_t n) {
  Model* m = of(p);
  if (m->in_headers && !m->head.headers.empty()) m->head.headers.back().value.append(at, n);
  return 0;
}
int on_value_done(llhttp_t* p) {
  Model* m = of(p);
  m->new_field = true;
  if (m->in_headers && !m->head.headers.empty()) {
    std::string& v = m->head.headers.back().value;
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  }
  return 0;
}
int on_headers_done(llhttp_t* p) {
  Model* m = of(p);
  m->in_headers = false;
  m->head_done = true;
  m->head.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
  m->head.major = p->http_major;
  m->head.minor = p->http_minor;
  m->head.chunked = (p->flags & F_CHUNKED) != 0;
  if (p->flags & F_CONTENT_LENGTH) m->head.content_length = p->content_length;
  m->head.keep_alive = llhttp_should_keep_alive(p) != 0;
  return HPE_PAUSED;
}
int on_body(llhttp_t* p, const char* at, size_t n) {
  Model* m = of(p);
  m->cur->body.append(at, n);
  if (m->chunked_out) {
    m->wire->append(chunk_size_line(n)).append(at, n).append("\r\n");
  } else {
    m->wire->append(at, n);
  }
  return 0;
}
int on_done(llhttp_t* p) {
  of(p)->msg_done = true;
  return HPE_PAUSED;
}

// Runs the client's bytes through the model: the bytes it sends upstream
// (`wire`) and what it forwarded.
std::vector<Forwarded> run(std::string in, std::string* wire) {
  Model m;
  llhttp_settings_init(&m.s);
  m.s.on_url = on_url;
  m.s.on_header_field = on_field;
  m.s.on_header_value = on_value;
  m.s.on_header_value_complete = on_value_done;
  m.s.on_headers_complete = on_headers_done;
  m.s.on_body = on_body;
  m.s.on_message_complete = on_done;
  llhttp_init(&m.p, HTTP_REQUEST, &m.s);
  m.p.data = &m;
  m.wire = wire;
  std::vector<Forwarded> out;
  while (!in.empty()) {
    if (in.compare(0, 4, "PRI ") == 0) break;
    size_t end = in.find("\r\n\r\n");
    if (end == std::string::npos || end + 4 > kMaxHead) break;
    size_t head_len = end + 4;
    if (check_raw_head(std::string_view(in).substr(0, head_len))) break;
    m.head = RequestHead{};
    m.in_headers = m.new_field = true;
    m.head_done = m.msg_done = m.trailer = false;
    llhttp_errno_t rc = llhttp_execute(&m.p, in.data(), head_len);
    if (rc != HPE_PAUSED || !m.head_done) break;
    in.erase(0, static_cast<size_t>(llhttp_get_error_pos(&m.p) - in.data()));
    if (check_head(m.head)) break;
    llhttp_resume(&m.p);
    m.chunked_out = m.head.chunked;
    wire->append(emit_head(m.head, m.head.chunked, m.head.content_length, false));
    out.push_back({m.head.method, m.head.target, "", false});
    m.cur = &out.back();
    if (!m.head.has_body()) {
      llhttp_execute(&m.p, in.data(), 0);
      m.msg_done = true;
    } else if (!in.empty()) {
      rc = llhttp_execute(&m.p, in.data(), in.size());
      if (rc == HPE_PAUSED || rc == HPE_PAUSED_UPGRADE) {
        in.erase(0, static_cast<size_t>(llhttp_get_error_pos(&m.p) - in.data()));
      } else if (rc == HPE_OK) {
        in.clear();
      } else {
        break;  // a framing error or a trailer field: the body never ends upstream
      }
    }
    if (!m.msg_done) break;  // the input ended inside the body
    if (m.chunked_out) wire->append(kLastChunk);
    m.cur->complete = true;
    llhttp_reset(&m.p);
    if (!m.head.keep_alive) break;  // the filter closes after its answer
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  GoOracle* o = GoOracle::get();
  if (!o) {
    fprintf(stderr, "fuzz_sockfilter_framing needs the Go oracle (install golang-go)\n");
    abort();
  }
  std::string wire;
  std::vector<Forwarded> fwd = run(std::string(reinterpret_cast<const char*>(data), size), &wire);
  if (wire.empty()) return 0;
  nlohmann::json a = o->ask('H', wire);
  const nlohmann::json& rs = a["requests"];
  std::string err = a["error"];
  if (rs.size() > fwd.size()) abort();  // Go read a request the filter did not forward
  for (size_t i = 0; i < rs.size(); ++i) {
    const nlohmann::json& r = rs[i];
    if (r["method"] != fwd[i].method || r["target"] != fwd[i].target) abort();
    if (!r["trailer"].is_null()) abort();
    bool body_error = r["body_error"] != "";
    if (fwd[i].complete) {
      if (body_error || r["body"] != fwd[i].body) abort();
    } else {
      // Unfinished here: Go must not see it end.
      if (!body_error) abort();
      // Go's chunked reader may stop before the bytes that were framed
      // (it reads ahead in pieces): what it read is a prefix of them.
      if (fwd[i].body.compare(0, r["body"].get<std::string>().size(), r["body"]) != 0) abort();
    }
  }
  if (rs.size() < fwd.size()) {
    // Go stopped early: only by refusing a head (not inside a body), and the
    // engine reads nothing after that.
    if (err.empty() || err.rfind("body: ", 0) == 0) abort();
  } else {
    if (!err.empty() && !(fwd.back().complete == false && err.rfind("body: ", 0) == 0)) abort();
    if (a["rest"] != "") abort();
  }
  return 0;
}
