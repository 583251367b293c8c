/* Ends a profiled run without stopping the profiler, once the profile file holds records.
 *
 *   cut_short MODE MAX_SECONDS
 *
 * Works as hot.c does (hot_a does 3x the work of hot_b, called from main via work) until the file
 * named by $CPUPROFILE is longer than a header (the profiler's first harvest) or MAX_SECONDS
 * of CPU have passed (gperftools writes nothing before its buffer fills), then 0.2 s more, and:
 *   kill       raise(SIGKILL)
 *   exit       _exit(0): no atexit handlers, no destructors
 *   takeover   installs its own handler for every catchable signal, as the Go runtime does,
 *              works 0.5 s more (the profiler's signals now reach the program's handler),
 *              then ends with the exit_group system call, as Go's os.Exit does
 * Prints "checksum 1" (flushed) before the end, so callers can compare stdout. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#define BURN_ROUNDS
#include "common.h"
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t own_signals;

__attribute__((noinline)) void hot_a(unsigned long n) { sink += burn(3 * n); }
__attribute__((noinline)) void hot_b(unsigned long n) { sink += burn(n); }

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The length of each round varies, so that the rounds do not keep in step with the 4 ms
 * scheduler tick on which CPU timers fire: in step, a fixed round length gave hot_a 80-87 %
 * of the first second's samples instead of 75 %. */
static void work(double seconds) {
  static unsigned long state = 12345;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    unsigned long n = 100000 + (state >> 33) % 200000;
    hot_a(n);
    hot_b(n);
  }
}

static int profile_has_records(void) {
  const char *path = getenv("CPUPROFILE");
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return 0;
  /* 40 bytes of header, then a record's count (not 0: the trailer's first slot, which
   * cpuprof writes after the header until the first records replace it). */
  unsigned long long slot = 0;
  int has = fseek(f, 40, SEEK_SET) == 0 && fread(&slot, sizeof slot, 1, f) == 1 && slot != 0;
  fclose(f);
  return has;
}

static void own_handler(int sig) {
  (void)sig;
  own_signals++;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  double max_seconds = argc > 2 ? atof(argv[2]) : 10.0;
  double started = cpu_seconds();
  while (!profile_has_records() && cpu_seconds() - started < max_seconds) work(0.05);
  work(0.2);
  printf("checksum %d\n", sink != 0);
  fflush(stdout);
  if (!strcmp(mode, "kill")) {
    raise(SIGKILL);
  } else if (!strcmp(mode, "exit")) {
    _exit(0);
  } else if (!strcmp(mode, "takeover")) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sa.sa_flags = SA_RESTART;
    for (int sig = 1; sig < NSIG; sig++) {
      if (sig != SIGKILL && sig != SIGSTOP && sig != SIGSEGV && sig != SIGBUS && sig != SIGFPE && sig != SIGILL)
        sigaction(sig, &sa, NULL);
    }
    work(0.5);
    syscall(SYS_exit_group, 0);
  }
  return 2;
}
