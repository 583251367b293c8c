/* Labels' known answer: each thread serves requests in one function, serve(), alternating /a
 * (7 calls of one unit of work) and /b (3 calls), each under its label set
 * (CpuprofLabelsSwap), about 20,000 label switches a second per thread: /a holds 70 % of the
 * CPU time, /b 30 %, by construction (the same call; no clock is read per request, which
 * would bias the sampling: cpu_deadline.h). Linked with -lcpuprof and started by CPUPROFILE.
 * Arguments: CPU seconds per thread (default 2), threads (default 1), and `stress`: instead,
 * switch between three sets (and none) in a tight loop, with a fourth set interned but never
 * installed; or `b-grows`: each /b request also calls validate() 3 times (a new cost under /b
 * only, for `cpuprof diff --by endpoint`); or `sleepy`: 400 rounds of 3 ms asleep under /a
 * and ~1 ms of work under /b (for wall-clock profiles: the off-CPU time keeps its labels).
 * Prints the requests served (stress: the switches). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_deadline.h"
#include "cpuprof.h"

/* Iterations of one unit of work: ~10 us here, so a pair of requests takes ~100 us. */
#define UNIT 6000

static const CpuprofLabels *set_a, *set_b, *set_c;
static volatile unsigned long sink;
static double seconds = 2;
static int b_grows;

__attribute__((noinline)) void serve(void) {
  unsigned long x = sink;
  for (long i = 0; i < UNIT; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

/* The work /b gains with `b-grows`: the same as serve(), in a function of its own. */
__attribute__((noinline)) void validate(void) {
  unsigned long x = sink;
  for (long i = 0; i < UNIT; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

static void *worker(void *arg) {
  (void)arg;
  struct cpu_deadline d = cpu_deadline_in(seconds);
  long requests = 0;
  while (!cpu_deadline_passed(&d)) {
    for (int i = 0; i < 50; i++) {
      const CpuprofLabels *before = CpuprofLabelsSwap(set_a);
      for (int k = 0; k < 7; k++) serve();
      CpuprofLabelsSwap(set_b);
      for (int k = 0; k < 3; k++) serve();
      for (int k = 0; k < 3 * b_grows; k++) validate();
      CpuprofLabelsSwap(before);
      requests += 2;
    }
  }
  return (void *)requests;
}

/* Sleeps 3 ms labelled /a, works ~1 ms labelled /b, 400 times. */
static void *sleepy(void *arg) {
  (void)arg;
  long requests = 0;
  for (int round = 0; round < 400; round++) {
    const CpuprofLabels *before = CpuprofLabelsSwap(set_a);
    usleep(3000);
    CpuprofLabelsSwap(set_b);
    for (int k = 0; k < 100; k++) serve();
    CpuprofLabelsSwap(before);
    requests += 2;
  }
  return (void *)requests;
}

/* Switches sets as fast as it can, until its CPU time is up. */
static void *stress(void *arg) {
  (void)arg;
  struct cpu_deadline d = cpu_deadline_in(seconds);
  const CpuprofLabels *sets[] = {set_a, set_b, set_c, NULL};
  long switches = 0;
  while (!cpu_deadline_passed(&d)) {
    for (int i = 0; i < 4096; i++) {
      const CpuprofLabels *before = CpuprofLabelsSwap(sets[i & 3]);
      sink += i;
      CpuprofLabelsSwap(before);
      switches += 2;
    }
  }
  return (void *)switches;
}

int main(int argc, char **argv) {
  seconds = argc > 1 ? atof(argv[1]) : 2;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  const char *a[] = {"endpoint", "/a"};
  const char *b[] = {"endpoint", "/b"};
  const char *c[] = {"endpoint", "/c", "tenant", "t 1"};
  const char *never[] = {"endpoint", "/never"};
  set_a = CpuprofLabelsIntern(a, 1);
  set_b = CpuprofLabelsIntern(b, 1);
  set_c = CpuprofLabelsIntern(c, 2);
  if (!set_a || !set_b || !set_c || set_a == set_b || CpuprofLabelsIntern(a, 1) != set_a) return 2;
  if (!CpuprofLabelsIntern(never, 1) || CpuprofLabelsIntern(a, -1) != NULL) return 2;
  void *(*run)(void *) = argc > 3 && !strcmp(argv[3], "stress") ? stress : worker;
  if (argc > 3 && !strcmp(argv[3], "sleepy")) run = sleepy;
  b_grows = argc > 3 && !strcmp(argv[3], "b-grows");
  pthread_t t[64];
  if (threads < 1 || threads > 64) return 2;
  for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, NULL);
  long requests = 0;
  for (int i = 0; i < threads; i++) {
    void *n;
    pthread_join(t[i], &n);
    requests += (long)n;
  }
  printf("requests %ld\n", requests);
  return 0;
}
