// fy-machine's thin I/O layer: running a tool with a deadline, probing a
// libpod socket, small file helpers. Decisions live in plan.h / machine.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace fy::machine {

struct RunResult {
  int rc = 0;  // the exit status; 127 when the program is missing, 124 on timeout
  std::string out;
  std::string err;
};

// Runs argv (argv[0] looked up on PATH) with stdin from /dev/null (or the
// file `stdin_path`), collecting stdout and stderr, killing the process group
// at the deadline. Never throws.
RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
              const std::string& stdin_path = "");

// argv[0] found on PATH (or an existing executable path).
bool on_path(const std::string& program);

// The readiness of a libpod socket, with the reason when it is not ready.
struct Probe {
  bool ready = false;
  std::string reason;  // "" when ready: what failed, for the operator
};
// AF_UNIX connect to `path` (a unix:// URI or a plain path) within `timeout`,
// then `GET /_ping`, answered 200 with the body "OK" within the same
// deadline. A missing file, a dead socket file (nobody listening), a listener
// that accepts and never answers, and any other answer are not ready.
Probe ping_socket(const std::string& path, std::chrono::milliseconds timeout);

std::optional<std::string> read_file(const std::string& path);
// Writes via a temp file and rename, with `mode`.
bool write_file(const std::string& path, const std::string& data, mode_t mode = 0644);
bool mkdirs(const std::string& path, mode_t mode = 0755);
bool pid_alive(pid_t pid);
// SIGTERM, up to `wait` for them to go, then SIGKILL and up to `wait` again:
// whatever of `pids` is still alive. Returns when none is or both waits ran.
void terminate(const std::vector<pid_t>& pids, std::chrono::milliseconds wait);
// A tool's first line of output, without its trailing CR and spaces.
std::string first_line(const std::string& s);
// The pid in a lima-style pid file, if it names a live process.
std::optional<pid_t> live_pid_file(const std::string& path);
std::optional<std::string> env(const char* name);

// Scales every wait fy-machine makes (FY_MACHINE_TIME_SCALE, default 1; the
// tests run the real waits at a fraction of their length).
std::chrono::milliseconds scaled(std::chrono::milliseconds d);
void sleep_for(std::chrono::milliseconds d);

}  // namespace fy::machine

namespace fy::machine {

// Starts argv as a daemon (its own session, stdin /dev/null, stdout and
// stderr appended to `log`), not a child of this process: it outlives the CLI
// and is never a zombie of it. Returns its pid, or -1 (errno set).
pid_t spawn_detached(const std::vector<std::string>& argv, const std::string& log);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, read, closed).
int free_loopback_port();

}  // namespace fy::machine
