// The Network Log writer: appends rows to egress.jsonl, rotates at a size into
// dated backups, keeps the newest N. Runs on the proxy's loop thread.
//
// Contract: append() never blocks on I/O and never fails; rows are buffered
// and written by flush(), which the server calls once per loop iteration and
// on shutdown. A write error never stops traffic: it is counted, remembered
// (last_error) and reported at warn level at most once a minute; rows that
// could not be written are dropped and counted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/fd.h"
#include "proxy/netlog/row.h"

namespace fy::netlog {

struct WriterOptions {
  std::string path;                       // e.g. <state>/logs/egress.jsonl
  uint64_t max_bytes = 5 * 1024 * 1024;   // rotate when the file would pass this
  int backups = 5;                        // dated backups kept
  size_t max_buffered = 4 * 1024 * 1024;  // rows dropped (counted) beyond this
  std::string what = "network log";       // names the file in warnings
};

struct WriterStats {
  uint64_t rows = 0;          // rows written
  uint64_t rows_dropped = 0;  // rows lost to write errors or a full buffer
  uint64_t write_errors = 0;
  uint64_t rotations = 0;
};

class Writer {
 public:
  explicit Writer(WriterOptions opts);
  ~Writer();  // flushes
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void append(const Row& row);
  // Appends one pre-rendered JSON line (ending in '\n'): how fy-engine-watch
  // writes its snapshots with the same bounds, rotation and error handling.
  void append_line(std::string_view line);
  void flush();
  bool has_pending() const { return !buf_.empty(); }
  size_t pending_bytes() const { return buf_.size(); }

  const WriterStats& stats() const { return stats_; }
  const std::string& last_error() const { return last_error_; }
  const std::string& path() const { return opts_.path; }

 private:
  // Implemented in writer.cc.
  bool open_file();
  void rotate();
  WriterOptions opts_;
  WriterStats stats_;
  std::string buf_;
  size_t buf_rows_ = 0;
  Fd fd_;
  uint64_t size_ = 0;
  std::string last_error_;
  uint64_t last_report_ms_ = 0;
  uint64_t last_link_check_ms_ = 0;
};

}  // namespace fy::netlog
