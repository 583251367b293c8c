/* A known call graph for filters and `peek`: main calls a(), b() and rec(); a and b both call
 * c(); rec recurses twice, then calls c(). Work units per round (each function's own loop):
 *
 *   a: 2 self, c: 3 via a      b: 1 self, c: 1 via b      rec: 0 self, c: 1 via rec;rec;rec
 *
 * so of 8 units: c 5 (a 3, b 1, rec 1), a 2 + 3, b 1 + 1, rec 1 (recursion counted once).
 *
 *   callgraph SECONDS     burn SECONDS of CPU; prints "checksum N" and "cpu SECONDS" */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define BURN_ROUNDS
#include "common.h"

static volatile unsigned long sink;

/* Inlined into each function, so the samples land in the function itself. */
/* The asm after each call keeps it from being a tail call, so the caller stays on the stack. */
__attribute__((noinline)) void c(unsigned long n) { sink += burn(n); }

__attribute__((noinline)) void a(unsigned long n) {
  sink += burn(2 * n);
  c(3 * n);
  __asm__ volatile("");
}

__attribute__((noinline)) void b(unsigned long n) {
  sink += burn(n);
  c(n);
  __asm__ volatile("");
}

__attribute__((noinline)) void rec(int depth, unsigned long n) {
  if (depth > 0)
    rec(depth - 1, n);
  else
    c(n);
  __asm__ volatile("");
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  /* Rounds of varying length, so the loop has no period for the tick-driven timer to fall
   * into step with. */
  unsigned long state = 0x2545F4914F6CDD1DUL;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    unsigned long n = 20000 + (state >> 33) % 200000;
    a(n);
    b(n);
    rec(2, n);
  }
  printf("checksum %lu\ncpu %.4f\n", (unsigned long)(sink != 0), cpu_seconds());
  return 0;
}
