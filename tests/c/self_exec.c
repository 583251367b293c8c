/* One program in several processes: `self_exec N` forks, the child execs this program with
 * N - 1, and both burn CPU in hot_a (3 units) and hot_b (1 unit) for 0.3 s; the parent waits
 * for the child and fails if it failed. N + 1 processes in all; only the first prints
 * "checksum 1". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#define BURN_ROUNDS
#include "common.h"
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void hot_a(unsigned long n) { sink += burn(3 * n); }
__attribute__((noinline)) void hot_b(unsigned long n) { sink += burn(n); }

/* Rounds of varying length, so that they do not keep in step with the scheduler tick. */
static void work(double seconds) {
  unsigned long state = (unsigned long)getpid();
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    unsigned long n = 100000 + (state >> 33) % 200000;
    hot_a(n);
    hot_b(n);
  }
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 0;
  int first = argc <= 2;
  pid_t child = -1;
  if (n > 0) {
    child = fork();
    if (child == 0) {
      char count[16];
      snprintf(count, sizeof count, "%d", n - 1);
      execl("/proc/self/exe", argv[0], count, "child", (char *)NULL);
      _exit(127);
    }
  }
  work(0.3);
  int status = 0;
  if (child > 0 && (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0))
    return 1;
  if (first) printf("checksum %d\n", sink != 0);
  return 0;
}
