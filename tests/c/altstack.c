/* Measures how much of an alternate signal stack the profiling handler uses. The program
 * runs on a pattern-filled sigaltstack-equipped thread (the profiler installs its handler
 * with SA_ONSTACK, so it runs there), burns CPU through libc (qsort with a callback, so DWARF
 * walks have real work), then reports the deepest byte touched.
 *
 *   altstack SECONDS     prints "altstack_used BYTES" (kernel signal frame included) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALT_SIZE (256 * 1024)
#define PATTERN 0xA5

static int compare(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return (x > y) - (x < y);
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  unsigned char *alt = malloc(ALT_SIZE);
  memset(alt, PATTERN, ALT_SIZE);
  stack_t ss = {.ss_sp = alt, .ss_size = ALT_SIZE, .ss_flags = 0};
  if (sigaltstack(&ss, NULL) != 0) return 2;
  static unsigned values[100000];
  unsigned seed = 1;
  double end = cpu_seconds() + seconds;
  while (cpu_seconds() < end) {
    for (int i = 0; i < 100000; i++) values[i] = seed = seed * 1103515245u + 12345u;
    qsort(values, 100000, sizeof values[0], compare);
  }
  size_t untouched = 0;
  while (untouched < ALT_SIZE && alt[untouched] == PATTERN) untouched++;
  printf("altstack_used %zu\n", ALT_SIZE - untouched);
  return 0;
}
