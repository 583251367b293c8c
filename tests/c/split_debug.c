/* Workload for the separate-debug-info tests: two static hot functions (so a stripped build
 * has no symbol for them at all, not even in .dynsym) around an inlined helper, so that names,
 * lines and inline frames can only come from the split-off debug file.
 *
 *   split_debug SECONDS    burn about SECONDS of CPU, two thirds in spin_alpha
 *
 * Prints "checksum N" so callers can see it ran to the end. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cpu_deadline.h"

static volatile unsigned long sink;

__attribute__((always_inline)) static inline unsigned long mix(unsigned long x, unsigned long n) {
  for (unsigned long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

__attribute__((noinline)) static void spin_alpha(unsigned long n) { sink += mix(sink, 2 * n); }

__attribute__((noinline)) static void spin_beta(unsigned long n) { sink ^= mix(sink + 1, n); }

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    spin_alpha(100000);
    spin_beta(100000);
  }
  printf("checksum %lu\n", sink == 0 ? 1UL : 0UL);
  return 0;
}
