// fy-forwarder-hook: the OCI prestart hook that holds a container's start
// until fy-forwarder listens in the rootless bridge namespace, so the first
// container after a teardown of that namespace never races the forwarder
// (ADR-0034). See docs/fy-forwarder.md, "The OCI hook".
#include <poll.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/args.h"
#include "core/clock.h"
#include "forwarder/control_client.h"
#include "forwarder/netns.h"

namespace {

constexpr const char* kUsage = R"(usage: fy-forwarder-hook [--control PATH] [--timeout-ms N]
                          [--on-timeout refuse|continue]

An OCI prestart hook (installed through fy-forwarder-hook.json in
/usr/share/containers/oci/hooks.d). It reads the container state on stdin,
then asks fy-forwarder over its control socket, until it answers or the
time is up, whether it listens in the namespace at its followed path:

  "ready <ino>"  it does: exit 0 and the container starts
  "absent ..."   no bridge namespace exists: nothing to wait for, exit 0
  "waiting ..."  ask again in 10 ms

Once the forwarder listens (or there is no bridge namespace), the hook
sends "start <id> <pid>" from the container state, and the forwarder records
the addresses in that process's network namespace for the container's id:
its connections are then stamped with the id, so the Network Log names the
container even when it is gone before fy-engine-watch lists it. A failure
there is a warning, never a refusal (the container is still stamped by its
address).

The answer names the path it is about (path=...); the hook looks there too,
from its own (the runtime's) mount namespace. When it sees a network
namespace the forwarder does not serve (the forwarder says absent, or ready
for another one), the forwarder cannot see what the container will use: the
hook asks again, and at the time limit treats it as not listening.

  --control PATH     fy-forwarder's control socket
                     (default /run/fy-forwarder/control.sock)
  --timeout-ms N     the bound on the wait (default 5000)
  --on-timeout MODE  refuse (default): exit 1, so the runtime refuses to start
                     the container, with a message saying why; continue:
                     exit 0 with a warning (the container's first
                     connections then fail closed until the forwarder serves)
  --help
)";

// The value of the answer's "path=" token, or "".
std::string path_of(const std::string& answer) {
  size_t at = answer.find(" path=");
  if (at == std::string::npos) return "";
  size_t start = at + 6;
  size_t end = answer.find(' ', start);
  return answer.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The inode of the network namespace this process sees at `path`; 0 for none
// (or one it may not open).
uint64_t seen_here(const std::string& path) {
  if (path.empty()) return 0;
  auto ns = fy::fwd::open_netns(path);
  return ns ? static_cast<uint64_t>(ns->id.ino) : 0;
}

// The container state the runtime wrote (OCI runtime spec, "State"): its id
// and pid; false when it has none.
bool state_of(const std::string& in, std::string* id, long* pid) {
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto i = j.find("id");
  auto p = j.find("pid");
  if (i == j.end() || !i->is_string() || p == j.end() || !p->is_number_integer()) return false;
  *id = i->get<std::string>();
  *pid = p->get<long>();
  return *pid > 0;
}

void say(int level, const std::string& msg) {
  fprintf(stderr, "fy-forwarder-hook: %s\n", msg.c_str());
  openlog("fy-forwarder-hook", LOG_PID, LOG_DAEMON);
  syslog(level, "%s", msg.c_str());
  closelog();
}

// Records the container's start with the forwarder; a failure is said, not fatal.
void record_start(const std::string& control, const std::string& state, int timeout_ms) {
  std::string id;
  long pid = 0;
  if (!state_of(state, &id, &pid)) {
    say(LOG_WARNING, "the container state on stdin has no id and pid; its start is not "
                     "recorded, so its rows are named by address only");
    return;
  }
  auto r = fy::fwd::control_query(control, "start " + id + " " + std::to_string(pid), timeout_ms);
  if (r && r->rfind("ok", 0) == 0) return;
  say(LOG_WARNING, "fy-forwarder did not record the start of container " + id.substr(0, 12) +
                       " (" + (r ? *r : r.error().message) +
                       "); its rows are named by address only");
}

}  // namespace

int main(int argc, char** argv) {
  std::string control = "/run/fy-forwarder/control.sock";
  int timeout_ms = 5000;
  bool refuse = true;
  fy::ArgParser p;
  p.stop("--help,-h")
      .value("--control", &control)
      .value("--timeout-ms",
             [&](const std::string& v) -> fy::ArgParser::Refusal {
               timeout_ms = atoi(v.c_str());
               if (timeout_ms <= 0) return "--timeout-ms must be a positive number";
               return std::nullopt;
             })
      .value("--on-timeout",
             [&](const std::string& m) -> fy::ArgParser::Refusal {
               if (m != "refuse" && m != "continue") return "--on-timeout is refuse or continue";
               refuse = m == "refuse";
               return std::nullopt;
             })
      .reject_positionals();
  fy::ParsedArgs args = p.parse(argc, argv);
  if (args.stopped_at) {
    fputs(kUsage, stdout);
    return 0;
  }
  if (args.problem) {
    const fy::ArgProblem& e = *args.problem;
    if (e.kind == fy::ArgProblem::Kind::bad_value)
      fprintf(stderr, "fy-forwarder-hook: %s\n", e.message.c_str());
    else if (e.kind == fy::ArgProblem::Kind::needs_value)
      fprintf(stderr, "fy-forwarder-hook: %s needs a value; see --help\n", e.option.c_str());
    else
      fprintf(stderr, "fy-forwarder-hook: unknown argument '%s'; see --help\n", e.option.c_str());
    return 2;
  }
  // The runtime writes the container state to stdin; read it so the writer
  // never blocks, without waiting on a stdin that is not closed.
  std::string state;
  {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    char buf[4096];
    ssize_t n;
    while (::poll(&p, 1, 100) > 0 && (p.revents & (POLLIN | POLLHUP)) &&
           (n = ::read(STDIN_FILENO, buf, sizeof buf)) > 0) {
      if (state.size() < (1u << 20)) state.append(buf, static_cast<size_t>(n));
    }
  }
  uint64_t start = fy::mono_ms();
  uint64_t deadline = start + static_cast<uint64_t>(timeout_ms);
  // What the refusal reports: the last answer the forwarder gave, and whether
  // it disagreed with what this hook sees. A query that got no answer (the
  // last one may have had only a millisecond of the budget) does not erase
  // an answer that explains the refusal; it is reported only when the
  // forwarder never answered at all.
  std::string last;
  std::string unanswered;
  bool blind = false;
  while (true) {
    uint64_t now = fy::mono_ms();
    int left = now < deadline ? static_cast<int>(deadline - now) : 1;
    auto r = fy::fwd::control_query(control, "ready", left < 1000 ? left : 1000);
    if (r) blind = false;
    if (r && (r->rfind("ready", 0) == 0 || r->rfind("absent", 0) == 0)) {
      // Looked at after the answer: a namespace made since is asked about
      // again, one torn down since (seen_here 0) does not hold the start.
      std::string path = path_of(*r);
      uint64_t here = seen_here(path);
      uint64_t served = r->rfind("ready", 0) == 0 ? strtoull(r->c_str() + 6, nullptr, 10) : 0;
      if (here == 0 || here == served) {
        uint64_t t = fy::mono_ms();
        int rest = t < deadline ? static_cast<int>(deadline - t) : 0;
        record_start(control, state, rest < 200 ? 200 : rest > 1000 ? 1000 : rest);
        return 0;
      }
      blind = true;
      char why[768];
      snprintf(why, sizeof why,
               "fy-forwarder answered \"%s\", but this hook (uid %u) sees network namespace %llu "
               "at %s",
               r->c_str(), static_cast<unsigned>(getuid()), static_cast<unsigned long long>(here),
               path.c_str());
      last = why;
    } else if (r) {
      last = *r;
    } else {
      unanswered = r.error().message;
    }
    if (fy::mono_ms() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  char msg[2048];
  snprintf(msg, sizeof msg,
           "fy-forwarder is not listening in the rootless bridge namespace after %d ms (last "
           "answer: %s). %s %s",
           timeout_ms, last.empty() ? unanswered.c_str() : last.c_str(),
           refuse ? "The container is not started, because its egress would fail."
                  : "Starting the container anyway; its first connections may be reset.",
           blind ? "The forwarder cannot see the namespace the container uses: check [bridge] "
                   "netns in its configuration (a namespace mounted in rootless podman's own "
                   "mount namespace is reached through /proc/<pause pid>/root/<path>) and that "
                   "its unit's sandboxing leaves the path visible (ProtectHome=yes hides "
                   "/run/user)."
                 : "Check `systemctl status fy-forwarder` and `fy-forwarder --probe`.");
  fprintf(stderr, "fy-forwarder-hook: %s\n", msg);
  // Runtimes do not always show a hook's stderr: the journal gets it too.
  openlog("fy-forwarder-hook", LOG_PID, LOG_DAEMON);
  syslog(refuse ? LOG_ERR : LOG_WARNING, "%s", msg);
  closelog();
  return refuse ? 1 : 0;
}
