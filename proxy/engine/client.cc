#include "proxy/engine/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/clock.h"
#include "proxy/engine/engine.h"

namespace fy::engine {

ResponseReader::ResponseReader(size_t max_body, BodyFn on_body)
    : max_body_(max_body), on_body_(std::move(on_body)) {
  llhttp_settings_init(&settings_);
  settings_.on_body = &ResponseReader::on_body_cb;
  settings_.on_headers_complete = &ResponseReader::on_headers_cb;
  settings_.on_message_complete = &ResponseReader::on_complete_cb;
  llhttp_init(&parser_, HTTP_RESPONSE, &settings_);
  parser_.data = this;
}

int ResponseReader::on_headers_cb(llhttp_t* p) {
  auto* self = static_cast<ResponseReader*>(p->data);
  self->status_ = p->status_code;
  return 0;
}

int ResponseReader::on_body_cb(llhttp_t* p, const char* at, size_t len) {
  auto* self = static_cast<ResponseReader*>(p->data);
  self->body_ += len;
  if (self->body_ > self->max_body_) {
    self->too_large_ = true;
    return -1;
  }
  if (self->on_body_) self->on_body_(std::string_view(at, len));
  return 0;
}

int ResponseReader::on_complete_cb(llhttp_t* p) {
  static_cast<ResponseReader*>(p->data)->complete_ = true;
  return HPE_PAUSED;  // one response per connection: stop here
}

Result<void> ResponseReader::feed(std::string_view bytes) {
  if (complete_) return {};
  llhttp_errno_t e = llhttp_execute(&parser_, bytes.data(), bytes.size());
  if (e == HPE_OK || (e == HPE_PAUSED && complete_)) return {};
  if (too_large_) return make_error(Errc::too_large, "the engine's answer is larger than {} bytes", max_body_);
  return make_error(Errc::parse, "the engine's answer is not HTTP/1.1 ({})", llhttp_errno_name(e));
}

Result<void> ResponseReader::finish() {
  if (complete_) return {};
  llhttp_errno_t e = llhttp_finish(&parser_);
  if (e == HPE_OK && complete_) return {};
  return make_error(Errc::closed, "the engine closed the connection before its answer was whole");
}

Result<Fd> connect_unix(const std::string& path, int timeout_ms) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa.sun_path))
    return make_error(Errc::invalid_argument, "the socket path {} is too long", path);
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(Errc::io, "socket: {}", std::strerror(errno));
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    return make_error(Errc::connect, "cannot connect to the engine's socket {}: {}", path,
                      std::strerror(e));
  }
  return fd;
}

namespace {

Result<void> send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::io, "cannot send to the engine: {}", std::strerror(errno));
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

std::string request(const std::string& target) {
  return "GET " + target + " HTTP/1.1\r\nHost: engine\r\nUser-Agent: fy-engine-watch\r\n"
         "Accept: application/json\r\nConnection: close\r\n\r\n";
}

}  // namespace

Result<std::string> http_get(const std::string& sock, const std::string& target, int timeout_ms,
                             size_t max_body) {
  auto fd = connect_unix(sock, timeout_ms);
  if (!fd) return std::move(fd).take_error();
  if (auto s = send_all(fd->get(), request(target)); !s) return std::move(s).take_error();
  std::string body;
  ResponseReader rr(max_body, [&](std::string_view b) { body.append(b); });
  uint64_t deadline = mono_ms() + static_cast<uint64_t>(timeout_ms);
  char buf[65536];
  while (!rr.complete()) {
    if (mono_ms() > deadline)
      return make_error(Errc::timeout, "the engine did not answer GET {} within {} ms", target, timeout_ms);
    ssize_t n = ::recv(fd->get(), buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return make_error(Errc::timeout, "the engine did not answer GET {} within {} ms", target, timeout_ms);
      return make_error(Errc::io, "reading the engine's answer: {}", std::strerror(errno));
    }
    if (n == 0) {
      if (auto f = rr.finish(); !f) return std::move(f).take_error();
      break;
    }
    if (auto f = rr.feed(std::string_view(buf, static_cast<size_t>(n))); !f)
      return std::move(f).take_error();
  }
  if (rr.status() != 200)
    return make_error(Errc::refused, "the engine answered GET {} with {}: {}", target, rr.status(),
                      body.substr(0, 200));
  return body;
}

EventStream::~EventStream() {
  close();
}

void EventStream::close() {
  fd_.reset();
  reader_.reset();
  line_.clear();
  line_too_long_ = false;
}

Result<void> EventStream::open(const std::string& sock, const std::string& target, int timeout_ms) {
  close();
  auto fd = connect_unix(sock, timeout_ms);
  if (!fd) return std::move(fd).take_error();
  fd_ = std::move(*fd);
  if (auto s = send_all(fd_.get(), request(target)); !s) {
    close();
    return s;
  }
  // The stream never ends by itself: no body bound, lines are bounded instead.
  reader_ = std::make_unique<ResponseReader>(SIZE_MAX, [this](std::string_view b) {
    if (reader_->status() != 200) return;  // an error's body is not events
    for (char c : b) {
      if (c == '\n') {
        if (!line_too_long_ && !line_.empty() && fn_) (*fn_)(line_);
        line_.clear();
        continue;
      }
      if (line_.size() >= kMaxEventLine) {
        line_too_long_ = true;
        continue;
      }
      line_ += c;
    }
  });
  return {};
}

Result<void> EventStream::read_some(const LineFn& fn) {
  if (!fd_) return make_error(Errc::closed, "the event stream is not open");
  char buf[65536];
  ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return {};
    return make_error(Errc::io, "reading the engine's event stream: {}", std::strerror(errno));
  }
  if (n == 0) return make_error(Errc::closed, "the engine closed its event stream");
  fn_ = &fn;
  auto r = reader_->feed(std::string_view(buf, static_cast<size_t>(n)));
  fn_ = nullptr;
  if (!r) return r;
  if (reader_->status() != 0 && reader_->status() != 200)
    return make_error(Errc::refused, "the engine answered the event stream with {}", reader_->status());
  if (line_too_long_)
    return make_error(Errc::too_large, "an event longer than {} bytes", kMaxEventLine);
  if (reader_->complete()) return make_error(Errc::closed, "the engine ended its event stream");
  return {};
}

}  // namespace fy::engine
