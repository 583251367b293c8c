/* Threads whose CPU use is in a known ratio: thread k (1..N) burns k units in burn_k.
 *
 *   threads N UNIT_SECONDS     prints "cpu SECONDS" (process CPU time, getrusage) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include "cpu_deadline.h"

static double unit;

static void burn(double seconds) {
  volatile unsigned long x = 0;
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline))
    for (int i = 0; i < 10000; i++) x = x * 31 + i;
}

/* The asm after each call keeps it from being a tail call, so burn_k stays on the stack. */
__attribute__((noinline)) void burn_1(void) { burn(1 * unit); __asm__ volatile(""); }
__attribute__((noinline)) void burn_2(void) { burn(2 * unit); __asm__ volatile(""); }
__attribute__((noinline)) void burn_3(void) { burn(3 * unit); __asm__ volatile(""); }
__attribute__((noinline)) void burn_4(void) { burn(4 * unit); __asm__ volatile(""); }
static void (*const burns[4])(void) = {burn_1, burn_2, burn_3, burn_4};

static void *worker(void *arg) {
  burns[(long)arg % 4]();
  return NULL;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  unit = argc > 2 ? atof(argv[2]) : 0.5;
  pthread_t t[64];
  for (long i = 0; i < n && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], NULL);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("cpu %.4f\n", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
