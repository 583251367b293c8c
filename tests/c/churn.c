/* Thread churn: creates THREADS short-lived threads (a few at a time), then reports how many
 * POSIX timers and perf event fds the process holds against how many threads are alive, and
 * whether the application's own sigqueue still works (each leaked timer would hold a slot of
 * RLIMIT_SIGPENDING).
 *
 *   churn THREADS     prints "threads N", "timers N", "perf_fds N", "sigqueue_ok N/100" */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t received;

static void *short_life(void *arg) {
  (void)arg;
  for (int i = 0; i < 20000; i++) sink = sink * 31 + i;
  return NULL;
}

static int count_lines(const char *path, const char *prefix) {
  FILE *f = fopen(path, "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, prefix, strlen(prefix))) n++;
  if (f) fclose(f);
  return n;
}

static int count_dir(const char *path, const char *link_contains) {
  DIR *d = opendir(path);
  struct dirent *e;
  int n = 0;
  char p[512], target[256];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (!link_contains) { n++; continue; }
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    ssize_t len = readlink(p, target, sizeof target - 1);
    if (len > 0) { target[len] = 0; if (strstr(target, link_contains)) n++; }
  }
  if (d) closedir(d);
  return n;
}

static void on_usr(int sig) { (void)sig; received++; }

int main(int argc, char **argv) {
  int total = argc > 1 ? atoi(argv[1]) : 10000;
  for (int done = 0; done < total; done += 8) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, short_life, NULL);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  }
  usleep(100000); /* let the profiler's writer catch up with exits it polls for */
  printf("threads %d\ntimers %d\nperf_fds %d\n", count_dir("/proc/self/task", NULL), count_lines("/proc/self/timers", "ID:"),
         count_dir("/proc/self/fd", "perf_event"));
  signal(SIGRTMIN + 1, on_usr);
  int ok = 0;
  union sigval v = {.sival_int = 7};
  for (int i = 0; i < 100; i++) ok += sigqueue(getpid(), SIGRTMIN + 1, v) == 0;
  printf("sigqueue_ok %d/100 received %d\n", ok, (int)received);
  return 0;
}
