#define _GNU_SOURCE
/* Cost of one profiling signal, handler included, at a given stack depth.
 *
 *   handler_cost LIBRARY DEPTH SIGNALS
 *
 * LIBRARY is "none" (an empty SA_SIGINFO handler: the platform's floor) or the path of a
 * library with gperftools' ProfilerStart/ProfilerStop (gperftools' libprofiler.so or
 * libcpuprof.so), loaded with dlopen. The program recurses DEPTH frames, then sends itself
 * SIGPROF SIGNALS times, so every signal interrupts the same DEPTH-deep stack; it prints
 * the thread CPU time per signal in nanoseconds. A profiler's cost per sample is its excess
 * over "none" in the same run (bench/handler_cost.sh). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long signals;
static double ns_per_signal;

static double thread_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* tgkill as an inline system call, so the signal interrupts this frame-pointer code rather
 * than glibc (built without frame pointers), and every walker sees the whole DEPTH. */
static inline void signal_self(long pid, long tid) {
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(234L), "D"(pid), "S"(tid), "d"((long)SIGPROF) : "rcx", "r11", "memory");
}

static int descend(int depth);
/* Called through a volatile pointer so that gcc cannot turn the recursion into a loop. */
static int (*volatile next_level)(int) = descend;

__attribute__((noinline)) static int descend(int depth) {
  if (depth > 1) return next_level(depth - 1) + 1;
  long pid = getpid(), tid = gettid();
  double start = thread_ns();
  for (long i = 0; i < signals; i++) signal_self(pid, tid);
  ns_per_signal = (thread_ns() - start) / signals;
  return 0;
}

static void empty_handler(int sig, siginfo_t *info, void *uc) { (void)sig; (void)info; (void)uc; }

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  int depth = atoi(argv[2]);
  signals = atol(argv[3]);
  void (*stop)(void) = NULL;
  if (!strcmp(argv[1], "none")) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = empty_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
  } else {
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      fprintf(stderr, "%s\n", dlerror());
      return 2;
    }
    int (*start)(const char *) = (int (*)(const char *))dlsym(lib, "ProfilerStart");
    stop = (void (*)(void))dlsym(lib, "ProfilerStop");
    const char *out = getenv("BENCH_PROFILE") ? getenv("BENCH_PROFILE") : "/tmp/handler_cost.prof";
    if (!start || !stop || !start(out)) return 3;
    if (getenv("BENCH_LABELS")) {
      /* Every sample carries a label set (cpuprof only): the handler's cost with labels on. */
      const void *(*intern)(const char *const *, int) =
          (const void *(*)(const char *const *, int))dlsym(lib, "CpuprofLabelsIntern");
      const void *(*swap)(const void *) = (const void *(*)(const void *))dlsym(lib, "CpuprofLabelsSwap");
      const char *kv[] = {"endpoint", "/bench"};
      if (!intern || !swap) return 3;
      swap(intern(kv, 1));
    }
  }
  descend(depth);
  if (stop) stop();
  printf("%.0f\n", ns_per_signal);
  return 0;
}
