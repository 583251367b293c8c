/* Deferred cancellation of threads blocked in the cancellation points that libcpuprof.so
 * interposes: sigwait, sigwaitinfo, sigtimedwait, ppoll, pselect, epoll_pwait, epoll_pwait2,
 * sigsuspend; and in read(2) on a signalfd (interposed: signalfd; not a cancellation point
 * itself) for comparison. Each thread pushes a cleanup handler, says it is about to block, and
 * blocks for good; the main thread waits until the kernel shows it asleep, cancels it, joins it
 * and checks that it ended cancelled with its cleanup handler run. glibc unwinds the thread from
 * inside the call, through whatever frames lie between the system call and the program.
 *
 *   cancel_points [ROUNDS]   every call ROUNDS times (default 3)
 *
 * Prints one line per call; exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum call {
  SIGWAIT,
  SIGWAITINFO,
  SIGTIMEDWAIT,
  PPOLL,
  PSELECT,
  EPOLL_PWAIT,
  EPOLL_PWAIT2,
  SIGSUSPEND,
  SIGNALFD_READ,
  CALLS
};
static const char *names[CALLS] = {"sigwait",     "sigwaitinfo",  "sigtimedwait",
                                   "ppoll",       "pselect",      "epoll_pwait",
                                   "epoll_pwait2", "sigsuspend",  "signalfd read"};

static volatile unsigned long sink;
static volatile pid_t blocker_tid;
static volatile int cleaned_up;

static void cleanup(void *arg) {
  int *fds = arg;
  for (int i = 0; i < 4; i++) close(fds[i]);
  cleaned_up = 1;
}

static void *blocker(void *arg) {
  enum call call = (enum call)(long)arg;
  /* A little computation first, so that profiling signals come to this thread too. */
  for (int i = 0; i < 2000000; i++) sink = sink * 31 + i;
  sigset_t usr2, all;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &usr2, NULL); /* nobody sends it: the waits never end */
  int fds[4];
  if (pipe(fds) != 0) return NULL;
  int *pipefd = fds;
  int ep = fds[2] = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = pipefd[0]};
  epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[0], &ev);
  int sfd = fds[3] = signalfd(-1, &usr2, 0);
  pthread_cleanup_push(cleanup, fds);
  __atomic_store_n(&blocker_tid, gettid(), __ATOMIC_RELEASE);
  int sig;
  siginfo_t info;
  struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
  fd_set readable;
  FD_ZERO(&readable);
  FD_SET(pipefd[0], &readable);
  struct epoll_event got;
  struct signalfd_siginfo si;
  int r = -1;
  switch (call) {
  case SIGWAIT:
    r = sigwait(&usr2, &sig);
    break;
  case SIGWAITINFO:
    r = sigwaitinfo(&usr2, &info);
    break;
  case SIGTIMEDWAIT:
    r = sigtimedwait(&usr2, &info, NULL);
    break;
  case PPOLL:
    r = ppoll(&pfd, 1, NULL, &all);
    break;
  case PSELECT:
    r = pselect(pipefd[0] + 1, &readable, NULL, NULL, NULL, &all);
    break;
  case EPOLL_PWAIT:
    r = epoll_pwait(ep, &got, 1, -1, &all);
    break;
  case EPOLL_PWAIT2:
    r = epoll_pwait2(ep, &got, 1, NULL, &all);
    break;
  case SIGSUSPEND:
    r = sigsuspend(&all);
    break;
  case SIGNALFD_READ:
    r = read(sfd, &si, sizeof si);
    break;
  default:
    break;
  }
  printf("%s returned %d (%s)\n", names[call], r, strerror(errno));
  pthread_cleanup_pop(0);
  return NULL;
}

/* Whether thread `tid` of this process is asleep (state S in its stat line). */
static int asleep(pid_t tid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int sleeping = 0;
  if (fgets(line, sizeof line, f)) {
    char *end = strrchr(line, ')');
    sleeping = end && end[1] == ' ' && end[2] == 'S';
  }
  fclose(f);
  return sleeping;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 3, failures = 0;
  for (int c = 0; c < CALLS; c++) {
    int ok = 0;
    for (int i = 0; i < rounds; i++) {
      pthread_t t;
      blocker_tid = 0;
      cleaned_up = 0;
      pthread_create(&t, NULL, blocker, (void *)(long)c);
      pid_t tid;
      while (!(tid = __atomic_load_n(&blocker_tid, __ATOMIC_ACQUIRE))) sched_yield();
      struct timespec pause = {0, 1000000};
      while (!asleep(tid)) nanosleep(&pause, NULL);
      nanosleep(&pause, NULL);
      pthread_cancel(t);
      void *result;
      pthread_join(t, &result);
      ok += result == PTHREAD_CANCELED && cleaned_up;
    }
    printf("%s: %d of %d cancelled, cleanup run\n", names[c], ok, rounds);
    failures += ok != rounds;
  }
  fflush(stdout);
  return failures != 0;
}
