#define _GNU_SOURCE
/* Hot-path audit: a thread burns CPU in code that makes no system call and allocates nothing,
 * between two getppid() markers, so that whatever a tracer sees that thread do in between is
 * the signal handler's doing. The executable interposes the allocator (libcpuprof.so's Rust
 * code allocates through malloc) and counts calls per thread.
 *
 *   hot_path ITERATIONS   prints "tid N" (the burning thread) and "allocations N" (its
 *                         allocator calls inside the window) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static __thread long allocator_calls;

void *malloc(size_t n) { allocator_calls++; return __libc_malloc(n); }
void *calloc(size_t n, size_t m) { allocator_calls++; return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { allocator_calls++; return __libc_realloc(p, n); }
void free(void *p) { if (p) allocator_calls++; __libc_free(p); }
void *memalign(size_t a, size_t n) { allocator_calls++; return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { allocator_calls++; return __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
  allocator_calls++;
  *out = __libc_memalign(a, n);
  return *out ? 0 : 12;
}

static long iterations;
static long tid, window_allocations;

__attribute__((noinline)) static unsigned long burn(long n) {
  unsigned long x = 1;
  for (long i = 0; i < n; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

static void *worker(void *arg) {
  (void)arg;
  tid = gettid();
  unsigned long x = burn(iterations / 4); /* warm-up: the profiler learns this thread's stack */
  getppid();
  long before = allocator_calls;
  x += burn(iterations);
  window_allocations = allocator_calls - before;
  getppid();
  return (void *)x;
}

int main(int argc, char **argv) {
  iterations = argc > 1 ? atol(argv[1]) : 500000000;
  pthread_t t;
  void *r;
  pthread_create(&t, NULL, worker, NULL);
  pthread_join(t, &r);
  printf("tid %ld\nallocations %ld\nchecksum %lu\n", tid, window_allocations, (unsigned long)r);
  return 0;
}
