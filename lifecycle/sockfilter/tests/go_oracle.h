// The Go oracle (tests/oracle/oracle.go) as a persistent subprocess, for the
// unit tests and the fuzz targets: one process for the whole run, questions
// and answers framed on a pipe pair (the framing is oracle.go's). Test-only.
//
// Why a subprocess and not the oracle linked in as a Go c-archive: a c-archive
// brings the Go runtime into the fuzzer's process, whose signal handlers
// (SIGSEGV, SIGBUS, SIGURG for goroutine preemption) libFuzzer and the
// sanitizers replace, and whose goroutine stacks and heap ASan does not know;
// the subprocess keeps Go's runtime as Go runs it in podman, costs one pipe
// round trip per question, and is the same binary the Python tests ask.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#ifndef FY_SOCKFILTER_ORACLE
#define FY_SOCKFILTER_ORACLE ""
#endif

extern char** environ;

namespace fy::sockfilter::test {

class GoOracle {
 public:
  // The oracle built with the tests (meson passes its path), or nullptr when
  // Go was not installed at configure time. Started once; aborts the process
  // with a message if it cannot be started or dies.
  static GoOracle* get() {
    static GoOracle* o = [] {
      std::string path = FY_SOCKFILTER_ORACLE;
      if (path.empty() || access(path.c_str(), X_OK) != 0) return static_cast<GoOracle*>(nullptr);
      return new GoOracle(path);
    }();
    return o;
  }

  // kind: 'L' libpod create body, 'C' compat create body, 'H' bytes sent to
  // the engine. The answer, parsed; for 'H', the oracle's hex fields
  // (target_hex, body_hex, rest_hex) also as bytes (target, body, rest).
  nlohmann::json ask(char kind, std::string_view payload) {
    nlohmann::json a = ask_raw(kind, payload);
    if (kind == 'H') {
      a["rest"] = unhex(a["rest_hex"]);
      for (auto& r : a["requests"]) {
        r["target"] = unhex(r["target_hex"]);
        r["body"] = unhex(r["body_hex"]);
      }
    }
    return a;
  }

 private:
  static std::string unhex(const std::string& h) {
    auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    std::string o;
    for (size_t i = 0; i + 1 < h.size(); i += 2)
      o.push_back(static_cast<char>(v(h[i]) * 16 + v(h[i + 1])));
    return o;
  }
  nlohmann::json ask_raw(char kind, std::string_view payload) {
    std::string q(1, kind);
    uint32_t n = static_cast<uint32_t>(payload.size());
    for (int s = 24; s >= 0; s -= 8) q.push_back(static_cast<char>((n >> s) & 0xFF));
    q.append(payload);
    write_all(q);
    std::string len = read_exact(4);
    uint32_t m = 0;
    for (char c : len) m = (m << 8) | static_cast<unsigned char>(c);
    return nlohmann::json::parse(read_exact(m));
  }

  explicit GoOracle(const std::string& path) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) die("pipe");
    signal(SIGPIPE, SIG_IGN);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char* argv[] = {const_cast<char*>(path.c_str()), const_cast<char*>("serve"), nullptr};
    if (posix_spawn(&pid_, path.c_str(), &fa, nullptr, argv, environ) != 0) die("spawn");
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  [[noreturn]] static void die(const char* what) {
    fprintf(stderr, "go oracle (%s): %s failed; is it built (ninja sockfilter-oracle)?\n",
            FY_SOCKFILTER_ORACLE, what);
    abort();
  }
  void write_all(std::string_view d) {
    while (!d.empty()) {
      ssize_t k = write(to_, d.data(), d.size());
      if (k <= 0) die("write");
      d.remove_prefix(static_cast<size_t>(k));
    }
  }
  std::string read_exact(size_t n) {
    std::string s(n, '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t k = read(from_, s.data() + got, n - got);
      if (k <= 0) die("read (the oracle died)");
      got += static_cast<size_t>(k);
    }
    return s;
  }
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

// True when a view of the oracle's create answer shows a protected field
// bound: the runtime field set, or an annotation the filter must strip.
// `is_runtime_annotation` is the filter's own predicate on a folded key.
template <class Pred>
bool binds_protected(const nlohmann::json& view, Pred is_runtime_annotation) {
  if (!view["runtime"].is_null()) return true;
  if (view["annotations"].is_object()) {
    for (auto& [k, v] : view["annotations"].items()) {
      if (is_runtime_annotation(k)) return true;
    }
  }
  return false;
}

}  // namespace fy::sockfilter::test
