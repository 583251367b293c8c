/* Processes that fork without exec (tests/forked_children.rs): prefork workers and the other
 * ways forked children live and end, each printing what the test checks against.
 *
 *   prefork N SECS END   the parent forks N workers that each burn SECS of CPU in
 *                        worker_burn and end by END: _exit, exit, return, sigterm (the default
 *                        action of SIGTERM, raised at itself) or abort; the parent waits for
 *                        them and prints "cpu SECONDS" (its own CPU time and its children's)
 *   exec SECS            a child burns SECS in before_exec (0: none) and execs /bin/true
 *   nested SECS          a child and its own child each burn SECS
 *   threads SECS         a child starts 2 threads that each burn SECS in thread_burn
 *   single               prints the threads in /proc/self/task, in the parent and in a forked
 *                        child, and whether unshare(CLONE_NEWUSER) works (it refuses a
 *                        multi-threaded caller)
 *   stacks SECS          burns SECS single-threaded through thousands of distinct call chains
 *   vforkreset SECS      a vfork child resets every handled signal to SIG_DFL (as CPython's
 *                        and posix_spawn's children do) and execs /bin/true; then the parent
 *                        burns SECS in child_burn
 *   termthread N SECS    N children, one after another, each burning SECS in worker_burn,
 *                        starting a thread and at once ending by SIGTERM's default action
 *                        (a writer thread starts as the signal comes)
 *   exitterm N           N children, one after another, each burning 50 ms in worker_burn and
 *                        calling _exit(0) with a SIGTERM due 100 us later (a pool's
 *                        `terminate` racing its worker's exit): plainly the exit always wins
 *   forkloop N           while a thread starts and joins threads without a pause (cpuprof's
 *                        locks taken all the time), forks N children that exit() at once;
 *                        prints "hung H" (children not ended within 2 s, then killed)
 */
#define _GNU_SOURCE
#include "cpu_deadline.h"
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile double sink;

/* Inlined into each named burner, so that the time is in that function's own frame (a call
 * in tail position would leave no frame of the burner for readers to find). */
__attribute__((always_inline)) static inline void spin(double seconds) {
  struct cpu_deadline d = cpu_deadline_in(seconds);
  double x = 0;
  while (!cpu_deadline_passed(&d))
    for (int i = 0; i < 20000; i++) x += i * 0.5;
  sink = x;
}

__attribute__((noinline)) void worker_burn(double seconds) { spin(seconds); }
__attribute__((noinline)) void before_exec(double seconds) { spin(seconds); }
__attribute__((noinline)) void child_burn(double seconds) { spin(seconds); }
__attribute__((noinline)) void grandchild_burn(double seconds) { spin(seconds); }

static double rusage_seconds(int who) {
  struct rusage ru;
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void wait_all(void) {
  int status;
  while (wait(&status) > 0) {
    if (WIFSIGNALED(status))
      printf("child signal %d\n", WTERMSIG(status));
    else
      printf("child exit %d\n", WEXITSTATUS(status));
  }
}

static void print_cpu(void) {
  printf("cpu %.3f\n", rusage_seconds(RUSAGE_SELF) + rusage_seconds(RUSAGE_CHILDREN));
}

static int prefork(int n, double seconds, const char *end) {
  fflush(stdout);
  for (int i = 0; i < n; i++) {
    if (fork() == 0) {
      worker_burn(seconds);
      if (!strcmp(end, "_exit")) _exit(0);
      if (!strcmp(end, "exit")) exit(0);
      if (!strcmp(end, "sigterm")) raise(SIGTERM);
      if (!strcmp(end, "abort")) {
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        abort();
      }
      return 0; /* "return": main returns */
    }
  }
  wait_all();
  print_cpu();
  return 0;
}

static void *thread_burn(void *seconds) {
  spin(*(double *)seconds);
  return NULL;
}

static int count_threads(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Thousands of distinct chains: the recursion's depth and the leaf vary with i. */
__attribute__((noinline)) static double leaf(int i) {
  double x = 0;
  for (int k = 0; k < 200; k++) x += (i ^ k) * 0.5;
  return x;
}
__attribute__((noinline)) static double branch_a(int depth, int i);
__attribute__((noinline)) static double branch_b(int depth, int i) {
  return depth == 0 ? leaf(i) : ((i >> depth) & 1 ? branch_a(depth - 1, i) : branch_b(depth - 1, i)) + 1;
}
__attribute__((noinline)) static double branch_a(int depth, int i) {
  return depth == 0 ? leaf(i) : ((i >> depth) & 1 ? branch_b(depth - 1, i) : branch_a(depth - 1, i)) + 1;
}

static volatile int churning = 1;

static void *nothing(void *arg) { return arg; }

static void *churn(void *arg) {
  (void)arg;
  while (churning) {
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
  }
  return NULL;
}

static void *sleeper(void *arg) {
  (void)arg;
  sleep(10);
  return NULL;
}

static int termthread(int n, double seconds) {
  fflush(stdout);
  for (int i = 0; i < n; i++) {
    pid_t c = fork();
    if (c == 0) {
      worker_burn(seconds);
      pthread_t t;
      pthread_create(&t, NULL, sleeper, NULL);
      raise(SIGTERM);
      _exit(1);
    }
    int status;
    waitpid(c, &status, 0);
    printf("child %s %d\n", WIFSIGNALED(status) ? "signal" : "exit",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
  return 0;
}

static int exitterm(int n) {
  fflush(stdout);
  for (int i = 0; i < n; i++) {
    pid_t c = fork();
    if (c == 0) {
      worker_burn(0.05);
      struct sigevent ev;
      memset(&ev, 0, sizeof ev);
      ev.sigev_notify = SIGEV_SIGNAL;
      ev.sigev_signo = SIGTERM;
      timer_t t;
      struct itimerspec soon = {{0, 0}, {0, 100000}};
      timer_create(CLOCK_MONOTONIC, &ev, &t);
      timer_settime(t, 0, &soon, NULL);
      _exit(0);
    }
    int status;
    waitpid(c, &status, 0);
    printf("child %s %d\n", WIFSIGNALED(status) ? "signal" : "exit",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
  return 0;
}

static int vforkreset(double seconds) {
  pid_t c = vfork();
  if (c == 0) {
    for (int s = 1; s < 65; s++) {
      struct sigaction old;
      if (sigaction(s, NULL, &old) == 0 && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(s, &dfl, NULL);
      }
    }
    execl("/bin/true", "true", (char *)NULL);
    _exit(127);
  }
  int status;
  waitpid(c, &status, 0);
  child_burn(seconds);
  printf("child exit %d\n", WEXITSTATUS(status));
  return 0;
}

static int forkloop(int n) {
  pthread_t churner;
  pthread_create(&churner, NULL, churn, NULL);
  int hung = 0;
  for (int i = 0; i < n; i++) {
    pid_t c = fork();
    if (c == 0) exit(0);
    int ended = 0;
    for (int k = 0; k < 400 && !ended; k++) {
      if (waitpid(c, NULL, WNOHANG) == c)
        ended = 1;
      else
        usleep(5000);
    }
    if (!ended) {
      hung++;
      kill(c, SIGKILL);
      waitpid(c, NULL, 0);
    }
  }
  churning = 0;
  pthread_join(churner, NULL);
  printf("hung %d\n", hung);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "prefork";
  double seconds = argc > 2 ? atof(argv[2]) : 1.0;
  if (!strcmp(mode, "prefork")) {
    int n = argc > 2 ? atoi(argv[2]) : 2;
    return prefork(n, argc > 3 ? atof(argv[3]) : 2.0, argc > 4 ? argv[4] : "_exit");
  }
  if (!strcmp(mode, "exec")) {
    fflush(stdout);
    if (fork() == 0) {
      if (seconds > 0) before_exec(seconds);
      execl("/bin/true", "true", (char *)NULL);
      _exit(127);
    }
    wait_all();
    return 0;
  }
  if (!strcmp(mode, "nested")) {
    fflush(stdout);
    if (fork() == 0) {
      if (fork() == 0) {
        grandchild_burn(seconds);
        _exit(0);
      }
      child_burn(seconds);
      wait_all();
      fflush(stdout);
      _exit(0);
    }
    wait_all();
    print_cpu();
    return 0;
  }
  if (!strcmp(mode, "threads")) {
    fflush(stdout);
    if (fork() == 0) {
      pthread_t t[2];
      for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_burn, &seconds);
      for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
      exit(0);
    }
    wait_all();
    print_cpu();
    return 0;
  }
  if (!strcmp(mode, "single")) {
    printf("parent threads %d\n", count_threads());
    fflush(stdout);
    if (fork() == 0) {
      printf("child threads %d\n", count_threads());
      printf("child unshare %s\n", unshare(CLONE_NEWUSER) == 0 ? "ok" : "refused");
      fflush(stdout);
      _exit(0);
    }
    wait_all();
    printf("parent threads %d\n", count_threads());
    return 0;
  }
  if (!strcmp(mode, "forkloop")) return forkloop(argc > 2 ? atoi(argv[2]) : 300);
  if (!strcmp(mode, "termthread")) return termthread(argc > 2 ? atoi(argv[2]) : 10, argc > 3 ? atof(argv[3]) : 0.2);
  if (!strcmp(mode, "vforkreset")) return vforkreset(seconds);
  if (!strcmp(mode, "exitterm")) return exitterm(argc > 2 ? atoi(argv[2]) : 20);
  if (!strcmp(mode, "stacks")) {
    struct cpu_deadline d = cpu_deadline_in(seconds);
    double x = 0;
    for (int i = 0; !cpu_deadline_passed(&d); i++) x += branch_a(6 + (i % 9), i);
    sink = x;
    print_cpu();
    return 0;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
