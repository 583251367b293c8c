/* Helpers shared by the C workloads of the tests (tests/README.md says which program does what).
 *
 *   burn(n)          with BURN_ROUNDS defined before the #include: n rounds of a multiply-add
 *                    the compiler cannot drop. Always inlined: the profile shows the function
 *                    that called it (hot_a, hot_b, ...), and the loop's source lines are here.
 *   burn(seconds)    with BURN_SECONDS defined before the #include, instead: spins until the
 *                    calling thread has used `seconds` more CPU (read with thread_cpu()). Never
 *                    inlined: profiles of these programs have a frame named `burn`.
 *   thread_cpu()     the calling thread's CPU time in seconds, exact (a system call each time).
 *   cpu_deadline_*   deadlines in CPU time read without that system call (cpu_deadline.h): what
 *                    known-answer workloads use, for the reason given there.
 *
 * A program whose test reads its own source lines (hot.c: tests/advise.rs; stripped_hot.c:
 * tests/http.rs) or that needs another loop (build_ids.c: a second build with other code) keeps
 * its own burn. Valid C and C++ (tests/install.rs builds installed.c as both). */
#ifndef TESTS_C_COMMON_H
#define TESTS_C_COMMON_H
#include <time.h>

#include "cpu_deadline.h"

__attribute__((unused)) static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

#ifdef BURN_SECONDS
static volatile unsigned long burn_sink;

__attribute__((noinline, unused)) static void burn(double seconds) {
  double end = thread_cpu() + seconds;
  while (thread_cpu() < end)
    for (int i = 0; i < 10000; i++) burn_sink = burn_sink * 31 + i;
}
#elif defined(BURN_ROUNDS)
__attribute__((always_inline, unused)) static inline unsigned long burn(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}
#endif
#endif
