// fy-wall: see wall/cli.h and docs/fy-wall.md.
#include <cstdio>

#include "wall/cli.h"

int main(int argc, char** argv) {
  return fy::wall::run_cli(argc, argv, stdout, stderr);
}
