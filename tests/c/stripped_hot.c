/* Known-answer workload for naming code of a stripped program (built with -rdynamic and then
 * `strip --strip-all`): three hot functions doing 3 : 2 : 1 units of work,
 *
 *   hot_exported  global, so -rdynamic keeps it in .dynsym: named from .dynsym
 *   hot_static_a  static, 3 units: no symbol left after strip, only its FDE
 *   hot_static_b  static, 2 units: likewise
 *
 * hot_exported does 1 unit; the shares are 1/6, 1/2 and 1/3 of the work.
 *
 *   stripped_hot stdin     work until standard input reaches end of file
 *   stripped_hot SECONDS   work for SECONDS of CPU
 *
 * Prints "checksum 1" at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu_deadline.h"
#include <poll.h>
#include <unistd.h>

static volatile unsigned long sink;

/* Inlined into each hot function, so that the samples land in the hot functions themselves. */
__attribute__((always_inline)) static inline unsigned long burn(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

__attribute__((noinline)) void hot_exported(unsigned long n) { sink += burn(n); }
__attribute__((noinline)) static void hot_static_a(unsigned long n) { sink += burn(3 * n); }
__attribute__((noinline)) static void hot_static_b(unsigned long n) { sink += burn(2 * n); }

/* Rounds of varying length, so that no period of the loop falls into step with the timer. */
static void round_of_work(unsigned long *state) {
  *state = *state * 6364136223846793005UL + 1442695040888963407UL;
  unsigned long n = 20000 + (*state >> 33) % 360000;
  hot_static_a(n);
  hot_static_b(n);
  hot_exported(n);
}

int main(int argc, char **argv) {
  unsigned long state = (unsigned long)getpid();
  if (argc > 1 && !strcmp(argv[1], "stdin")) {
    struct pollfd in = {.fd = 0, .events = POLLIN};
    for (;;) {
      round_of_work(&state);
      if (poll(&in, 1, 0) > 0) {
        char buf[64];
        if (read(0, buf, sizeof buf) <= 0) break;
      }
    }
  } else {
    struct cpu_deadline deadline = cpu_deadline_in(argc > 1 ? atof(argv[1]) : 2.0);
    while (!cpu_deadline_passed(&deadline)) round_of_work(&state);
  }
  printf("checksum %d\n", sink != 0 ? 1 : 0);
  return 0;
}
