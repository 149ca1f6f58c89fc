// Helpers for the tests of the credential store and of the flow that waits on
// it: a scratch directory, a file's line count, and a command rule whose
// minter leaves a line per run (so a test counts mints).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "proxy/inject/rules.h"

namespace fy::test {

// A directory made for one case under /tmp/<prefix>.XXXXXX, removed with all
// it holds.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path + "'";
    (void)system(cmd.c_str());
  }
};

inline int lines_in(const std::string& file) {
  std::ifstream in(file);
  int n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

// A command rule whose minter appends a line to `count_file`, then runs `then`.
inline inject::Rule command_rule(const std::string& count_file, const std::string& then,
                                 bool replay = false) {
  inject::Rule r;
  r.id = "tracker";
  r.kind = inject::Kind::command;
  r.host = "api.tracker.example";
  r.header = "Authorization";
  r.value_prefix = "Bearer ";
  r.replay_on_401 = replay;
  r.command = {"/bin/sh", "-c", "echo run >> '" + count_file + "'; " + then};
  return r;
}

}  // namespace fy::test
