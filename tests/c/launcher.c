/* Process trees for the HTTP endpoint (CPUPROF_HTTP) to follow.
 *
 *   launcher launch SECONDS   a launcher, as pg_ctl: forks a child that runs
 *                             `sh -c 'exec "$0" server' SELF` (so the server has the child's
 *                             pid), prints "server PID", holds on for SECONDS and exits 0
 *   launcher server           the server: busy in server_busy until standard input reaches
 *                             end of file (at most 120 s)
 *   launcher prefork          a prefork server: prints "parent PID", forks 2 workers (no exec)
 *                             that print "worker PID"; all of them wait for standard input to
 *                             reach end of file (at most 120 s), idle so as not to take the CPU
 *                             from tests running beside
 *
 * Output lines are flushed at once: the test reads them while the processes run. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* True once standard input is at end of file (or gone), waiting up to `ms`. */
static int stdin_closed(int ms) {
  struct pollfd p = {.fd = 0, .events = POLLIN};
  if (poll(&p, 1, ms) <= 0) return 0;
  char buf[256];
  return read(0, buf, sizeof buf) <= 0;
}

/* Inlined, so that the samples land in the busy functions themselves (a frame-pointer walk
 * cannot see the caller of a frameless leaf). */
__attribute__((always_inline)) static inline unsigned long spin(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

/* Its own frame, so that the profile names it. */
__attribute__((noinline)) void server_busy(void) { sink += spin(2000000); }

static int busy_until_eof(void) {
  double end = now() + 120;
  while (now() < end && !stdin_closed(0)) server_busy();
  return 0;
}

static int idle_until_eof(void) {
  double end = now() + 120;
  while (now() < end && !stdin_closed(1000)) {
  }
  return 0;
}

static int launch(const char *self, double seconds) {
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) return 10;
  if (child == 0) {
    char *argv[] = {"sh", "-c", "exec \"$0\" server", (char *)self, NULL};
    execv("/bin/sh", argv);
    _exit(127);
  }
  printf("server %d\n", (int)child);
  fflush(stdout);
  struct timespec hold = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  while (nanosleep(&hold, &hold) != 0) {
  }
  return 0;
}

static int prefork(void) {
  printf("parent %d\n", (int)getpid());
  fflush(stdout);
  for (int i = 0; i < 2; i++) {
    pid_t worker = fork();
    if (worker < 0) return 20;
    if (worker == 0) {
      printf("worker %d\n", (int)getpid());
      fflush(stdout);
      _exit(idle_until_eof());
    }
  }
  idle_until_eof();
  while (wait(NULL) > 0) {
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "launch") == 0) return launch(argv[0], atof(argv[2]));
  if (argc == 2 && strcmp(argv[1], "server") == 0) return busy_until_eof();
  if (argc == 2 && strcmp(argv[1], "prefork") == 0) return prefork();
  fprintf(stderr, "usage: launcher launch SECONDS | server | prefork\n");
  return 2;
}
