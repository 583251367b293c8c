#define _GNU_SOURCE
/* The platform's cost of a profiling signal, with no profiler: the same fixed work as
 * bench/overhead.c's unit, interrupted by a timer whose handler does nothing but what the
 * timer itself needs. cpuprof's cost per sample is the excess over this floor.
 *
 *   signal_floor MODE HZ UNITS
 *
 * MODE: "none" (no timer: the baseline), "posix" (a POSIX CPU timer of this thread: signals on the scheduler tick, with
 * overruns), or "perf" (a perf cpu-clock event, hrtimer-driven, re-armed each signal with
 * the calls cpuprof's handler makes: read the count, set the next period, refresh).
 * Prints "signals N". */
#include <fcntl.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int perf_fd = -1;
static uint64_t period_ns;
static volatile long signals;

static void on_signal(int sig, siginfo_t *info, void *uc) {
  (void)sig, (void)info, (void)uc;
  signals++;
  if (perf_fd >= 0) {
    uint64_t count;
    if (read(perf_fd, &count, sizeof count) < 0) return;
    ioctl(perf_fd, PERF_EVENT_IOC_PERIOD, &period_ns);
    ioctl(perf_fd, PERF_EVENT_IOC_REFRESH, 1);
  }
}

__attribute__((noinline)) static unsigned long leaf(unsigned long x) {
  for (int i = 0; i < 20000; i++) {
    x = x * 6364136223846793005UL + i;
    __asm__ volatile("" : "+r"(x));
  }
  return x;
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  long hz = atol(argv[2]), units = atol(argv[3]);
  period_ns = 1000000000 / hz;
  int sig = SIGRTMIN + 2;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(sig, &sa, NULL);
  if (!strcmp(argv[1], "posix")) {
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = sig;
    ev._sigev_un._tid = gettid();
    timer_t t;
    struct itimerspec its = {{0, (long)period_ns}, {0, (long)period_ns}};
    if (timer_create(CLOCK_THREAD_CPUTIME_ID, &ev, &t) || timer_settime(t, 0, &its, NULL)) return 3;
  } else if (!strcmp(argv[1], "perf")) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_period = period_ns;
    a.exclude_kernel = a.exclude_hv = a.disabled = 1;
    a.wakeup_events = 1;
    perf_fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    struct f_owner_ex owner = {F_OWNER_TID, gettid()};
    if (perf_fd < 0 || fcntl(perf_fd, F_SETOWN_EX, &owner) || fcntl(perf_fd, F_SETSIG, sig) ||
        fcntl(perf_fd, F_SETFL, O_ASYNC) || ioctl(perf_fd, PERF_EVENT_IOC_REFRESH, 1))
      return 3;
  } else if (strcmp(argv[1], "none")) {
    return 2;
  }
  unsigned long x = 1;
  for (long u = 0; u < units; u++)
    for (int k = 0; k < 110; k++) x ^= leaf(x + k);
  printf("signals %ld\nchecksum %lu\n", signals, x);
  return 0;
}
