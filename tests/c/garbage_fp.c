/* Hostile start: threads that keep garbage in RBP (the frame-pointer register) while they
 * burn CPU, so the profiler's frame-pointer walk starts from garbage on almost every sample.
 * Values: random, aligned random, just above and below the stack pointer, kernel addresses,
 * the thread's own guard page, heap, low addresses.
 *
 *   garbage_fp SECONDS THREADS     each thread burns SECONDS of CPU; prints "ok" at the end. Build with -mno-red-zone
 *   (x86-64). On aarch64 the garbage is in x29 and in LR (x30). */
#define _GNU_SOURCE /* pthread_getattr_np */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double seconds;

/* Thread CPU time, so each thread burns its share even on a busy machine. */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *garbage(void *arg) {
  unsigned long x = (unsigned long)arg * 0x9E3779B97F4A7C15UL | 1;
  pthread_attr_t attr;
  void *stack_lo;
  size_t stack_size;
  pthread_getattr_np(pthread_self(), &attr);
  pthread_attr_getstack(&attr, &stack_lo, &stack_size);
  unsigned long guard = (unsigned long)stack_lo - 4096;
  unsigned long *heap = malloc(4096);
  double end = now() + seconds;
  while (now() < end) {
    for (int k = 0; k < 100; k++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      unsigned long here = (unsigned long)&x, fp;
      switch (x & 7) {
        case 0: fp = x; break;
        case 1: fp = x & ~7UL; break;
        case 2: fp = here + (x & 0xfff8); break;
        case 3: fp = here - (x & 0xfff8); break;
        case 4: fp = 0xffff800000000000UL | (x & ~7UL); break;
        case 5: fp = guard + (x & 0xff8); break;
        case 6: fp = (unsigned long)heap + (x & 0xff8); break;
        default: fp = x & 0xfffff8; break;
      }
      unsigned long n = 20000;
#if defined(__aarch64__)
      /* x29 and x30 (LR, which the frame-pointer walk takes a leaf's caller from) both garbage. */
      __asm__ volatile("mov x9, x29\n\tmov x29, %1\n\tmov x30, %2\n1:\n\tsubs %0, %0, #1\n\tb.ne 1b\n\tmov x29, x9"
                       : "+r"(n) : "r"(fp), "r"(x ^ here) : "x9", "x30", "memory", "cc");
#else
      __asm__ volatile("push %%rbp\n\tmov %1, %%rbp\n1:\n\tdec %0\n\tjnz 1b\n\tpop %%rbp"
                       : "+r"(n) : "r"(fp) : "memory", "cc");
#endif
    }
  }
  free(heap);
  return NULL;
}

int main(int argc, char **argv) {
  seconds = argc > 1 ? atof(argv[1]) : 3.0;
  int threads = argc > 2 ? atoi(argv[2]) : 2;
  pthread_t t[64];
  for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, garbage, (void *)(long)(i + 1));
  for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
  puts("ok");
  return 0;
}
