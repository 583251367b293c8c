/* Server habits that a profiler's timers must not disturb. Each mode prints what it observed;
 * the tests run it with and without the profiler (under limits they set with prlimit) and
 * require the same output and exit status.
 *
 *   timer_hazards fdlimit N     N idle threads, then opens /dev/null until EMFILE: prints how
 *                               many it could open (under RLIMIT_NOFILE=64: 61 without profiler)
 *   timer_hazards select N      N idle threads, then a pipe: its descriptors must be below
 *                               FD_SETSIZE and select() must see the byte written to it
 *   timer_hazards sigqueue      fills the real-time signal queue (RLIMIT_SIGPENDING) with a
 *                               blocked signal of its own, burns CPU in 4 new threads and the main
 *                               one, then takes every queued signal back
 *   timer_hazards seccomp       installs a seccomp filter that kills the process on
 *                               perf_event_open, then burns CPU in 4 new threads
 *   timer_hazards sandboxed     installs the same filter, then execs itself in "burn" mode, so
 *                               the profiler starts inside the sandbox
 *   timer_hazards burn          burns CPU in 4 threads
 *   timer_hazards lowerlimit N  lowers its RLIMIT_NOFILE soft limit to N (hard limit kept), then
 *                               burns 0.5 s of CPU in each of 4 new threads and the main one;
 *                               prints the limit and, on stderr, `cpu SECONDS` (all threads) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#define BURN_SECONDS
#include "common.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static int finished;

static void *idle_thread(void *arg) {
  (void)arg;
  burn(0.002);
  pthread_mutex_lock(&lock);
  while (!finished) pthread_cond_wait(&done, &lock);
  pthread_mutex_unlock(&lock);
  return NULL;
}

static void *burn_thread(void *arg) {
  burn(*(double *)arg);
  return NULL;
}

/* Starts n idle threads (stopped by finish_idle); returns how many started. */
static pthread_t *idle;
static int start_idle(int n) {
  idle = calloc(n, sizeof *idle);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  int started = 0;
  while (started < n && pthread_create(&idle[started], &attr, idle_thread, NULL) == 0) started++;
  /* Let every thread run (and a profiler arm it) before the descriptors are counted. */
  struct timespec pause = {0, 300 * 1000 * 1000};
  nanosleep(&pause, NULL);
  return started;
}

static void finish_idle(int started) {
  pthread_mutex_lock(&lock);
  finished = 1;
  pthread_cond_broadcast(&done);
  pthread_mutex_unlock(&lock);
  for (int i = 0; i < started; i++) pthread_join(idle[i], NULL);
}

static void burn_in_threads(int n, double seconds) {
  pthread_t t[16];
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, burn_thread, &seconds);
  burn(seconds);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

static int kill_on_perf_event_open(void) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_perf_event_open, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  int n = argc > 2 ? atoi(argv[2]) : 40;
  if (!strcmp(mode, "fdlimit")) {
    int started = start_idle(n);
    int opened = 0;
    while (open("/dev/null", O_RDONLY) >= 0) opened++;
    printf("threads %d opened %d (%s)\n", started, opened, strerror(errno));
    finish_idle(started);
  } else if (!strcmp(mode, "select")) {
    int started = start_idle(n);
    int fds[2];
    if (pipe(fds) != 0) return 2;
    int below = fds[0] < FD_SETSIZE && fds[1] < FD_SETSIZE;
    int seen = 0;
    if (below) {
      fd_set set;
      FD_ZERO(&set);
      FD_SET(fds[0], &set);
      struct timeval second = {1, 0};
      if (write(fds[1], "x", 1) == 1) seen = select(fds[0] + 1, &set, NULL, NULL, &second) == 1;
    }
    printf("threads %d pipe below FD_SETSIZE %d select saw the byte %d\n", started, below, seen);
    finish_idle(started);
  } else if (!strcmp(mode, "sigqueue")) {
    sigset_t rt;
    sigemptyset(&rt);
    sigaddset(&rt, SIGRTMIN + 2);
    pthread_sigmask(SIG_BLOCK, &rt, NULL);
    int queued = 0;
    union sigval v = {0};
    while (sigqueue(getpid(), SIGRTMIN + 2, v) == 0) queued++;
    int full = errno == EAGAIN;
    burn_in_threads(4, 0.4);
    struct timespec none = {0, 0};
    int taken = 0;
    while (sigtimedwait(&rt, NULL, &none) == SIGRTMIN + 2) taken++;
    printf("queue filled %d all taken back %d\n", full && queued > 0, taken == queued);
  } else if (!strcmp(mode, "seccomp")) {
    if (kill_on_perf_event_open() != 0) return 3;
    burn_in_threads(4, 0.4);
    printf("sandboxed and done\n");
  } else if (!strcmp(mode, "sandboxed")) {
    if (kill_on_perf_event_open() != 0) return 3;
    fflush(stdout);
    execl("/proc/self/exe", argv[0], "burn", (char *)NULL);
    return 4;
  } else if (!strcmp(mode, "lowerlimit")) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 5;
    limit.rlim_cur = n;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 5;
    burn_in_threads(4, 0.5);
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    fprintf(stderr, "cpu %.3f\n", cpu.tv_sec + cpu.tv_nsec / 1e9);
    printf("lowered RLIMIT_NOFILE to %d and burnt\n", n);
  } else if (!strcmp(mode, "burn")) {
    burn_in_threads(4, 0.4);
    printf("burnt\n");
  } else {
    return 1;
  }
  return 0;
}
