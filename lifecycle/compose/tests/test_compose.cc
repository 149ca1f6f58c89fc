// fy-compose's pure parts: the env the host computes, the guest's stdin, the
// answers it acts on, and the control-sequence stripper.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "env.h"
#include "printable.h"
#include "request.h"

using namespace fy::compose;

namespace {
EnvInput base_input() {
  EnvInput in;
  in.guest_socket = "unix:///run/fy-sockfilter/podman.sock";
  in.host = {
      {"PATH", "/host/bin"}, {"HOME", "/home/op"}, {"USER", "op"}, {"LOGNAME", "op"},
      {"SHELL", "/bin/zsh"}, {"TMPDIR", "/tmp/op"}, {"XDG_RUNTIME_DIR", "/run/user/1000"},
      {"XDG_CONFIG_HOME", "/home/op/.config"}, {"DOCKER_HOST", "unix:///host.sock"},
      {"CONTAINER_HOST", "unix:///host.sock"}, {"CONTAINER_CONNECTION", "vm"},
      {"DOCKER_CONTEXT", "x"}, {"DOCKER_CONFIG", "/home/op/.docker"},
      {"CONTAINERS_CONF", "/h/c.conf"}, {"CONTAINERS_CONF_OVERRIDE", "/h/o.conf"},
      {"CONTAINERS_REGISTRIES_CONF", "/h/r.conf"}, {"CONTAINERS_STORAGE_CONF", "/h/s.conf"},
      {"REGISTRY_AUTH_FILE", "/home/op/auth.json"}, {"PODMAN_COMPOSE_PROVIDER", "/x"},
      {"TERM", "xterm"}, {"LANG", "C.UTF-8"}, {"LC_ALL", "C"}, {"COMPOSE_PROFILES", "dev"},
      {"PODMAN_USERNS", "keep-id"}, {"FOLDYARD_MODE", "dev"}, {"WT_OFFSET", "10"},
      {"AWS_SECRET_ACCESS_KEY", "s3cr3t"}, {"FY_TOKEN", "tok"}, {"FOLDYARD_SECRET", "hs"},
  };
  return in;
}
}  // namespace

TEST_CASE("env: host-only names are never sent, the engine is rewritten to the guest socket") {
  auto plan = plan_env(base_input());
  REQUIRE(plan.ok());
  const auto& e = plan->env;
  for (const char* n : {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "XDG_RUNTIME_DIR",
                        "XDG_CONFIG_HOME", "CONTAINER_CONNECTION", "DOCKER_CONTEXT",
                        "DOCKER_CONFIG", "CONTAINERS_CONF", "CONTAINERS_CONF_OVERRIDE",
                        "CONTAINERS_REGISTRIES_CONF", "CONTAINERS_STORAGE_CONF",
                        "REGISTRY_AUTH_FILE", "PODMAN_COMPOSE_PROVIDER",
                        "AWS_SECRET_ACCESS_KEY", "FY_TOKEN"})
    CHECK_MESSAGE(!e.contains(n), n);
  CHECK(e.at("DOCKER_HOST") == "unix:///run/fy-sockfilter/podman.sock");
  CHECK(e.at("CONTAINER_HOST") == "unix:///run/fy-sockfilter/podman.sock");
  for (const char* n : {"TERM", "LANG", "LC_ALL", "COMPOSE_PROFILES", "PODMAN_USERNS",
                        "FOLDYARD_MODE", "WT_OFFSET", "FOLDYARD_SECRET"})
    CHECK_MESSAGE(e.contains(n), n);
  CHECK(plan->widenings.empty());
}

TEST_CASE("env: host.env names are withheld unless compose_env names them, which is a widening") {
  auto in = base_input();
  in.host_env_names = {"FOLDYARD_SECRET", "FY_TOKEN", "AWS_SECRET_ACCESS_KEY"};
  auto plan = plan_env(in);
  REQUIRE(plan.ok());
  CHECK(!plan->env.contains("FOLDYARD_SECRET"));
  in.compose_env = {"FY_TOKEN", "FOLDYARD_SECRET", "FY_TOKEN", "ABSENT_NAME"};
  plan = plan_env(in);
  REQUIRE(plan.ok());
  CHECK(plan->env.at("FY_TOKEN") == "tok");
  CHECK(plan->env.at("FOLDYARD_SECRET") == "hs");
  CHECK(!plan->env.contains("ABSENT_NAME"));
  CHECK(plan->widenings == std::vector<std::string>{"FY_TOKEN", "FOLDYARD_SECRET"});
}

TEST_CASE("env: compose_env cannot widen to a host-only name; a bad socket is refused") {
  for (const char* n : {"PATH", "HOME", "XDG_DATA_HOME", "DOCKER_HOST", "CONTAINER_HOST",
                        "REGISTRY_AUTH_FILE", "CONTAINERS_CONF"}) {
    auto in = base_input();
    in.compose_env = {n};
    auto plan = plan_env(in);
    REQUIRE_MESSAGE(!plan.ok(), n);
    CHECK(plan.error().message.find("never sent") != std::string::npos);
  }
  auto in = base_input();
  in.compose_env = {"A=B"};
  CHECK(!plan_env(in).ok());
  in = base_input();
  in.guest_socket = "tcp://10.0.0.1:2375";
  CHECK(!plan_env(in).ok());
  in.guest_socket = "";
  CHECK(!plan_env(in).ok());
}

TEST_CASE("stdin: bootstrap, then one _fy_boot call with the zip, its size and hash, the request") {
  Request r;
  r.argv = {"up", "-d"};
  r.files = {"/w/compose.yml"};
  r.project = "p";
  r.env = {{"CONTAINER_HOST", "unix:///s"}};
  r.cwd = "/w";
  std::string zip(1000, '\x01');
  std::string s = guest_script("import sys\n", zip, "abc", r);
  CHECK(s.starts_with("import sys\n_fy_boot(b\"\"\"\n"));
  CHECK(s.find("\"\"\", 1000, \"abc\", b\"") != std::string::npos);
  CHECK(s.ends_with("\")\n"));
  auto j = nlohmann::json::parse(request_json(r));
  CHECK(j["argv"] == nlohmann::json({"up", "-d"}));
  CHECK(j["cwd"] == "/w");
  CHECK(j["wait_s"] == 6.0);
  CHECK(base64("foobar") == "Zm9vYmFy");
  CHECK(base64("fooba") == "Zm9vYmE=");
  CHECK(base64("f") == "Zg==");
}

TEST_CASE("answers: only a successful answer of the kind and project asked about is used") {
  std::string ok = "chatter\n{\"fy-compose-answer\":\"services\",\"project\":\"p\",\"body\":[\"web\"]}\n";
  auto a = parse_answer(ok, "services", "p");
  REQUIRE(a.ok());
  CHECK(*a == "[\"web\"]");
  auto other = parse_answer(ok, "services", "q");
  REQUIRE(!other.ok());
  CHECK(other.error().message.find("for project 'p', not 'q'") != std::string::npos);
  CHECK(!parse_answer(ok, "config", "p").ok());
  CHECK(!parse_answer("not json", "services", "p").ok());
  CHECK(!parse_answer("", "services", "p").ok());
  CHECK(!parse_answer("{\"fy-compose-answer\":\"services\",\"project\":1,\"body\":[]}",
                      "services", "p").ok());
}

TEST_CASE("shell: the container is picked by its compose labels, for this project only") {
  std::string ps = R"([
    {"Id":"aaa","State":"running","Names":["p_web_1"],
     "Labels":{"com.docker.compose.project":"evil","com.docker.compose.service":"web"}},
    {"Id":"bbb","State":"running","Names":["evil_web_1"],
     "Labels":{"com.docker.compose.project":"p","com.docker.compose.service":"web"}},
    {"Id":"ccc","State":"exited",
     "Labels":{"com.docker.compose.project":"p","com.docker.compose.service":"db"}}])";
  auto id = pick_container(ps, "p", "web");
  REQUIRE(id.ok());
  CHECK(*id == "bbb");
  CHECK(!pick_container(ps, "p", "db").ok());
  CHECK(!pick_container(ps, "q", "web").ok());
  CHECK(!pick_container("{}", "p", "web").ok());
}

TEST_CASE("ssh target: fy-machine's JSON, validated") {
  auto t = parse_ssh_target(R"({"config":"/s/ssh_config","host":"fy-vm","user":"u","known_hosts":"/k"})");
  REQUIRE(t.ok());
  CHECK(t->config == "/s/ssh_config");
  CHECK(t->host == "fy-vm");
  CHECK(!parse_ssh_target(R"({"config":"rel","host":"h"})").ok());
  CHECK(!parse_ssh_target(R"({"config":"/c","host":"-oProxyCommand=x"})").ok());
  CHECK(!parse_ssh_target(R"({"config":"/c"})").ok());
  CHECK(!parse_ssh_target("[]").ok());
}

TEST_CASE("printable: control sequences are stripped whole, text and UTF-8 kept") {
  CHECK(printable("a\x1b[31mred\x1b[0m\n") == "ared\n");
  CHECK(printable("x\x1b]0;title\x07y") == "xy");
  CHECK(printable("x\x1b]52;c;Zm9v\x1b\\y") == "xy");
  CHECK(printable("x\x1bPdcs\x1b\\y\x1b(Bz") == "xyz");
  CHECK(printable("over\rwrite\b\x7f\x01\t.") == "overwrite\t.");
  CHECK(printable("\xc2\x9b" "2Jz") == "z");           // UTF-8 C1 CSI
  CHECK(printable("\xc2\x9d" "0;t\x07z") == "z");      // UTF-8 C1 OSC
  CHECK(printable("caf\xc3\xa9 \xe2\x9c\x93 \xc2\xa0!") == "caf\xc3\xa9 \xe2\x9c\x93 \xc2\xa0!");
  CHECK(printable("\xe2\x80\x9c" "q" "\xe2\x80\x9d") == "\xe2\x80\x9cq\xe2\x80\x9d");
  // split anywhere, the same result
  std::string in = "a\x1b[1;31mb\x1b]0;t\x1b\\c\xc2\x9b" "5Ad\xc3\xa9";
  std::string whole = printable(in);
  for (size_t cut = 0; cut <= in.size(); ++cut) {
    Printable p;
    std::string out;
    p.feed(in.substr(0, cut), out);
    p.feed(in.substr(cut), out);
    CHECK(out == whole);
  }
  CHECK(whole == "abcd\xc3\xa9");
}
