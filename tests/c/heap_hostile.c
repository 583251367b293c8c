/* What a heap profiler's interposers must survive; each mode prints what it checked and exits
 * 0 (or the status it says), with or without the profiler alike. Modes:
 *   fork      allocate, fork without exec; the child allocates, frees, reallocs and exit(7)s;
 *             the parent frees what it allocated before and prints the child's status
 *   threads   1,000 short threads, 8 at a time, each allocating, reallocating and freeing
 *   realloc   realloc chains growing 1 B -> 4 MiB and shrinking back, contents checked
 *   aligned   posix_memalign's errors (EINVAL, ENOMEM) returned unchanged, memalign,
 *             aligned_alloc, valloc, pvalloc aligned, malloc_usable_size, reallocarray and
 *             calloc overflow (NULL, ENOMEM), free(NULL), realloc(NULL), realloc(p, 0)
 *   single    allocate and print the process's thread count (1: the profiler added none),
 *             then start a thread that sleeps 1.5 s while the first allocates and waits */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond) && failures++ < 5) fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
  } while (0)

static void *churn(void *arg) {
  uintptr_t seed = (uintptr_t)arg;
  void *kept[64];
  for (int i = 0; i < 64; i++) {
    kept[i] = malloc(16 + (seed * 31 + i * 977) % 200000);
    memset(kept[i], i, 16);
  }
  for (int i = 0; i < 64; i++) {
    kept[i] = realloc(kept[i], 32 + i * 1000);
    CHECK(((unsigned char *)kept[i])[0] == (unsigned char)i);
    free(kept[i]);
  }
  return NULL;
}

/* Allocated and freed by the parent before its fork: the parent's history, not the child's. */
__attribute__((noinline)) static void parent_only(void) {
  for (int i = 0; i < 50; i++) {
    void *p = malloc(4096 + i);
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
  }
}

static int mode_fork(void) {
  void *before[100];
  parent_only();
  for (int i = 0; i < 100; i++) before[i] = malloc(1 << (i % 20));
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < 100; i++) free(before[i]);
    churn((void *)7);
    void *p = malloc(1 << 20);
    p = realloc(p, 2 << 20);
    free(p);
    exit(7); /* exit, not _exit: the child's heap file is written at its exit */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  for (int i = 0; i < 100; i++) free(before[i]);
  printf("child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

static int mode_threads(void) {
  int started = 0;
  for (int round = 0; round < 125; round++) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
      if (pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(round * 8 + i)) == 0) started++;
    }
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  }
  printf("threads %d\n", started);
  return 0;
}

static int mode_realloc(void) {
  for (int chain = 0; chain < 20; chain++) {
    unsigned char *p = NULL;
    size_t size = 0;
    for (size_t next = 1; next <= (4u << 20); next = next * 3 / 2 + 1) {
      p = realloc(p, next);
      CHECK(p != NULL);
      for (size_t i = (size + 4092) / 4093 * 4093; i < next; i += 4093) p[i] = (unsigned char)(i * 7);
      for (size_t i = 0; i < size && i < next; i += 4093) CHECK(p[i] == (unsigned char)(i * 7));
      size = next;
    }
    while (size > 1) {
      size = size / 3 + 1;
      p = realloc(p, size);
      CHECK(p != NULL && p[0] == 0);
    }
    free(p);
  }
  printf("realloc chains 20\n");
  return 0;
}

static int mode_aligned(void) {
  void *p = (void *)1;
  CHECK(posix_memalign(&p, 3, 64) == EINVAL);
  CHECK(posix_memalign(&p, 64, SIZE_MAX - 4096) == ENOMEM);
  CHECK(posix_memalign(&p, 4096, 100) == 0 && ((uintptr_t)p & 4095) == 0);
  free(p);
  p = memalign(256, 1000);
  CHECK(p && ((uintptr_t)p & 255) == 0);
  free(p);
  p = aligned_alloc(64, 640);
  CHECK(p && ((uintptr_t)p & 63) == 0);
  CHECK(malloc_usable_size(p) >= 640);
  free(p);
  long page = sysconf(_SC_PAGESIZE);
  p = valloc(10);
  CHECK(p && ((uintptr_t)p & (page - 1)) == 0);
  free(p);
  errno = 0;
  volatile size_t huge = SIZE_MAX / 2; /* volatile: the compiler would warn of the overflow */
  CHECK(reallocarray(NULL, huge, 4) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(calloc(huge, 4) == NULL && errno == ENOMEM);
  int *z = calloc(1000, sizeof(int));
  int sum = 0;
  for (int i = 0; i < 1000; i++) sum += z[i];
  CHECK(sum == 0);
  z = reallocarray(z, 2000, sizeof(int));
  CHECK(z != NULL);
  free(z);
  free(NULL);
  p = realloc(NULL, 100);
  CHECK(p != NULL);
  p = realloc(p, 0);
  free(p);
  printf("aligned ok\n");
  return 0;
}

static int thread_count(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
  if (f) fclose(f);
  return n;
}

static void *sleeper(void *arg) {
  (void)arg;
  usleep(1500000);
  return NULL;
}

static int mode_single(void) {
  for (int i = 0; i < 1000; i++) {
    void *p = malloc(4096);
    __asm__ volatile("" : : "r"(p) : "memory"); /* kept: -O2 would drop the pair */
    free(p);
  }
  printf("threads alone %d\n", thread_count());
  pthread_t t;
  if (pthread_create(&t, NULL, sleeper, NULL) != 0) return 3;
  char *kept = malloc(8 << 20);
  memset(kept, 1, 8 << 20);
  __asm__ volatile("" : : "r"(kept) : "memory");
  pthread_join(t, NULL);
  free(kept);
  printf("single ok\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  int status = 2;
  if (!strcmp(mode, "fork")) status = mode_fork();
  else if (!strcmp(mode, "threads")) status = mode_threads();
  else if (!strcmp(mode, "realloc")) status = mode_realloc();
  else if (!strcmp(mode, "aligned")) status = mode_aligned();
  else if (!strcmp(mode, "single")) status = mode_single();
  else fprintf(stderr, "unknown mode %s\n", mode);
  return failures ? 1 : status;
}
