/* Three hot static functions in a known CPU-time ratio (1:2:3), for a binary that is then
 * stripped of every symbol: only the unwind tables still tell the functions apart.
 *
 *   stripped SECONDS        burns SECONDS of CPU in all, prints "cpu SECONDS" (process CPU time)
 *   stripped SECONDS bare   burns them in a function with neither symbol nor unwind table
 *                           entry once stripped (hand-written assembly without CFI) */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include "cpu_deadline.h"

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Distinct loop bodies, so identical-code folding cannot merge the three into one; the asm
 * after the loop keeps each out of its caller and off the tail-call path. */
__attribute__((noinline)) static unsigned long spin_one(double seconds) {
  volatile unsigned long x = 1;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline))
    for (int i = 0; i < 20000; i++) x = x * 31 + i;
  __asm__ volatile("");
  return x;
}

__attribute__((noinline)) static unsigned long spin_two(double seconds) {
  volatile unsigned long x = 2;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline))
    for (int i = 0; i < 20000; i++) x = x * 37 ^ i;
  __asm__ volatile("");
  return x;
}

__attribute__((noinline)) static unsigned long spin_three(double seconds) {
  volatile unsigned long x = 3;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline))
    for (int i = 0; i < 20000; i++) x = (x + i) * 41;
  __asm__ volatile("");
  return x;
}

/* bare_spin(n): n iterations of a loop, with no .cfi directives, so no FDE covers it; local,
 * so that it has no symbol left once stripped even when the program exports its globals. */
unsigned long bare_spin(unsigned long n);
__asm__(".text\n"
        ".type bare_spin, @function\n"
        "bare_spin:\n"
        "  mov %rdi, %rax\n"
        "1: sub $1, %rax\n"
        "  jnz 1b\n"
        "  ret\n"
        ".size bare_spin, .-bare_spin\n");

int main(int argc, char **argv) {
  double total = argc > 1 ? atof(argv[1]) : 4;
  if (argc > 2) {
    unsigned long sum = 0;
    double end = cpu_now() + total;
    while (cpu_now() < end) sum += bare_spin(10000000);
    printf("bare %lu\n", sum); /* bare_spin returns 0 */
    return 0;
  }
  /* Interleaved in slices, so a profile cut at any point still holds the ratio. The results
   * depend on how many loops fit in the time: kept, not printed. */
  static volatile unsigned long sink;
  int slices = 0;
  for (; slices < 20; slices++) {
    sink += spin_one(total / 120);
    sink += spin_two(2 * total / 120);
    sink += spin_three(3 * total / 120);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("slices %d\n", slices);
  printf("cpu %.4f\n", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
