/* A daemon in systemd's way: it blocks every signal with sigprocmask(sigfillset) and takes
 * them from a signalfd whose mask is the full set. Any signal it did not expect shuts it down,
 * as such daemons do ("unexpected signal N", exit 1).
 *
 *   signalfd_daemon       a worker created before the block computes for 0.1 s of CPU, with
 *                         only the daemon's own signals blocked (a library's thread pool).
 *                         Once it has ended, a sender thread (every signal blocked, inherited)
 *                         sends SIGHUP and SIGUSR1 to the process, one at a time, each
 *                         acknowledged, and SIGTERM last. The main thread computes a little for
 *                         each signal (a "reload") with every signal blocked. For the first
 *                         half it waits with epoll_wait on the non-blocking signalfd; then it
 *                         changes the fd's mask with signalfd(fd, full set, 0) (a new
 *                         configuration), makes the fd blocking and waits in read(2).
 *
 * Built with -DUSE_API (and -lcpuprof), it starts profiling itself into $DAEMON_PROFILE with
 * ProfilerStart once its signalfd exists, and stops before printing.
 *
 * Prints the counts of each signal taken; exits 0 after SIGTERM. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#define BURN_SECONDS
#include "common.h"
#ifdef USE_API
#include <gperftools/profiler.h>
#endif

#define SIGNALS 40

static sem_t taken, worker_done;

__attribute__((noinline)) static void worker_compute(void) { burn(0.1); }

__attribute__((noinline)) static void reload(void) { burn(0.003); }

static void *worker(void *arg) {
  (void)arg;
  sigset_t owned;
  sigemptyset(&owned);
  sigaddset(&owned, SIGHUP);
  sigaddset(&owned, SIGUSR1);
  sigaddset(&owned, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &owned, NULL);
  worker_compute();
  sem_post(&worker_done);
  return NULL;
}

static void *sender(void *arg) {
  (void)arg;
  while (sem_wait(&worker_done) != 0) {
  }
  for (int i = 0; i < SIGNALS; i++) {
    burn(0.001);
    kill(getpid(), i % 2 ? SIGUSR1 : SIGHUP);
    while (sem_wait(&taken) != 0) {
    }
  }
  kill(getpid(), SIGTERM);
  return NULL;
}

static void fail(const char *what) {
  printf("%s: %s\n", what, strerror(errno));
  exit(2);
}

int main(void) {
  pthread_t w, s;
  sem_init(&taken, 0, 0);
  sem_init(&worker_done, 0, 0);
  /* The worker starts before the block: the signals it does not block itself stay unblocked. */
  pthread_create(&w, NULL, worker, NULL);

  sigset_t all;
  sigfillset(&all);
  if (sigprocmask(SIG_BLOCK, &all, NULL) != 0) fail("sigprocmask");
  int sfd = signalfd(-1, &all, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) fail("signalfd");
#ifdef USE_API
  const char *profile = getenv("DAEMON_PROFILE");
  if (profile && !ProfilerStart(profile)) fail("ProfilerStart");
#endif
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = sfd};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev) != 0) fail("epoll");
  pthread_create(&s, NULL, sender, NULL); /* inherits the full mask */

  int hups = 0, usr1s = 0, polling = 1;
  for (;;) {
    if (polling) {
      struct epoll_event got;
      int n = epoll_wait(ep, &got, 1, -1);
      if (n < 0 && errno == EINTR) {
        printf("epoll_wait: EINTR\n");
        return 1;
      }
      if (n != 1) fail("epoll_wait");
    }
    struct signalfd_siginfo si;
    ssize_t r = read(sfd, &si, sizeof si);
    if (r < 0 && errno == EAGAIN) {
      if (!polling) fail("blocking read");
      continue; /* readiness without a signal */
    }
    if (r != sizeof si) fail("read");
    switch (si.ssi_signo) {
    case SIGHUP:
      hups++;
      reload();
      break;
    case SIGUSR1:
      usr1s++;
      reload();
      break;
    case SIGTERM:
      pthread_join(s, NULL);
      pthread_join(w, NULL);
#ifdef USE_API
      if (profile) ProfilerStop();
#endif
      printf("hups %d usr1s %d\n", hups, usr1s);
      return 0;
    default:
      printf("unexpected signal %u\n", si.ssi_signo);
      return 1;
    }
    if (polling && hups + usr1s == SIGNALS / 2) {
      /* A new configuration: the same fd, its mask set again, now read blocking. */
      if (signalfd(sfd, &all, 0) != sfd) fail("signalfd again");
      if (fcntl(sfd, F_SETFL, fcntl(sfd, F_GETFL) & ~O_NONBLOCK) != 0) fail("fcntl");
      polling = 0;
    }
    sem_post(&taken);
  }
}
