/* Known-answer workload for an installed cpuprof (tests/install.rs), built as C and as C++
 * against the installed <gperftools/profiler.h> and library through pkg-config.
 *
 *   installed UNIT_SECONDS api PATH   ProfilerStart(PATH); hot_a burns 3 units of CPU in this
 *                                     thread while hot_b burns 1 in a new one (pthread_create,
 *                                     std::thread in C++); ProfilerStop()
 *   installed UNIT_SECONDS            hot_a then hot_b in this thread, profiled only if
 *                                     CPUPROFILE starts the profiler at load
 *
 * hot_a's share is 75 % and hot_b's 25 % when every thread is sampled. Built with
 * -DAUTOSTART_ONLY, the program refers to no symbol of the library (no API call, no thread):
 * a static link keeps the profiler only if the link asks for it. Prints "checksum 1". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define BURN_ROUNDS
#include "common.h"
#ifndef AUTOSTART_ONLY
#include <gperftools/profiler.h>
#ifdef __cplusplus
#include <thread>
#else
#include <pthread.h>
#endif
#endif

#ifdef __cplusplus
#define C_NAME extern "C" /* hot_a and hot_b keep their names in the profile */
#else
#define C_NAME
#endif

static volatile unsigned long sink;

/* Inlined, so that the samples land in hot_a and hot_b themselves (as in hot.c). */
/* Rounds of varying length (no period for a tick-driven timer to fall into step with) until
 * `seconds` of this thread's CPU time have passed. */
static void burn_for(double seconds, unsigned long seed) {
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  unsigned long state = seed;
  while (!cpu_deadline_passed(&deadline)) {
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    sink += burn(20000 + (state >> 33) % 360000);
  }
}

C_NAME __attribute__((noinline)) void hot_a(double seconds) {
  burn_for(seconds, 1);
  __asm__ volatile(""); /* not a tail call: hot_a stays on the stack */
}

C_NAME __attribute__((noinline)) void hot_b(double seconds) {
  burn_for(seconds, 2);
  __asm__ volatile("");
}

#if !defined(AUTOSTART_ONLY) && !defined(__cplusplus)
static void *thread_b(void *unit) {
  hot_b(*(double *)unit);
  return NULL;
}
#endif

int main(int argc, char **argv) {
  double unit = argc > 1 ? atof(argv[1]) : 0.3;
#ifndef AUTOSTART_ONLY
  if (argc > 3 && !strcmp(argv[2], "api")) {
    if (!ProfilerStart(argv[3])) return 3;
#ifdef __cplusplus
    std::thread b(hot_b, unit);
    hot_a(3 * unit);
    b.join();
#else
    pthread_t b;
    if (pthread_create(&b, NULL, thread_b, &unit) != 0) return 4;
    hot_a(3 * unit);
    pthread_join(b, NULL);
#endif
    ProfilerStop();
    printf("checksum %d\n", sink != 0);
    return 0;
  }
#endif
  hot_a(3 * unit);
  hot_b(unit);
  printf("checksum %d\n", sink != 0);
  return 0;
}
