/* The main thread and N other threads each burn the same CPU time in their own function, so
 * a profile's stacks should all end at a thread's root: _start for the main thread, clone3
 * (or clone) for the others.
 *
 *   roots N SECONDS     each of the N+1 threads burns SECONDS of its own CPU time;
 *                       prints "cpu SECONDS" (process CPU time, getrusage) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include "common.h"

static double seconds;

__attribute__((noinline)) static unsigned long burn(void) {
  volatile unsigned long x = 0;
  double end = thread_cpu() + seconds;
  while (thread_cpu() < end)
    for (int i = 0; i < 10000; i++) x = x * 31 + i;
  return x;
}

/* The asm after each call keeps it from being a tail call, so the caller stays on the stack. */
__attribute__((noinline)) static void *in_thread(void *arg) {
  (void)arg;
  burn();
  __asm__ volatile("");
  return NULL;
}

__attribute__((noinline)) static void in_main(void) {
  burn();
  __asm__ volatile("");
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  seconds = argc > 2 ? atof(argv[2]) : 1;
  pthread_t t[64];
  int started = 0;
  for (; started < n && started < 64; started++)
    if (pthread_create(&t[started], NULL, in_thread, NULL) != 0) break;
  in_main();
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("threads %d\n", started);
  printf("cpu %.4f\n", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
