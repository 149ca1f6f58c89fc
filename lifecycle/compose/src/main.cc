// fy-compose: runs compose in the guest, as the VM user, over ssh. No compose
// client and no build run on this computer; with ssh unavailable the verb
// refuses and says so (there is no host path). docs/fy-compose.md.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <set>

#include "env.h"
#include "payload_blob.h"
#include "printable.h"
#include "request.h"

extern char** environ;

namespace fy::compose {
namespace {

constexpr size_t kMaxCapture = 16u << 20;

const char kUsage[] =
    "usage: fy-compose [options] VERB [ARGS...]\n"
    "\n"
    "Runs podman-compose in the guest, as the VM user, over ssh; nothing runs here.\n"
    "\n"
    "  --ssh-config FILE --ssh-host NAME   the guest's ssh route (default: fy-machine\n"
    "                                      ssh-target --json, from PATH)\n"
    "  --guest-socket URL                  the engine socket as the guest sees it\n"
    "                                      (unix:///...; the filtered one under gVisor)\n"
    "  --project NAME                      the compose project (-p)\n"
    "  -f FILE                             a compose file (absolute, or relative to\n"
    "                                      the working directory); repeatable\n"
    "  --compose-env NAME                  [project] compose_env: sent, and a widening\n"
    "  --host-env FILE                     host.env: its names are never passed through\n"
    "  --engine URL                        the engine as this computer reaches it (shell)\n"
    "  --wait SECONDS                      how long the guest waits for a -f file (6)\n"
    "  --version                           version and the payload's size and sha256\n"
    "\n"
    "verbs: config [--services], up, down, ps, logs [-f], build, ... (podman-compose's),\n"
    "       shell SERVICE [CMD...] (podman exec -it, through the engine), env (the env\n"
    "       the request would carry, as JSON; nothing is sent)\n";

struct Options {
  std::string ssh_config, ssh_host, guest_socket, project, host_env, engine;
  std::vector<std::string> files, compose_env, rest;
  double wait_s = 6.0;
};

[[noreturn]] void die(int rc, const std::string& msg) {
  fmt::print(stderr, "fy-compose: {}\n", msg);
  std::exit(rc);
}

std::optional<std::string> find_in_path(const std::string& name) {
  const char* p = std::getenv("PATH");
  std::stringstream ss(p ? p : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string f = dir + "/" + name;
    if (access(f.c_str(), X_OK) == 0) return f;
  }
  return std::nullopt;
}

Env host_environment() {
  Env e;
  for (char** p = environ; *p; ++p) {
    std::string_view kv(*p);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    e.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return e;
}

std::string cwd() {
  std::string buf(4096, '\0');
  if (!getcwd(buf.data(), buf.size())) die(2, fmt::format("getcwd: {}", std::strerror(errno)));
  return buf.c_str();
}

struct Child {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
};

// Spawns argv[0] (an absolute path) with pipes on 0, 1, 2 as asked; a false
// flag keeps ours. The caller owns the returned fds.
Child spawn(const std::vector<std::string>& argv, bool pipe_in, bool pipe_out, bool pipe_err) {
  int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
  if ((pipe_in && pipe2(pin, O_CLOEXEC)) || (pipe_out && pipe2(pout, O_CLOEXEC)) ||
      (pipe_err && pipe2(perr, O_CLOEXEC)))
    die(2, fmt::format("pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (pipe_in) posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
  if (pipe_out) posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
  if (pipe_err) posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  Child c;
  int rc = posix_spawn(&c.pid, argv[0].c_str(), &fa, nullptr, av.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) die(2, fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
  if (pipe_in) close(pin[0]), c.in = pin[1];
  if (pipe_out) close(pout[1]), c.out = pout[0];
  if (pipe_err) close(perr[1]), c.err = perr[0];
  return c;
}

int wait_rc(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

struct Outcome {
  int rc = 0;
  std::string out;       // captured stdout (capture mode only)
  std::string err_tail;  // the last 8 KiB of stderr, as received
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += size_t(n);
  }
}

// Runs the child to its end: writes `input` to its stdin (then closes it),
// relays its stderr printable to ours, and its stdout printable to ours or,
// with `capture`, into Outcome::out (raw; bounded).
Outcome pump(Child c, const std::string& input, bool capture) {
  Outcome o;
  Printable pout, perr;
  size_t off = 0;
  if (input.empty() && c.in >= 0) close(c.in), c.in = -1;
  if (c.in >= 0) fcntl(c.in, F_SETFL, fcntl(c.in, F_GETFL) | O_NONBLOCK);
  char buf[65536];
  while (c.in >= 0 || c.out >= 0 || c.err >= 0) {
    pollfd fds[3];
    int n = 0;
    if (c.in >= 0) fds[n++] = {c.in, POLLOUT, 0};
    if (c.out >= 0) fds[n++] = {c.out, POLLIN, 0};
    if (c.err >= 0) fds[n++] = {c.err, POLLIN, 0};
    if (poll(fds, n, -1) < 0) {
      if (errno == EINTR) continue;
      die(2, fmt::format("poll: {}", std::strerror(errno)));
    }
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      int fd = fds[i].fd;
      if (fd == c.in) {
        ssize_t w = write(fd, input.data() + off, input.size() - off);
        if (w > 0) off += size_t(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || off == input.size())
          close(c.in), c.in = -1;
        continue;
      }
      ssize_t r = read(fd, buf, sizeof buf);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        close(fd);
        (fd == c.out ? c.out : c.err) = -1;
        continue;
      }
      std::string_view chunk(buf, size_t(r));
      std::string clean;
      if (fd == c.out) {
        if (capture) {
          if (o.out.size() + chunk.size() > kMaxCapture)
            die(2, "the guest's answer is larger than 16 MiB: refused");
          o.out.append(chunk);
        } else {
          pout.feed(chunk, clean);
          write_all(1, clean);
        }
      } else {
        o.err_tail.append(chunk);
        if (o.err_tail.size() > 8192) o.err_tail.erase(0, o.err_tail.size() - 8192);
        perr.feed(chunk, clean);
        write_all(2, clean);
      }
    }
  }
  o.rc = wait_rc(c.pid);
  return o;
}

struct Route {
  std::string ssh, config, host;
};

Route resolve_route(const Options& o) {
  Route r;
  auto ssh = find_in_path("ssh");
  if (!ssh)
    die(69,
        "ssh is not installed here: fy-compose runs compose in the VM over ssh and has no "
        "other route (nothing runs on this computer). Install openssh-client.");
  r.ssh = *ssh;
  if (!o.ssh_config.empty() || !o.ssh_host.empty()) {
    if (o.ssh_config.empty() || o.ssh_host.empty())
      die(2, "--ssh-config and --ssh-host go together: give both, or neither to ask fy-machine");
    r.config = o.ssh_config;
    r.host = o.ssh_host;
    return r;
  }
  auto fm = find_in_path("fy-machine");
  if (!fm)
    die(69,
        "fy-machine is not on PATH and no --ssh-config/--ssh-host was given, so there is no "
        "route to the guest: refused (compose never runs on this computer). Install "
        "fy-machine or pass the ssh target.");
  Outcome got = pump(spawn({*fm, "ssh-target", "--json"}, false, true, true), "", true);
  if (got.rc != 0)
    die(69, fmt::format("fy-machine ssh-target --json failed (rc {}): no route to the guest, "
                        "refused. Start the VM (fy-machine ensure), then retry.",
                        got.rc));
  auto t = parse_ssh_target(got.out);
  if (!t) die(69, t.error().message + ": refused");
  r.config = t->config;
  r.host = t->host;
  return r;
}

std::vector<std::string> ssh_argv(const Route& r) {
  if (r.host.empty() || r.host[0] == '-') die(2, "the ssh host alias must not start with '-'");
  return {r.ssh, "-F", r.config, "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
          "--", r.host, "python3 -I -"};
}

std::set<std::string> read_names(const std::string& path) {
  std::ifstream f(path);
  if (!f) die(2, fmt::format("cannot read --host-env {}: {}", path, std::strerror(errno)));
  std::set<std::string> names;
  std::string line;
  while (std::getline(f, line)) {
    auto b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    auto eq = line.find('=', b);
    if (eq == std::string::npos) continue;
    std::string k = line.substr(b, eq - b);
    if (k.starts_with("export ")) k = k.substr(7);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    names.insert(k);
  }
  return names;
}

Options parse_args(int argc, char** argv) {
  Options o;
  int i = 1;
  auto need = [&](const char* flag) -> std::string {
    if (i + 1 >= argc) die(2, fmt::format("{} needs a value\n{}", flag, kUsage));
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ssh-config") o.ssh_config = need("--ssh-config");
    else if (a == "--ssh-host") o.ssh_host = need("--ssh-host");
    else if (a == "--guest-socket") o.guest_socket = need("--guest-socket");
    else if (a == "--project" || a == "-p") o.project = need("--project");
    else if (a == "-f" || a == "--file") o.files.push_back(need("-f"));
    else if (a == "--compose-env") o.compose_env.push_back(need("--compose-env"));
    else if (a == "--host-env") o.host_env = need("--host-env");
    else if (a == "--engine") o.engine = need("--engine");
    else if (a == "--wait") {
      std::string v = need("--wait");
      char* end = nullptr;
      o.wait_s = std::strtod(v.c_str(), &end);
      if (*end || o.wait_s < 0 || o.wait_s > 60) die(2, "--wait takes seconds, 0 to 60");
    } else if (a == "--version") {
      fmt::print("fy-compose 0.1.0\npayload: {} bytes, sha256 {}\npinned: {}\n", kPayloadSize,
                 kPayloadSha256, kPayloadVersions);
      std::exit(0);
    } else if (a == "-h" || a == "--help") {
      fmt::print("{}", kUsage);
      std::exit(0);
    } else if (a.starts_with("-")) {
      die(2, fmt::format("unknown option {}\n{}", a, kUsage));
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o.rest.push_back(argv[i]);
  if (o.rest.empty()) die(2, fmt::format("no verb given\n{}", kUsage));
  return o;
}

Request make_request(const Options& o, std::vector<std::string>* widenings = nullptr) {
  if (o.project.empty()) die(2, "--project is required: the host acts only on the project it names");
  Env host = host_environment();
  EnvInput in;
  in.host = host;
  if (!o.host_env.empty()) in.host_env_names = read_names(o.host_env);
  in.compose_env = o.compose_env;
  in.guest_socket = o.guest_socket;
  in.computed["COMPOSE_PROJECT_NAME"] = o.project;
  in.computed["PODMAN_PROJECT"] = o.project;
  auto plan = plan_env(in);
  if (!plan) die(2, plan.error().message);
  Request r;
  r.env = plan->env;
  r.project = o.project;
  r.cwd = cwd();
  r.wait_s = o.wait_s;
  for (const auto& f : o.files) r.files.push_back(f.starts_with("/") ? f : r.cwd + "/" + f);
  if (widenings) {
    *widenings = plan->widenings;
  } else {
    for (const auto& w : plan->widenings)
      fmt::print(stderr, "fy-compose: widening: compose_env sends {} to the guest\n", w);
  }
  return r;
}

// config [--services] is answered by the runner (a JSON line the host checks);
// every other verb is podman-compose's, relayed.
void set_verb(Request& r, const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "config") {
    bool services = args.size() == 2 && args[1] == "--services";
    if (args.size() > 1 && !services) die(2, "config takes only --services");
    r.answer = services ? "services" : "config";
    return;
  }
  r.argv = args;
}

int run_guest(const Options& o, Request r, bool capture, Outcome* keep = nullptr) {
  Route route = resolve_route(o);
  std::string zip(reinterpret_cast<const char*>(kPayload), kPayloadSize);
  std::string script = guest_script(kBootstrap, zip, kPayloadSha256, r);
  Outcome got = pump(spawn(ssh_argv(route), true, true, true), script, capture);
  if (got.rc == 255)
    die(69, fmt::format("ssh could not reach the guest '{}' (rc 255): refused, and nothing ran "
                        "on this computer instead. Check the VM is running (fy-machine status).",
                        route.host));
  if (got.rc == 1 && got.err_tail.find("SyntaxError") != std::string::npos &&
      got.err_tail.find("<stdin>") != std::string::npos)
    die(70, "the payload did not arrive whole in the guest (python3 could not parse it): "
            "nothing ran. Check the ssh route, then retry.");
  int rc = got.rc;
  if (keep) *keep = std::move(got);
  return rc;
}

int verb_answer(const Options& o, const Request& r) {
  const std::string& kind = r.answer;
  Outcome got;
  int rc = run_guest(o, r, true, &got);
  if (rc != 0) {
    // A failed call's stdout is never parsed: it is shown, cleaned, and dropped.
    fmt::print(stderr, "fy-compose: the guest's {} failed (rc {}); its output is not used\n",
               kind, rc);
    std::string clean = printable(got.out);
    write_all(2, clean);
    return rc;
  }
  auto body = parse_answer(got.out, kind, o.project);
  if (!body) die(65, body.error().message);
  // Only the answer line is read; podman-compose's chatter before it is not.
  auto j = nlohmann::json::parse(*body);
  std::string text;
  if (kind == "services") {
    for (const auto& n : j)
      if (n.is_string()) text += n.get<std::string>() + "\n";
  } else {
    text = j.dump(2) + "\n";
  }
  write_all(1, printable(text));
  return 0;
}

// shell SERVICE [CMD...]: not through the payload (it needs the terminal, and
// stdin carries the payload). The engine lists the project's containers; the
// one whose compose labels name this project and service is entered with
// podman exec -it, a plain engine call that parses no compose file.
int verb_shell(const Options& o) {
  if (o.project.empty()) die(2, "--project is required: shell enters only that project's service");
  if (o.rest.size() < 2) die(2, "usage: fy-compose --project P shell SERVICE [CMD...]");
  std::string engine = o.engine;
  if (engine.empty()) {
    const char* h = std::getenv("CONTAINER_HOST");
    engine = h ? h : "";
  }
  if (engine.empty())
    die(69, "no engine to reach: pass --engine URL (the VM's socket as this computer reaches "
            "it) or set CONTAINER_HOST");
  auto podman = find_in_path("podman");
  if (!podman) die(69, "podman is not installed here: shell needs it for podman exec -it");
  std::vector<std::string> ps = {*podman, "--remote", "--url", engine, "ps", "--format", "json",
                                 "--filter", "label=com.docker.compose.project=" + o.project};
  Outcome got = pump(spawn(ps, false, true, true), "", true);
  if (got.rc != 0) die(69, fmt::format("the engine's container list failed (rc {})", got.rc));
  auto id = pick_container(got.out, o.project, o.rest[1]);
  if (!id) die(1, id.error().message);
  std::vector<std::string> ex = {*podman, "--remote", "--url", engine, "exec", "-it", *id};
  if (o.rest.size() > 2) ex.insert(ex.end(), o.rest.begin() + 2, o.rest.end());
  else ex.push_back("sh");
  std::vector<char*> av;
  for (auto& a : ex) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  execv(av[0], av.data());
  die(2, fmt::format("cannot run {}: {}", ex[0], std::strerror(errno)));
}

int main_(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Options o = parse_args(argc, argv);
  const std::string& verb = o.rest[0];
  if (verb == "shell" || verb == "exec") return verb_shell(o);
  if (verb == "env") {
    std::vector<std::string> widenings;
    Request r = make_request(o, &widenings);
    nlohmann::json j;
    j["env"] = r.env;
    j["widenings"] = widenings;
    fmt::print("{}\n", j.dump());
    return 0;
  }
  if (verb == "script") {  // the exact stdin the call would send (for tests and audits)
    std::vector<std::string> call(o.rest.begin() + 1, o.rest.end());
    if (call.empty()) die(2, "usage: fy-compose [options] script VERB [ARGS...]");
    Request r = make_request(o);
    set_verb(r, call);
    std::string zip(reinterpret_cast<const char*>(kPayload), kPayloadSize);
    write_all(1, guest_script(kBootstrap, zip, kPayloadSha256, r));
    return 0;
  }
  if (verb == "config") {
    Request r = make_request(o);
    set_verb(r, o.rest);
    return verb_answer(o, r);
  }
  Request r = make_request(o);
  r.argv = o.rest;
  return run_guest(o, r, false);
}

}  // namespace
}  // namespace fy::compose

int main(int argc, char** argv) { return fy::compose::main_(argc, argv); }
