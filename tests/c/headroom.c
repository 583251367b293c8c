/* Measures how much stack below the interrupted code the profiling signal takes: the kernel's
 * signal frame plus the handler (the walk itself runs on a stack of the profiler's own). A
 * thread runs on a pattern-filled stack of its own, burns CPU through libc (qsort with a
 * callback, so DWARF walks have real work), then reports the deepest byte touched. Run it
 * without the profiler for the program's own use; the difference is the handler's headroom.
 *
 *   headroom SECONDS         prints "stack_used BYTES"
 *   headroom SECONDS empty   the same with an empty SIGPROF handler of its own on a 1 kHz
 *                            ITIMER_PROF: what any signal costs (kernel frame, red zone) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include "common.h"

#define STACK_SIZE (256 * 1024)
#define PATTERN 0xA5

static double seconds = 2.0;

static int compare(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return (x > y) - (x < y);
}

static void *sort_for_a_while(void *arg) {
  (void)arg;
  static unsigned values[100000];
  unsigned seed = 1;
  double end = thread_cpu() + seconds;
  while (thread_cpu() < end) {
    for (int i = 0; i < 100000; i++) values[i] = seed = seed * 1103515245u + 12345u;
    qsort(values, 100000, sizeof values[0], compare);
  }
  return NULL;
}

static void empty_handler(int sig) { (void)sig; }

int main(int argc, char **argv) {
  if (argc > 1) seconds = atof(argv[1]);
  if (argc > 2 && !strcmp(argv[2], "empty")) {
    signal(SIGPROF, empty_handler);
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &every_ms, NULL);
  }
  unsigned char *stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(stack, PATTERN, STACK_SIZE);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, stack, STACK_SIZE);
  pthread_t t;
  pthread_create(&t, &attr, sort_for_a_while, NULL);
  pthread_join(t, NULL);
  size_t untouched = 0;
  while (untouched < STACK_SIZE && stack[untouched] == PATTERN) untouched++;
  printf("stack_used %zu\n", STACK_SIZE - untouched);
  return 0;
}
