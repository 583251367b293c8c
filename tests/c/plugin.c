/* A library loaded and unloaded repeatedly by dlopen_loop.c. Built without frame pointers,
 * so only DWARF unwinding finds its callers. */
#include <time.h>

static volatile unsigned long sink;

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void plugin_burn(double seconds) {
  double end = cpu_seconds() + seconds;
  while (cpu_seconds() < end)
    for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
}
