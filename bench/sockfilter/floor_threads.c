// The benchmark's second floor arm: the other way to build the least hop. A
// thread per direction of each connection, blocking read() then write(), no
// event loop at all: per message one read and one write, no epoll_wait. If a
// hop could be cheaper than floor_relay.c's epoll loop on this machine, this
// is the design that would show it (the thread-per-connection shape of the
// reference's Python filter, without Python).
//
// Not a product: bench only (bench_sockfilter.py builds it with cc -pthread).
// usage: floor_threads UPSTREAM LISTEN
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { kBuf = 64 * 1024 };

struct conn {
  int fd[2];  // [0] client, [1] engine
  int done;   // directions finished, under mu
  pthread_mutex_t mu;
};

struct dir {
  struct conn* c;
  int from, to;
};

static const char* g_upstream;

static void* pump(void* arg) {
  struct dir* d = arg;
  char* buf = malloc(kBuf);
  for (;;) {
    ssize_t n = read(d->c->fd[d->from], buf, kBuf);
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(d->c->fd[d->to], buf + off, (size_t)(n - off));
      if (w <= 0) goto out;
      off += w;
    }
  }
out:
  shutdown(d->c->fd[d->to], SHUT_WR);
  free(buf);
  struct conn* c = d->c;
  free(d);
  pthread_mutex_lock(&c->mu);
  int last = ++c->done == 2;
  pthread_mutex_unlock(&c->mu);
  if (last) {
    close(c->fd[0]);
    close(c->fd[1]);
    pthread_mutex_destroy(&c->mu);
    free(c);
  }
  return NULL;
}

static int unix_sock(const char* path, int listen_it) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, path, sizeof a.sun_path - 1);
  if (listen_it) {
    unlink(path);
    if (bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 128) != 0) return -1;
  } else if (connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: floor_threads UPSTREAM LISTEN\n");
    return 2;
  }
  g_upstream = argv[1];
  int lfd = unix_sock(argv[2], 1);
  if (lfd < 0) {
    perror("floor_threads: listen");
    return 1;
  }
  for (;;) {
    int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0) continue;
    int efd = unix_sock(g_upstream, 0);
    if (efd < 0) {
      close(cfd);
      continue;
    }
    struct conn* c = calloc(1, sizeof *c);
    c->fd[0] = cfd;
    c->fd[1] = efd;
    pthread_mutex_init(&c->mu, NULL);
    for (int i = 0; i < 2; ++i) {
      struct dir* d = malloc(sizeof *d);
      d->c = c;
      d->from = i;
      d->to = 1 - i;
      pthread_t t;
      pthread_attr_t at;
      pthread_attr_init(&at);
      pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      pthread_create(&t, &at, pump, d);
      pthread_attr_destroy(&at);
    }
  }
}
