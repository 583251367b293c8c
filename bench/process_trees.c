/* Workloads of bench/process_trees.py: process trees the profiler follows.
 *   exec N       spawns /bin/true N times (fork + exec), one at a time
 *   fork N       forks N children that exit() at once, one at a time
 *   prefork S    forks 2 workers that each burn S seconds of CPU, and waits */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void burn(double seconds) {
  double end = cpu_now() + seconds, x = 0;
  while (cpu_now() < end)
    for (int i = 0; i < 100000; i++) x += i * 0.5;
  sink = x;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int status;
  if (!strcmp(argv[1], "exec")) {
    for (int i = 0; i < atoi(argv[2]); i++) {
      pid_t p = fork();
      if (p == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
      }
      waitpid(p, &status, 0);
    }
  } else if (!strcmp(argv[1], "fork")) {
    for (int i = 0; i < atoi(argv[2]); i++) {
      pid_t p = fork();
      if (p == 0) exit(0);
      waitpid(p, &status, 0);
    }
  } else if (!strcmp(argv[1], "prefork")) {
    for (int i = 0; i < 2; i++)
      if (fork() == 0) {
        burn(atof(argv[2]));
        _exit(0);
      }
    while (wait(&status) > 0) {
    }
  }
  return 0;
}
