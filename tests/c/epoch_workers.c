/* Several processes of one program writing one profile database (tests/epochs.rs):
 *   epoch_workers SECONDS          forks a child that burns SECONDS of CPU and leaves with
 *                                  _exit (profiled as a process of its own, from the fork),
 *                                  and a child that execs `epoch_workers SECONDS exec`
 *                                  (profiled as a process of its own); burns SECONDS
 *                                  itself, waits for both, then execs itself as
 *                                  `epoch_workers SECONDS again` (same pid, same program)
 *   ... exec / again               burns SECONDS and exits
 * Every profiled process prints "pid PID cpu SECONDS" (its main thread's CPU time). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#define BURN_ROUNDS
#include "common.h"
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void hot_a(unsigned long n) { sink += burn(3 * n); }
__attribute__((noinline)) void hot_b(unsigned long n) { sink += burn(n); }

static void work(double seconds) {
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    hot_a(20000);
    hot_b(20000);
  }
}

/* The main thread's CPU time (it carries over exec, as the process's does): what the profile
 * samples, without cpuprof's writer thread, whose CPU time the process's clock includes. */
static double thread_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void report(void) {
  printf("pid %d cpu %.4f\n", (int)getpid(), thread_seconds());
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  double seconds = atof(argv[1]);
  if (argc > 2) { /* exec'ed: a profiled process of its own */
    work(seconds);
    report();
    return 0;
  }
  fflush(stdout);
  pid_t forked = fork();
  if (forked == 0) {
    work(seconds);
    report();
    _exit(0);
  }
  pid_t execed = fork();
  if (execed == 0) {
    char *args[] = {argv[0], argv[1], "exec", NULL};
    execv("/proc/self/exe", args);
    _exit(127);
  }
  work(seconds);
  int status, failed = 0;
  if (waitpid(forked, &status, 0) != forked || status != 0) failed = 1;
  if (waitpid(execed, &status, 0) != execed || status != 0) failed = 1;
  if (failed) return 1;
  report();
  execl("/proc/self/exe", argv[0], argv[1], "again", (char *)NULL);
  return 127;
}
