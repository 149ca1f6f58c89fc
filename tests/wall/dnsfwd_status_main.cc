// print_dnsfwd_status() alone, in the calling namespace: what `fy-wall status
// machine` prints about fy-dnsfwd once wall/cli.cc calls it. Exit: 0
// listening (or no dns_redirect: nothing printed), 1 not listening, 4 nft.
#include <cstdio>

#include "wall/dnsfwd_status.h"

int main() {
  auto nft = fy::wall::Nft::open();
  if (!nft) {
    fprintf(stderr, "%s\n", nft.error().message.c_str());
    return 4;
  }
  return fy::wall::print_dnsfwd_status(stdout, *nft) ? 0 : 1;
}
