// The benchmark's floor arm: the least a hop between the client and the engine
// socket can do. It accepts on a unix socket, connects each client to the
// upstream unix socket and copies bytes both ways, with no parsing, no timers
// and no allocation per message: one level-triggered epoll loop, each fd
// registered once, one fixed buffer per direction, and per message an
// epoll_wait, one read and one write (what fy-sockfilter does too; strace -c
// counts it). Whatever this arm costs over direct is the price of the hop
// itself on this machine: two more sockets, the wake-ups and the context
// switches. fy-sockfilter's cost over it is what the filter adds.
//
// Not a product: bench only (bench_sockfilter.py builds it with cc).
// usage: floor_relay UPSTREAM LISTEN
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { kBuf = 64 * 1024 };

// One direction: bytes read from `from` wait in buf[off, len) until `to` takes them.
struct dir {
  int from, to;
  size_t off, len;
  char buf[kBuf];
};

struct pair {
  struct dir d[2];  // [0] client -> engine, [1] engine -> client
  int closed;
  struct pair* next_dead;
};

// An event names its pair and which fd woke: the low bit, 0 the client's, 1 the engine's.
static uint64_t tag(struct pair* p, int side) { return (uint64_t)(uintptr_t)p | (uint64_t)side; }

static int unix_addr(const char* path, struct sockaddr_un* a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a->sun_path) return -1;
  strcpy(a->sun_path, path);
  return 0;
}

// side's fd reads for d[side] and writes for d[!side]: it waits to read while
// d[side] holds nothing unsent, and to write while d[!side] holds bytes.
static void interest(int ep, struct pair* p, int side) {
  struct epoll_event ev = {
      .events = (p->d[side].off == p->d[side].len ? EPOLLIN : 0) |
                (p->d[!side].off < p->d[!side].len ? EPOLLOUT : 0),
      .data.u64 = tag(p, side)};
  epoll_ctl(ep, EPOLL_CTL_MOD, p->d[side].from, &ev);
}

// Moves direction k once: a read if it holds nothing, then a write. -1: close.
static int pump(int ep, struct pair* p, int k) {
  struct dir* d = &p->d[k];
  int was_held = d->off < d->len;
  if (!was_held) {
    ssize_t n = read(d->from, d->buf, kBuf);
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    d->off = 0;
    d->len = (size_t)n;
  }
  ssize_t w = write(d->to, d->buf + d->off, d->len - d->off);
  if (w < 0 && errno != EAGAIN) return -1;
  if (w > 0) d->off += (size_t)w;
  int held = d->off < d->len;
  if (held != was_held) {  // the rare path: a peer that would not take it all
    interest(ep, p, 0);
    interest(ep, p, 1);
  }
  return 0;
}

int main(int argc, char** argv) {
  struct sockaddr_un up_addr, ls_addr;
  if (argc != 3 || unix_addr(argv[1], &up_addr) || unix_addr(argv[2], &ls_addr)) {
    fprintf(stderr, "usage: floor_relay UPSTREAM LISTEN (paths under 108 bytes)\n");
    return 2;
  }
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  unlink(argv[2]);
  if (ls < 0 || bind(ls, (struct sockaddr*)&ls_addr, sizeof ls_addr) || listen(ls, 128)) {
    perror("floor_relay: listen");
    return 1;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event lev = {.events = EPOLLIN, .data.u64 = 0};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
  struct epoll_event evs[64];
  for (;;) {
    int n = epoll_wait(ep, evs, 64, -1);
    if (n < 0 && errno != EINTR) return 1;
    struct pair* dead = NULL;
    for (int i = 0; i < n; i++) {
      if (evs[i].data.u64 == 0) {
        int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) continue;
        // A blocking connect to a local unix socket (the engine's backlog
        // takes it at once), then non-blocking for the relay.
        int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (u < 0 || connect(u, (struct sockaddr*)&up_addr, sizeof up_addr)) {
          close(c);
          if (u >= 0) close(u);
          continue;
        }
        int one = 1;
        ioctl(u, FIONBIO, &one);
        struct pair* p = calloc(1, sizeof *p);
        p->d[0].from = c, p->d[0].to = u;
        p->d[1].from = u, p->d[1].to = c;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag(p, 0)};
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
        ev.data.u64 = tag(p, 1);
        epoll_ctl(ep, EPOLL_CTL_ADD, u, &ev);
        continue;
      }
      struct pair* p = (struct pair*)(uintptr_t)(evs[i].data.u64 & ~(uint64_t)1);
      int side = (int)(evs[i].data.u64 & 1);
      if (p->closed) continue;
      int err = 0;
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) err = pump(ep, p, side) < 0;
      if (!err && (evs[i].events & EPOLLOUT)) err = pump(ep, p, !side) < 0;  // held bytes for this fd
      if (err) {
        close(p->d[0].from);  // closing removes both from the epoll set
        close(p->d[1].from);
        p->closed = 1;
        p->next_dead = dead;  // freed after the batch: a later event may name it
        dead = p;
      }
    }
    while (dead) {
      struct pair* d = dead;
      dead = d->next_dead;
      free(d);
    }
  }
}
