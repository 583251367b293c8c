/* Known-answer workload: hot_a does exactly 3x the work of hot_b, both called from main.
 *
 *   hot SECONDS                      burn SECONDS of CPU (profiled via CPUPROFILE/LD_PRELOAD)
 *   hot SECONDS api PATH             the same inside ProfilerStart(PATH)/ProfilerStop()
 *   hot SECONDS twice PATH1 PATH2    two profiles in one process, one after the other
 *   hot SECONDS unwritable PATH      ProfilerStart(PATH) must fail; the program carries on
 *   hot SECONDS db DIR EPOCH         the same inside CpuprofStartDatabase(DIR, EPOCH)/ProfilerStop()
 *   hot SECONDS sleep SLEEP          then sleep SLEEP seconds (resuming after EINTR)
 *   hot 0 stdin                      work until standard input reaches end of file
 *
 * Prints "checksum N" so callers can see it ran to the end, and "cpu SECONDS", the process CPU
 * time used, to compare with the profile's sample total, and "wall SECONDS", the elapsed time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu_deadline.h"
#include <poll.h>
#include <unistd.h>
#ifdef USE_API
#include <gperftools/profiler.h>
#include <cpuprof.h>
#endif

static volatile unsigned long sink;

/* Inlined into each hot function, so the samples land in hot_a and hot_b themselves: gcc
 * gives leaf functions no frame even with -fno-omit-frame-pointer, and a frame-pointer walk
 * cannot see the caller of a frameless leaf. */
__attribute__((always_inline)) static inline unsigned long burn(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

__attribute__((noinline)) void hot_a(unsigned long n) { sink += burn(3 * n); }
/* Built with -DHOT_B_WORK=2 for a "new version" whose hot_b does twice the work. */
#ifndef HOT_B_WORK
#define HOT_B_WORK 1
#endif
__attribute__((noinline)) void hot_b(unsigned long n) { sink += burn(HOT_B_WORK * n); }

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Each round's length varies (hot_a still does exactly 3x hot_b's work in every round), so the
 * loop has no period for a tick-driven timer to fall into step with: a strictly periodic loop
 * whose period divides the 4 ms kernel tick is sampled at the same points tick after tick
 * (CPUPROF_PERIODIC=1 keeps the fixed rounds, for bench/sampling_accuracy.py).
 * The CPU clock is read every 20 ms, not after every round (cpu_deadline.h says why). */
static void work(double seconds) {
  int periodic = getenv("CPUPROF_PERIODIC") != NULL;
  struct timespec seed;
  clock_gettime(CLOCK_MONOTONIC, &seed);
  unsigned long state = (unsigned long)seed.tv_nsec ^ (unsigned long)getpid() << 32;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    unsigned long n = periodic ? 200000 : 20000 + (state >> 33) % 360000;
    hot_a(n);
    hot_b(n);
  }
}

int main(int argc, char **argv) {
  double started = wall_seconds();
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  const char *mode = argc > 2 ? argv[2] : "";
#ifdef USE_API
  if (!strcmp(mode, "api") && argc > 3) {
    if (!ProfilerStart(argv[3])) return 3;
    work(seconds);
    ProfilerStop();
  } else if (!strcmp(mode, "twice") && argc > 4) {
    for (int i = 0; i < 2; i++) {
      if (!ProfilerStart(argv[3 + i])) return 3;
      work(seconds / 2);
      ProfilerStop();
    }
  } else if (!strcmp(mode, "db") && argc > 4) {
    if (!CpuprofStartDatabase(argv[3], atof(argv[4]))) return 3;
    work(seconds);
    ProfilerStop();
  } else if (!strcmp(mode, "unwritable") && argc > 3) {
    if (ProfilerStart(argv[3])) return 4;
    work(seconds);
  } else
#endif
  if (!strcmp(mode, "sleep") && argc > 3) {
    work(seconds);
    double s = atof(argv[3]);
    struct timespec left = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    while (nanosleep(&left, &left) != 0) {
    }
  } else if (!strcmp(mode, "stdin")) {
    struct pollfd in = {.fd = 0, .events = POLLIN};
    char byte;
    for (;;) {
      work(0.05);
      if (poll(&in, 1, 0) > 0 && read(0, &byte, 1) <= 0) break;
    }
  } else {
    work(seconds);
  }
  printf("checksum %lu\ncpu %.4f\nwall %.4f\n", (unsigned long)(sink != 0), cpu_seconds(), wall_seconds() - started);
  return 0;
}
