/* Asynchronous cancellation of computing threads.
 *
 *   async_cancel [ROUNDS]   ROUNDS times (default 100): a thread enables
 *                           PTHREAD_CANCEL_ASYNCHRONOUS and spins in pure computation; the main
 *                           thread lets it compute for about 2 ms of its CPU time, cancels it
 *                           and joins it. glibc delivers the cancellation with its internal
 *                           signal (SIGCANCEL, 32) and unwinds the thread from that signal's
 *                           handler, wherever the thread was.
 *
 * Prints how many threads ended cancelled; exits 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;
static volatile int started;

__attribute__((noinline)) static void spin_cancellable(void) {
  for (;;)
    for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
}

static void *spinner(void *arg) {
  (void)arg;
  pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, NULL);
  __atomic_store_n(&started, 1, __ATOMIC_RELEASE);
  spin_cancellable();
  return NULL;
}

static double cpu_of(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 100, cancelled = 0;
  for (int i = 0; i < rounds; i++) {
    pthread_t t;
    __atomic_store_n(&started, 0, __ATOMIC_RELEASE);
    if (pthread_create(&t, NULL, spinner, NULL) != 0) {
      printf("pthread_create failed\n");
      return 1;
    }
    while (!__atomic_load_n(&started, __ATOMIC_ACQUIRE)) sched_yield();
    clockid_t clock;
    pthread_getcpuclockid(t, &clock);
    double until = cpu_of(clock) + 0.002;
    struct timespec pause = {0, 200000};
    while (cpu_of(clock) < until) nanosleep(&pause, NULL);
    pthread_cancel(t);
    void *result;
    pthread_join(t, &result);
    cancelled += result == PTHREAD_CANCELED;
  }
  printf("cancelled %d of %d\n", cancelled, rounds);
  return 0;
}
