/* Fixed work for overhead measurements: the profiled run does exactly the same work as the
 * unprofiled one, so the CPU time difference is the profiler's cost.
 *
 *   overhead UNITS [THREADS]   THREADS threads (default 1) share UNITS units of work
 *
 * Each unit is a recursion ten calls deep whose leaves do integer arithmetic, so samples have
 * stacks of about fifteen frames, as in an ordinary program. Build it with and without
 * -fno-omit-frame-pointer for the two unwinders. Prints "checksum N" and "peak_rss_kib N"
 * (VmHWM: the wait4 figure would include the parent's memory from before exec). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long units_per_thread;

__attribute__((noinline)) static unsigned long leaf(unsigned long x) {
  for (int i = 0; i < 20000; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

/* Not a tail call (the addition after it), so every level keeps its frame. */
__attribute__((noinline)) static unsigned long descend(int depth, unsigned long x) {
  if (depth == 0) return leaf(x);
  unsigned long r = descend(depth - 1, x + depth);
  __asm__ volatile("" : "+r"(r));
  return r + 1;
}

static void *worker(void *arg) {
  unsigned long x = (unsigned long)arg;
  for (long u = 0; u < units_per_thread; u++)
    for (int k = 0; k < 10; k++) x ^= descend(10, x + k);
  return (void *)x;
}

int main(int argc, char **argv) {
  long units = argc > 1 ? atol(argv[1]) : 1000;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  if (threads < 1 || threads > 64) return 2;
  units_per_thread = units / threads;
  pthread_t t[64];
  unsigned long sum = 0;
  for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < threads; i++) {
    void *r;
    pthread_join(t[i], &r);
    sum += (unsigned long)r;
  }
  printf("checksum %lu\n", sum);
  char line[256];
  FILE *status = fopen("/proc/self/status", "r");
  while (status && fgets(line, sizeof line, status))
    if (!strncmp(line, "VmHWM:", 6)) printf("peak_rss_kib %ld\n", atol(line + 6));
  if (status) fclose(status);
  return 0;
}
