/* Stacks that a sampling profiler must read without faulting, and signal stacks smaller than
 * its handler could ever need. Each mode prints what it observed; the tests run it with and
 * without the profiler and require the same output and exit status.
 *
 *   stacks munmap SECONDS    3 threads spin in generated code (no unwind info) with RBP
 *                            pointing into a chain of fake frames on pages that another
 *                            thread unmaps and maps again as fast as it can
 *   stacks altstack SECONDS  every thread (main and 3 more) installs a 2,048-byte
 *                            sigaltstack, one a 4 KiB one, and burns CPU
 *   stacks handler SECONDS   a thread burns CPU inside its own SA_ONSTACK SIGUSR1 handler,
 *                            running on an altstack with room for that handler only */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#define BURN_SECONDS
#include "common.h"

#define PAGE 4096
#define WORKERS 3

static double seconds = 1.0;

/* munmap: the workers' stacks and the churned pages share one reservation, stacks below, so
 * the fake frames lie above each worker's SP and within the span a frame walk follows. */
#define WORKER_STACK (256 * 1024)
#define CHURN_PAGES 64
#define FRAME_OFFSET 256
static char *churn;
static volatile int stop_churn;
static void (*jitted)(void);

/* Fills the churned pages with a chain of frames, page k's pointing to page k+1's. */
static void fill_frames(void) {
  for (int k = 0; k < CHURN_PAGES; k++) {
    uint64_t *frame = (uint64_t *)(churn + k * PAGE + FRAME_OFFSET);
    frame[0] = k + 1 < CHURN_PAGES ? (uint64_t)(churn + (k + 1) * PAGE + FRAME_OFFSET) : 0;
    frame[1] = (uint64_t)burn + 16; /* a plausible return address in this program */
  }
}

static void *mapper(void *arg) {
  long *cycles = arg;
  while (!stop_churn) {
    munmap(churn, CHURN_PAGES * PAGE);
    /* NOREPLACE: if anything else took the hole, leave it alone and stop churning. */
    void *p = mmap(churn, CHURN_PAGES * PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != churn) break;
    fill_frames();
    ++*cycles;
  }
  return NULL;
}

static void *spin_on_churned_frames(void *arg) {
  (void)arg;
  uint64_t frame = (uint64_t)(churn + FRAME_OFFSET);
  double end = thread_cpu() + seconds;
  while (thread_cpu() < end)
    __asm__ volatile("push %%rbp\n\tmov %0, %%rbp\n\tcall *%1\n\tpop %%rbp"
                     : : "r"(frame), "r"(jitted) : "rcx", "memory");
  return NULL;
}

static int munmap_race(void) {
  /* mov rcx, 200000; 1: dec rcx; jnz 1b; ret */
  static const unsigned char code[] = {0x48, 0xc7, 0xc1, 0x40, 0x0d, 0x03, 0x00,
                                       0x48, 0xff, 0xc9, 0x75, 0xfb, 0xc3};
  unsigned char *buf = mmap(NULL, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memcpy(buf, code, sizeof code);
  jitted = (void (*)(void))buf;
  size_t stacks = WORKERS * WORKER_STACK;
  char *base = mmap(NULL, stacks + CHURN_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return 2;
  churn = base + stacks;
  fill_frames();
  long cycles = 0;
  pthread_t m, w[WORKERS];
  pthread_create(&m, NULL, mapper, &cycles);
  for (int i = 0; i < WORKERS; i++) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, base + i * WORKER_STACK, WORKER_STACK);
    pthread_create(&w[i], &attr, spin_on_churned_frames, NULL);
  }
  for (int i = 0; i < WORKERS; i++) pthread_join(w[i], NULL);
  stop_churn = 1;
  pthread_join(m, NULL);
  printf("workers %d done, pages churned %s\n", WORKERS, cycles > 100 ? "yes" : "no");
  return 0;
}

/* altstack */
static void *burn_on_tiny_altstack(void *arg) {
  size_t size = (size_t)arg;
  stack_t ss = {.ss_sp = malloc(size), .ss_size = size};
  if (sigaltstack(&ss, NULL) != 0) return (void *)1;
  burn(seconds);
  return NULL;
}

static void on_segv(int sig) { (void)sig; _exit(3); }

static int tiny_altstacks(void) {
  /* A stack-overflow handler like many programs install: it never runs here, but its
   * altstack is what SA_ONSTACK deliveries would use. */
  struct sigaction sa = {.sa_handler = on_segv, .sa_flags = SA_ONSTACK};
  sigaction(SIGSEGV, &sa, NULL);
  pthread_t t[WORKERS];
  for (int i = 0; i < WORKERS; i++)
    pthread_create(&t[i], NULL, burn_on_tiny_altstack, (void *)(size_t)(i == 0 ? 4096 : 2048));
  long failed = (long)burn_on_tiny_altstack((void *)2048);
  for (int i = 0; i < WORKERS; i++) {
    void *r;
    pthread_join(t[i], &r);
    failed += (long)r;
  }
  printf("threads %d on tiny altstacks, failures %ld\n", WORKERS + 1, failed);
  return 0;
}

/* handler */
static double handler_seconds;
static void on_usr1(int sig) {
  (void)sig;
  burn(handler_seconds);
}

static int handler_on_small_altstack(void) {
  /* The kernel's signal frame (AT_MINSIGSTKSZ) plus 2 KiB for the handler's own frames. The
   * handler's calls are bound first: the loader's lazy binding saves the whole vector state on
   * the stack (AVX-512: ~2.7 KiB more), which 2 KiB cannot hold, with or without a profiler. */
  burn(0.001);
  size_t size = getauxval(AT_MINSIGSTKSZ) + 2048;
  stack_t ss = {.ss_sp = malloc(size), .ss_size = size};
  if (sigaltstack(&ss, NULL) != 0) return 2;
  struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
  sigaction(SIGUSR1, &sa, NULL);
  handler_seconds = seconds / 4;
  for (int i = 0; i < 4; i++) raise(SIGUSR1);
  /* What the program set is what it reads back: nothing added to the handler's mask. */
  struct sigaction now;
  sigaction(SIGUSR1, NULL, &now);
  int masked = 0;
  for (int s = 1; s < 65; s++) masked += sigismember(&now.sa_mask, s) == 1;
  printf("handler ran 4 times on its altstack, %d signals in its mask\n", masked);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 2) seconds = atof(argv[2]);
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "munmap")) return munmap_race();
  if (!strcmp(mode, "altstack")) return tiny_altstacks();
  if (!strcmp(mode, "handler")) return handler_on_small_altstack();
  return 2;
}
