/* Known answers for event profiles (tests/events.rs): the counts of software events each
 * function causes, which the program counts itself.
 *
 *   events_known faults A B ROUNDS   each round, touch_a writes to A fresh pages (one page
 *                                    fault each) and touch_b to B; prints `pages_a N`,
 *                                    `pages_b N` (pages touched over all rounds).
 *   events_known threads T PAGES     T threads each touching PAGES fresh pages in touch_a;
 *                                    prints `pages_a N`.
 *   events_known eintr N             N rounds of: touch a fresh page, sleep 50 us, poll a
 *                                    silent pipe for 1 ms; prints how many sleeps and polls
 *                                    failed with EINTR (`nanosleep_eintr N`, `poll_eintr N`).
 *   events_known serve A B           rounds of `faults A B 1` until stdin closes (for the HTTP
 *                                    endpoint); prints `pages_a N`, `pages_b N`.
 *
 * Pages are touched in memory mapped fresh for each round (MAP_POPULATE is not used, so each
 * first write faults), and unmapped after, so every round faults again. */
#define _GNU_SOURCE
#include <poll.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long page;

__attribute__((noinline)) static long touch(long pages) {
  char *p = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  for (long i = 0; i < pages; i++) ((volatile char *)p)[i * page] = 1;
  munmap(p, pages * page);
  return pages;
}

/* Callers that stay on the stack (no tail call: the profile must show touch_a under touch),
 * with bodies that differ, or the compiler folds the two into one (-fipa-icf). */
static volatile long touched_a, touched_b;

__attribute__((noinline)) static long touch_a(long pages) {
  touched_a += touch(pages);
  return pages;
}

__attribute__((noinline)) static long touch_b(long pages) {
  touched_b += touch(pages);
  return pages;
}

static long thread_pages;

static void *toucher(void *arg) {
  (void)arg;
  touch_a(thread_pages);
  return NULL;
}

int main(int argc, char **argv) {
  page = sysconf(_SC_PAGESIZE);
  if (argc == 5 && strcmp(argv[1], "faults") == 0) {
    long a = atol(argv[2]), b = atol(argv[3]), rounds = atol(argv[4]), ta = 0, tb = 0;
    for (long r = 0; r < rounds; r++) {
      ta += touch_a(a);
      tb += touch_b(b);
    }
    printf("pages_a %ld\npages_b %ld\n", ta, tb);
    return 0;
  }
  if (argc == 4 && strcmp(argv[1], "threads") == 0) {
    int n = atoi(argv[2]);
    thread_pages = atol(argv[3]);
    pthread_t t[64];
    if (n < 1 || n > 64) return 2;
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, toucher, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("pages_a %ld\n", n * thread_pages);
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "eintr") == 0) {
    long n = atol(argv[2]), slept = 0, polled = 0;
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return 1;
    for (long i = 0; i < n; i++) {
      touch_a(1);
      struct timespec ts = {0, 50000};
      if (nanosleep(&ts, NULL) != 0 && errno == EINTR) slept++;
      struct pollfd silent = {pipe_fds[0], POLLIN, 0};
      if (poll(&silent, 1, 1) < 0 && errno == EINTR) polled++;
    }
    printf("nanosleep_eintr %ld\npoll_eintr %ld\n", slept, polled);
    return 0;
  }
  if (argc == 4 && strcmp(argv[1], "serve") == 0) {
    long a = atol(argv[2]), b = atol(argv[3]), ta = 0, tb = 0;
    char byte;
    for (;;) {
      ta += touch_a(a);
      tb += touch_b(b);
      struct pollfd in = {0, POLLIN, 0};
      if (poll(&in, 1, 0) == 1 && read(0, &byte, 1) <= 0) break;
    }
    printf("pages_a %ld\npages_b %ld\n", ta, tb);
    return 0;
  }
  fprintf(stderr, "usage: events_known faults A B ROUNDS | threads T PAGES | eintr N | serve A B\n");
  return 2;
}
