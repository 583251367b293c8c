/* Half of its CPU time in the kernel: reads of /dev/zero (the kernel clears the buffer)
 * between stretches of user-mode arithmetic.
 *
 *   kernel_time SECONDS   prints "cpu SECONDS" and "sys SECONDS" (getrusage) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 16];

static double cpu_seconds(struct timeval a, struct timeval b) {
  return a.tv_sec + a.tv_usec / 1e6 + b.tv_sec + b.tv_usec / 1e6;
}

__attribute__((noinline)) static void user_work(void) {
  volatile unsigned long x = 0;
  for (int i = 0; i < 3000; i++) x = x * 31 + i;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2;
  int fd = open("/dev/zero", O_RDONLY);
  if (fd < 0) return 2;
  struct rusage ru;
  do {
    for (int i = 0; i < 20; i++) {
      /* A signal handler that runs during the read (any profiler's) may cut it short. */
      if (read(fd, buf, sizeof buf) <= 0) return 3;
      user_work();
    }
    getrusage(RUSAGE_SELF, &ru);
  } while (cpu_seconds(ru.ru_utime, ru.ru_stime) < seconds);
  printf("cpu %.4f\nsys %.4f\n", cpu_seconds(ru.ru_utime, ru.ru_stime), ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
