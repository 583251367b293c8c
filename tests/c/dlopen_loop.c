/* Loads a library, burns CPU in it, unloads it, many times over, while being profiled.
 *
 *   dlopen_loop LIBRARY CYCLES SECONDS_PER_CYCLE [single]
 * Prints "rss_early KB" (after 5 cycles), "rss_late KB" (at the end) and "ok". An idle thread
 * runs beside unless "single" is given (a process with a thread of its own has cpuprof's
 * writer thread, which refreshes the unwinder's snapshot when objects are loaded). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long rss_kb(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f) fclose(f);
  return resident * 4;
}

__attribute__((noinline)) static void run_cycle(const char *library, double seconds) {
  void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    exit(2);
  }
  void (*burn)(double) = (void (*)(double))dlsym(handle, "plugin_burn");
  burn(seconds);
  dlclose(handle);
}

static void *idle(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  if (argc < 5 || strcmp(argv[4], "single") != 0) {
    pthread_t t;
    pthread_create(&t, NULL, idle, NULL);
  }
  int cycles = atoi(argv[2]);
  double seconds = atof(argv[3]);
  for (int i = 0; i < cycles; i++) {
    run_cycle(argv[1], seconds);
    if (i == 4) printf("rss_early %ld\n", rss_kb());
  }
  printf("rss_late %ld\nok\n", rss_kb());
  return 0;
}
