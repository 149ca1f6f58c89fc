// libFuzzer target for the control socket's `start <id> <pid>` line
// (forwarder/starts.h): the socket is 0666, so any VM user's bytes reach it.
// Properties: no crash; an accepted line has a valid id and a pid in range,
// and its canonical spelling parses to the same.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "forwarder/starts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string id;
  pid_t pid = 0;
  if (!fy::fwd::parse_start_line(in, &id, &pid)) return 0;
  if (!fy::fwd::Starts::valid_id(id) || pid <= 0 || pid > 4194304) abort();
  std::string id2;
  pid_t pid2 = 0;
  if (!fy::fwd::parse_start_line("start " + id + " " + std::to_string(pid), &id2, &pid2) ||
      id2 != id || pid2 != pid)
    abort();
  return 0;
}
