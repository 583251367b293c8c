/* The same CPU work split over N threads that each live only for their share: with 1,000
 * threads of ~5 ms each, most exit before a kernel tick falls after their timer's expiry.
 * Threads run two at a time (one per core here); each burns its share of thread CPU time in
 * short_work, which its start routine calls.
 *
 *   short_threads N SECONDS [together]
 *                               prints "cpu SECONDS" (process CPU time, getrusage) and
 *                               "threads SECONDS" (the workers' own CPU time, summed); with
 *                               "together", all N threads are started at once, then joined */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "common.h"

static double share;
static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;
static double threads_cpu;

__attribute__((noinline)) static void short_work(void) {
  volatile unsigned long x = 0;
  double end = thread_cpu() + share;
  while (thread_cpu() < end)
    for (int i = 0; i < 1000; i++) x = x * 31 + i;
  __asm__ volatile("");
}

static void *worker(void *arg) {
  (void)arg;
  short_work();
  double mine = thread_cpu();
  pthread_mutex_lock(&sum_lock);
  threads_cpu += mine;
  pthread_mutex_unlock(&sum_lock);
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1000;
  double seconds = argc > 2 ? atof(argv[2]) : 5;
  share = seconds / n;
  if (argc > 3 && !strcmp(argv[3], "together")) {
    pthread_t *all = calloc(n, sizeof *all);
    int started = 0;
    for (int i = 0; i < n; i++)
      if (pthread_create(&all[started], NULL, worker, NULL) == 0) started++;
    for (int i = 0; i < started; i++) pthread_join(all[i], NULL);
    free(all);
    n = 0;
  }
  for (int i = 0; i < n; i += 2) {
    pthread_t t[2];
    int started = 0;
    for (int k = 0; k < 2 && i + k < n; k++)
      if (pthread_create(&t[started], NULL, worker, NULL) == 0) started++;
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("threads %.4f\n", threads_cpu);
  printf("cpu %.4f\n", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
