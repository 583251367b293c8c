/* Workloads for tests/build_ids.rs (build-ids recorded in profiles).
 *
 *   build_ids hot SECONDS               burn CPU in hot_a (3 parts) and hot_b (1 part)
 *   build_ids dlopen LIBRARY SECONDS    dlopen LIBRARY, burn SECONDS in its plugin_burn,
 *                                       dlclose it, delete the file, burn SECONDS in main
 *   build_ids truncated COPY SECONDS    copy this executable to COPY, map the copy as code,
 *                                       truncate the copy to 0 bytes (its pages now fault with
 *                                       SIGBUS), then burn SECONDS
 *
 * Built with -DVARIANT for a "rebuilt" binary with different code. Prints "ok" at the end
 * (and nothing that depends on timing), so runs with and without the profiler compare. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include "cpu_deadline.h"
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((always_inline)) static inline unsigned long burn(unsigned long n) {
  unsigned long x = n;
  for (unsigned long i = 0; i < n; i++) {
#ifdef VARIANT
    x = x * 2862933555777941757UL + 3037000493UL + i;
#else
    x = x * 6364136223846793005UL + i;
#endif
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

__attribute__((noinline)) void hot_a(unsigned long n) { sink += burn(3 * n); }
__attribute__((noinline)) void hot_b(unsigned long n) { sink += burn(n); }

static void burn_for(double seconds) {
  struct cpu_deadline deadline = cpu_deadline_in(seconds);
  while (!cpu_deadline_passed(&deadline)) {
    hot_a(100000);
    hot_b(100000);
  }
}

static int copy_file(const char *from, const char *to) {
  int in = open(from, O_RDONLY), out = open(to, O_RDWR | O_CREAT | O_TRUNC, 0755);
  char buf[65536];
  ssize_t n;
  if (in < 0 || out < 0) return -1;
  while ((n = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, n) != n) return -1;
  close(in);
  return n < 0 ? -1 : out;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  if (argv[1][0] == 'h') {
    burn_for(atof(argv[2]));
  } else if (argv[1][0] == 'd' && argc >= 4) {
    void *handle = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!handle) return 3;
    void (*plugin_burn)(double) = (void (*)(double))dlsym(handle, "plugin_burn");
    if (!plugin_burn) return 4;
    plugin_burn(atof(argv[3]));
    dlclose(handle);
    if (unlink(argv[2]) != 0) return 5;
    burn_for(atof(argv[3]));
  } else if (argv[1][0] == 't' && argc >= 4) {
    int fd = copy_file("/proc/self/exe", argv[2]);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return 6;
    void *code = mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    if (code == MAP_FAILED) return 7;
    if (ftruncate(fd, 0) != 0) return 8;
    close(fd);
    burn_for(atof(argv[3]));
  } else {
    return 2;
  }
  printf("ok\n");
  return 0;
}
