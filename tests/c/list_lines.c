/* Workload for `cpuprof list`: known answers per source line.
 *
 *   list_lines SECONDS     burn about SECONDS of CPU; prints "checksum N"
 *
 * hot_line's loop is on one line, so that line holds (nearly) all of hot_line's samples.
 * with_inline calls inner_step, inlined, twice: with n and n / 2 iterations, so its first call
 * line carries about 2/3 and its second about 1/3 of with_inline's cumulative samples, while
 * inner_step's own listing has them on inner_step's loop line. hot_line gets about 3/5 of the
 * time, with_inline 2/5. The asm statements keep the compiler from folding the loops. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cpu_deadline.h"

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long hot_line(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) { x = x * 6364136223846793005UL + i; __asm__ volatile("" : "+r"(x)); }
  return x;
}

__attribute__((always_inline)) static inline unsigned long inner_step(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) { x ^= x >> 7; x *= 0x9E3779B97F4A7C15UL; __asm__ volatile("" : "+r"(x)); }
  return x;
}

__attribute__((noinline)) unsigned long with_inline(unsigned long n) {
  unsigned long a = inner_step(n);
  unsigned long b = inner_step(n / 2);
  return a + b;
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  unsigned long rounds = 0;
  /* Round lengths vary so the loop has no period a tick-driven timer could fall into step with. */
  unsigned long seed = 12345;
  struct cpu_deadline deadline = cpu_deadline_in(seconds - cpu_seconds());
  while (!cpu_deadline_passed(&deadline)) {
    seed = seed * 6364136223846793005UL + 1442695040888963407UL;
    unsigned long n = 200000 + (seed >> 40) % 100000;
    sink += hot_line(3 * n);
    sink += with_inline(2 * n);
    rounds++;
  }
  printf("checksum %lu\n", rounds > 0 ? 1UL : 0UL);
  return 0;
}
