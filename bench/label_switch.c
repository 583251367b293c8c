/* The cost of switching labels (cpuprof::labels): CpuprofLabelsSwap to a set and back, N
 * times, against the same loop without the calls, in ns per switch (one call). The library is
 * loaded with dlopen (argv[1]), as a program linked with -lcpuprof calls it through the PLT.
 * Usage: label_switch LIBRARY N */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  long n = atol(argv[2]);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return 3;
  const void *(*intern)(const char *const *, int) =
      (const void *(*)(const char *const *, int))dlsym(lib, "CpuprofLabelsIntern");
  const void *(*swap)(const void *) = (const void *(*)(const void *))dlsym(lib, "CpuprofLabelsSwap");
  if (!intern || !swap) return 3;
  const char *kv[] = {"endpoint", "/bench"};
  const void *set = intern(kv, 1);
  double t0 = now();
  for (long i = 0; i < n; i++) sink += i;
  double t1 = now();
  for (long i = 0; i < n; i++) {
    const void *before = swap(set);
    sink += i;
    swap(before);
  }
  double t2 = now();
  printf("%.2f\n", ((t2 - t1) - (t1 - t0)) / (2.0 * n));
  return 0;
}
