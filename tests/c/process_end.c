/* Ends of a process that atexit does not see, for tests/process_end.rs.
 *   process_end exit SECONDS       burns SECONDS of CPU in burn_main, then exit(0)
 *   process_end _exit SECONDS      the same, then _exit(0)
 *   process_end sigterm            burns 1 s, then raises SIGTERM, whose handler calls _exit(3)
 *   process_end fork               burns 0.6 s; a forked child burns 0.4 s in burn_child and
 *                                  _exits; the parent waits and exits
 *   process_end vfork              vfork children that _exit and that exec /bin/true, around
 *                                  0.6 s of burning
 *   process_end allsig             burns 0.6 s, installs a handler for every signal 1..64
 *                                  (as Go does), burns 0.6 s in burn_after, exits
 *   process_end exec BLOCK         burns 0.6 s in burn_main with SIGUSR1 blocked (and, with
 *                                  BLOCK=all, every signal), then execs itself as "execd"
 *                                  without LD_PRELOAD
 *   process_end execd              (the exec'd image) prints the pending and blocked signals
 *   process_end execfail           burns 0.5 s in burn_main, fails to exec a missing file,
 *                                  burns 1 s in burn_after, exits
 *   process_end raise SIG S THREADS  burns S seconds of CPU in burn_main (with THREADS=2, a
 *                                  second thread burns in burn_child too), then raises SIG at
 *                                  its default action (SIGSEGV: a write through NULL),
 *                                  printing the process's CPU time first
 *   process_end spin THREADS       burns in burn_main (and burn_child) until killed
 *   process_end now                _exit(0) at once
 *   process_end system N           runs system("true") N times */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "common.h"

extern char **environ;
static volatile unsigned long sink;

#define BURNER(name)                                   \
  __attribute__((noinline)) static void name(double s) { \
    double end = thread_cpu() + s;                     \
    while (thread_cpu() < end)                         \
      for (int i = 0; i < 1000; i++) sink += i;        \
  }
BURNER(burn_main)
BURNER(burn_child)
BURNER(burn_after)

static void *child_burner(void *seconds) {
  burn_child(*(double *)seconds);
  return NULL;
}

/* Starts a second thread burning `seconds` in burn_child when `threads` is 2. */
static void second_burner(int threads, double *seconds) {
  pthread_t t;
  if (threads > 1) pthread_create(&t, NULL, child_burner, seconds);
}

static void on_sigterm(int sig) {
  (void)sig;
  _exit(3);
}

static int signal_handled;
static void own_handler(int sig) {
  (void)sig;
  signal_handled++;
}

/* Signals pending or blocked, as a list (ignoring none: the test compares with a plain run). */
static void print_set(const char *what, const sigset_t *set) {
  printf("%s", what);
  for (int s = 1; s < 65; s++)
    if (sigismember(set, s)) printf(" %d", s);
  printf("\n");
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  if (!strcmp(mode, "exit") || !strcmp(mode, "_exit")) {
    burn_main(argc > 2 ? atof(argv[2]) : 1.0);
    printf("done\n");
    fflush(stdout);
    if (!strcmp(mode, "_exit")) _exit(0);
    exit(0);
  } else if (!strcmp(mode, "sigterm")) {
    signal(SIGTERM, on_sigterm);
    burn_main(1.0);
    printf("raising\n");
    fflush(stdout);
    raise(SIGTERM);
    return 1;
  } else if (!strcmp(mode, "fork")) {
    burn_main(0.6);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
      burn_child(0.4);
      _exit(5);
    }
    int status;
    waitpid(child, &status, 0);
    printf("child exit %d\n", WEXITSTATUS(status));
    return 0;
  } else if (!strcmp(mode, "vfork")) {
    burn_main(0.3);
    int statuses = 0;
    for (int i = 0; i < 20; i++) {
      pid_t child = vfork();
      if (child == 0) _exit(7);
      int status;
      waitpid(child, &status, 0);
      statuses += WEXITSTATUS(status) == 7;
      child = vfork();
      if (child == 0) {
        char *args[] = {"true", NULL};
        execve("/bin/true", args, environ);
        _exit(9);
      }
      waitpid(child, &status, 0);
      statuses += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    burn_main(0.3);
    printf("children as expected %d of 40\n", statuses);
    return 0;
  } else if (!strcmp(mode, "allsig")) {
    burn_main(0.6);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sa.sa_flags = SA_RESTART;
    int installed = 0;
    for (int s = 1; s < 65; s++)
      if (s != SIGKILL && s != SIGSTOP) installed += sigaction(s, &sa, NULL) == 0;
    burn_after(0.6);
    printf("installed %d\n", installed);
    /* Signals of the profiler in flight before it noticed the takeover reach this handler. */
    fprintf(stderr, "own handler ran %d times\n", signal_handled);
    return 0;
  } else if (!strcmp(mode, "exec")) {
    sigset_t set;
    sigemptyset(&set);
    if (argc > 2 && !strcmp(argv[2], "all"))
      sigfillset(&set);
    else
      sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    burn_main(0.6);
    fflush(stdout);
    /* The new image runs without the profiler: a profiling signal reaching it would be
     * pending there (or kill it). */
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    char *args[] = {argv[0], "execd", NULL};
    execve("/proc/self/exe", args, env);
    printf("exec failed: %s\n", strerror(errno));
    return 1;
  } else if (!strcmp(mode, "execd")) {
    sigset_t pending, blocked;
    sigpending(&pending);
    sigprocmask(SIG_BLOCK, NULL, &blocked);
    print_set("pending:", &pending);
    print_set("blocked:", &blocked);
    return 0;
  } else if (!strcmp(mode, "raise") && argc > 4) {
    int sig = atoi(argv[2]);
    double seconds = atof(argv[3]);
    second_burner(atoi(argv[4]), &seconds);
    burn_main(seconds);
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    printf("cpu %.3f\n", cpu.tv_sec + cpu.tv_nsec / 1e9);
    fflush(stdout);
    if (sig == SIGSEGV) *(volatile int *)0 = 1;
    raise(sig);
    return 1;
  } else if (!strcmp(mode, "spin") && argc > 2) {
    double forever = 1e9;
    second_burner(atoi(argv[2]), &forever);
    burn_main(forever);
    return 1;
  } else if (!strcmp(mode, "now")) {
    _exit(0);
  } else if (!strcmp(mode, "system") && argc > 2) {
    int ok = 0, n = atoi(argv[2]);
    for (int i = 0; i < n; i++) ok += system("true") == 0;
    printf("%d of %d ran\n", ok, n);
    return 0;
  } else if (!strcmp(mode, "execfail")) {
    sigset_t before, after;
    sigemptyset(&before);
    sigemptyset(&after);
    sigprocmask(SIG_BLOCK, NULL, &before);
    burn_main(0.5);
    char *args[] = {"missing", NULL};
    int rc = execve("/nonexistent/missing", args, environ);
    int e = errno;
    sigprocmask(SIG_BLOCK, NULL, &after);
    int kept = 1;
    for (int s = 1; s < 65; s++) kept &= sigismember(&before, s) == sigismember(&after, s);
    printf("exec returned %d errno %s, mask kept %d\n", rc, strerror(e), kept);
    burn_after(1.0);
    return 0;
  }
  return 2;
}
