#define _GNU_SOURCE
/* Time to stop and write a profile holding many distinct stacks.
 *
 *   distinct_stacks LIBRARY PATH BITS
 *
 * LIBRARY (gperftools' libprofiler.so or libcpuprof.so) is loaded with dlopen and profiles
 * into PATH. The program then sends itself SIGPROF once from each of 2^BITS distinct stacks
 * (a chain of BITS calls, each through one of two functions), so the profile holds 2^BITS
 * distinct call chains of BITS + 3 frames. Run it with the process timer on SIGPROF at a low
 * frequency (CPUPROFILE_TIMER=itimer, CPUPROFILE_FREQUENCY=1) so that nearly every sample is
 * one of ours. Prints "sampling_ms" (the 2^BITS signals) and "stop_ms" (ProfilerStop: the
 * final harvest, the writes and the maps). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long pid, tid;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* tgkill as an inline system call, so the signal interrupts this frame-pointer code. */
static inline void signal_self(void) {
  long ret;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(234L), "D"(pid), "S"(tid), "d"((long)SIGPROF) : "rcx", "r11", "memory");
}

static void step(unsigned long bits, int level);

/* The empty asm after each call keeps it from being a tail call, so every level keeps a frame
 * and the return address says which way the path went. */
__attribute__((noinline)) static void zero(unsigned long bits, int level) {
  step(bits, level);
  __asm__ volatile("");
}
__attribute__((noinline)) static void one(unsigned long bits, int level) {
  step(bits, level);
  __asm__ volatile("");
}

static void step(unsigned long bits, int level) {
  if (level == 0)
    signal_self();
  else if (bits & 1)
    one(bits >> 1, level - 1);
  else
    zero(bits >> 1, level - 1);
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  int (*start)(const char *) = (int (*)(const char *))dlsym(lib, "ProfilerStart");
  void (*stop)(void) = (void (*)(void))dlsym(lib, "ProfilerStop");
  if (!start || !stop || !start(argv[2])) return 3;
  int bits = atoi(argv[3]);
  pid = getpid();
  tid = gettid();
  double t0 = now_ms();
  for (unsigned long path = 0; path < 1UL << bits; path++) step(path, bits);
  double t1 = now_ms();
  stop();
  double t2 = now_ms();
  printf("sampling_ms %.1f\nstop_ms %.1f\n", t1 - t0, t2 - t1);
  return 0;
}
