/* Programs that own their signals and descriptors the way daemons do. Each mode prints what it
 * observed; the tests run it with and without the profiler and require the same output and
 * exit status.
 *
 *   hostile_fds sigwait       blocks SIGHUP/SIGUSR1/SIGTERM in every thread, takes them with
 *                             sigwait in a thread of its own; counts until SIGTERM
 *   hostile_fds signalfd      the same with a signalfd
 *   hostile_fds closerange D  close_range(3, ~0U), reopens its files in D (landing on the old
 *                             numbers), lets threads from before exit, writes known content,
 *                             passes data through a pipe, checks everything
 *   hostile_fds lowestfd      opens and closes a file for 2 s beside busy threads; counts opens
 *                             that did not return the lowest free number
 *   hostile_fds distinct S    S seconds over 4096 distinct call chains (a large profile)
 *   hostile_fds rmdir D       burns CPU, deletes every file in D and D itself, burns again
 *   hostile_fds dup2low L     opens its log L and dup2()s it onto fds 3..9 (a shell's exec 3>L),
 *                             writes known lines through fd 3 while burning CPU
 *   hostile_fds dup2all L     the same onto every fd from 3 to the soft RLIMIT_NOFILE - 1 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile int stop_workers;

static double clock_s(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void burn(double seconds) {
  double end = clock_s(CLOCK_THREAD_CPUTIME_ID) + seconds;
  while (clock_s(CLOCK_THREAD_CPUTIME_ID) < end)
    for (int i = 0; i < 10000; i++) sink = sink * 31 + i;
}

static void *worker(void *arg) {
  (void)arg;
  while (!stop_workers) burn(0.01);
  return NULL;
}

/* sigwait / signalfd */
static int use_signalfd;
static sigset_t owned;
static int hups, usr1s;

static void *signal_thread(void *arg) {
  (void)arg;
  int sfd = use_signalfd ? signalfd(-1, &owned, SFD_CLOEXEC) : -1;
  for (;;) {
    int sig;
    if (use_signalfd) {
      struct signalfd_siginfo si;
      if (read(sfd, &si, sizeof si) != sizeof si) continue;
      sig = si.ssi_signo;
    } else if (sigwait(&owned, &sig) != 0) {
      continue;
    }
    if (sig == SIGHUP) printf("hup %d\n", ++hups);
    if (sig == SIGUSR1) printf("usr1 %d\n", ++usr1s);
    if (sig == SIGTERM) {
      printf("term\n");
      fflush(stdout);
      return NULL;
    }
    fflush(stdout);
  }
}

static int daemon_mode(void) {
  sigemptyset(&owned);
  sigaddset(&owned, SIGHUP);
  sigaddset(&owned, SIGUSR1);
  sigaddset(&owned, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &owned, NULL);
  pthread_t w[2], s;
  for (int i = 0; i < 2; i++) pthread_create(&w[i], NULL, worker, NULL);
  pthread_create(&s, NULL, signal_thread, NULL);
  printf("ready\n");
  fflush(stdout);
  pthread_join(s, NULL);
  stop_workers = 1;
  for (int i = 0; i < 2; i++) pthread_join(w[i], NULL);
  printf("hups %d usr1s %d\n", hups, usr1s);
  return 0;
}

/* closerange */
#define FILES 8
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static void *exits_later(void *arg) {
  (void)arg;
  burn(0.02);
  pthread_mutex_lock(&gate); /* held by main until the files are reopened */
  pthread_mutex_unlock(&gate);
  return NULL;
}
static void *short_lived(void *arg) {
  (void)arg;
  burn(0.005);
  return NULL;
}

static int check_file(const char *path, const char *want) {
  char got[8192];
  int fd = open(path, O_RDONLY);
  ssize_t n = fd < 0 ? -1 : read(fd, got, sizeof got);
  if (fd >= 0) close(fd);
  return n == (ssize_t)strlen(want) && !memcmp(got, want, n);
}

static int closerange_mode(const char *dir) {
  pthread_t before[8], w;
  pthread_mutex_lock(&gate);
  for (int i = 0; i < 8; i++) pthread_create(&before[i], NULL, exits_later, NULL);
  pthread_create(&w, NULL, worker, NULL);
  burn(0.3);
  if (syscall(SYS_close_range, 3, ~0U, 0) != 0) {
    printf("close_range failed: %s\n", strerror(errno));
    return 1;
  }
  int fds[FILES], lowest_ok = 1;
  char path[4096], content[FILES][4096];
  for (int i = 0; i < FILES; i++) {
    snprintf(path, sizeof path, "%s/file%d.txt", dir, i);
    fds[i] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fds[i] != 3 + i) lowest_ok = 0;
  }
  int p[2];
  if (pipe(p) != 0 || p[0] != 3 + FILES) lowest_ok = 0;
  printf("reopened at the lowest numbers: %s\n", lowest_ok ? "yes" : "no");
  /* Threads from before the close_range exit now, and new ones come and go. */
  pthread_mutex_unlock(&gate);
  for (int i = 0; i < 8; i++) pthread_join(before[i], NULL);
  for (int round = 0; round < 20; round++) {
    pthread_t t;
    pthread_create(&t, NULL, short_lived, NULL);
    pthread_join(t, NULL);
  }
  for (int i = 0; i < FILES; i++) content[i][0] = 0;
  for (int line = 0; line < 40; line++) {
    for (int i = 0; i < FILES; i++) {
      char text[64];
      int len = snprintf(text, sizeof text, "file %d line %d\n", i, line);
      if (write(fds[i], text, len) != len) printf("write to file %d failed: %s\n", i, strerror(errno));
      strcat(content[i], text);
    }
    char msg[32], back[32];
    int len = snprintf(msg, sizeof msg, "pipe message %d", line);
    if (write(p[1], msg, len) != len || read(p[0], back, sizeof back) != len || memcmp(msg, back, len))
      printf("pipe message %d lost\n", line);
    burn(0.04); /* 1.6 s in all: the profiler's writer ticks and harvests meanwhile */
  }
  stop_workers = 1;
  pthread_join(w, NULL);
  int intact = 0;
  for (int i = 0; i < FILES; i++) {
    if (close(fds[i]) != 0) printf("file %d was closed behind our back\n", i);
    snprintf(path, sizeof path, "%s/file%d.txt", dir, i);
    intact += check_file(path, content[i]);
  }
  printf("files intact %d of %d\n", intact, FILES);
  return 0;
}

/* lowestfd */
static int lowestfd_mode(void) {
  pthread_t w[2];
  for (int i = 0; i < 2; i++) pthread_create(&w[i], NULL, worker, NULL);
  burn(0.2); /* threads announced and armed before the count starts */
  int expected = 0;
  while (fcntl(expected, F_GETFD) != -1) expected++;
  long violations = 0;
  double end = clock_s(CLOCK_MONOTONIC) + 2.0;
  while (clock_s(CLOCK_MONOTONIC) < end) {
    for (int i = 0; i < 1000; i++) {
      int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd != expected) violations++;
      close(fd);
    }
  }
  stop_workers = 1;
  for (int i = 0; i < 2; i++) pthread_join(w[i], NULL);
  printf("lowest-free violations %ld\n", violations);
  return 0;
}

/* distinct: chains through 12 levels of two functions each, one of 4096 paths per call */
static int (*volatile left_ptr)(int, unsigned);
static int (*volatile right_ptr)(int, unsigned);
__attribute__((noinline)) static int step(int depth, unsigned path) {
  if (depth == 0) {
    for (int i = 0; i < 3000; i++) sink = sink * 31 + i;
    return 0;
  }
  return ((path & 1) ? right_ptr : left_ptr)(depth - 1, path >> 1) + 1;
}
__attribute__((noinline)) static int step_left(int depth, unsigned path) { return step(depth, path) + 1; }
__attribute__((noinline)) static int step_right(int depth, unsigned path) { return step(depth, path) + 2; }

static int distinct_mode(double seconds) {
  left_ptr = step_left;
  right_ptr = step_right;
  unsigned path = 0;
  double end = clock_s(CLOCK_PROCESS_CPUTIME_ID) + seconds;
  while (clock_s(CLOCK_PROCESS_CPUTIME_ID) < end) step(12, path++ * 2654435761u >> 20);
  printf("distinct done\n");
  return 0;
}

/* rmdir */
static int rmdir_mode(const char *dir) {
  burn(0.5);
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[4096];
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  printf("rmdir %s\n", rmdir(dir) == 0 ? "ok" : strerror(errno));
  burn(0.5);
  return 0;
}

/* dup2low / dup2all */
static int dup2_mode(const char *log, int all) {
  pthread_t w;
  pthread_create(&w, NULL, worker, NULL);
  burn(0.2);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  struct rlimit lim;
  getrlimit(RLIMIT_NOFILE, &lim);
  int last = all ? (int)lim.rlim_cur - 1 : 9;
  for (int n = 3; n <= last; n++)
    if (n != fd) dup2(fd, n);
  if (fd != 3) close(fd);
  for (int line = 0; line < 30; line++) {
    char text[64];
    int len = snprintf(text, sizeof text, "log line %d\n", line);
    if (write(3, text, len) != len) printf("log write failed: %s\n", strerror(errno));
    burn(0.04);
  }
  stop_workers = 1;
  pthread_join(w, NULL);
  printf("logged\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const char *arg = argc > 2 ? argv[2] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(mode, "sigwait") || !strcmp(mode, "signalfd")) {
    use_signalfd = !strcmp(mode, "signalfd");
    return daemon_mode();
  }
  if (!strcmp(mode, "closerange")) return closerange_mode(arg);
  if (!strcmp(mode, "lowestfd")) return lowestfd_mode();
  if (!strcmp(mode, "distinct")) return distinct_mode(atof(arg));
  if (!strcmp(mode, "rmdir")) return rmdir_mode(arg);
  if (!strcmp(mode, "dup2low")) return dup2_mode(arg, 0);
  if (!strcmp(mode, "dup2all")) return dup2_mode(arg, 1);
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
