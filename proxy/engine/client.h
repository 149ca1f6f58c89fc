// HTTP/1.1 to the engine's API socket (a unix socket: podman system service,
// or the VM's forwarded libpod socket). Blocking, bounded, one request per
// connection: a GET whose whole body is returned, or the event stream, read as
// its bytes arrive. Responses are parsed by llhttp (chunked bodies included);
// nothing the engine sends is trusted.
#pragma once

#include <llhttp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "core/fd.h"
#include "core/result.h"

namespace fy::engine {

// Parses one response; body bytes go to `on_body` as they are decoded.
class ResponseReader {
 public:
  using BodyFn = std::function<void(std::string_view)>;
  ResponseReader(size_t max_body, BodyFn on_body);
  ResponseReader(const ResponseReader&) = delete;
  ResponseReader& operator=(const ResponseReader&) = delete;
  Result<void> feed(std::string_view bytes);
  Result<void> finish();  // the peer closed
  int status() const { return status_; }
  bool complete() const { return complete_; }

 private:
  static int on_body_cb(llhttp_t* p, const char* at, size_t len);
  static int on_headers_cb(llhttp_t* p);
  static int on_complete_cb(llhttp_t* p);
  llhttp_settings_t settings_{};
  llhttp_t parser_{};
  size_t max_body_;
  size_t body_ = 0;
  BodyFn on_body_;
  int status_ = 0;
  bool complete_ = false;
  bool too_large_ = false;
};

// Connects to the unix socket at `path` (Errc::connect with the reason); the
// caller owns the socket.
Result<Fd> connect_unix(const std::string& path, int timeout_ms);

// GET `target`; the body of a 200 answer, else an error naming the status.
Result<std::string> http_get(const std::string& sock, const std::string& target, int timeout_ms,
                             size_t max_body);

// The event stream: one long GET whose body is JSON lines.
class EventStream {
 public:
  using LineFn = std::function<void(std::string_view)>;
  EventStream() = default;
  ~EventStream();
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;

  // Connects and sends the request; the answer is read by read_some().
  Result<void> open(const std::string& sock, const std::string& target, int timeout_ms);
  int fd() const { return fd_.get(); }
  // Reads what is there (the fd is readable): each complete body line goes to
  // `fn`. Errc::closed when the engine ended the stream; another error for a
  // bad answer. A line longer than kMaxEventLine is an error (the stream is
  // re-opened by the caller after a re-sync).
  Result<void> read_some(const LineFn& fn);
  void close();

 private:
  Fd fd_;
  std::string line_;
  bool line_too_long_ = false;
  std::unique_ptr<ResponseReader> reader_;
  const LineFn* fn_ = nullptr;
};

}  // namespace fy::engine
