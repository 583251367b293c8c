/* Deadlines in CPU time for the known-answer workloads, checked without the system call that
 * reading a CPU clock is.
 *
 * Reading one's own CPU clock (clock_gettime of a CPU-time clock, getrusage(RUSAGE_SELF))
 * brings the thread's run time up to date in the scheduler, which may find its slice used up
 * and preempt it at that call's return, between two ticks. A loop that does so at the end of
 * its rounds, on a loaded CPU, then has its slices begin and end at round boundaries in a way
 * that tick-driven CPU timers (per-thread POSIX timers, setitimer) sample unevenly: hot_a
 * 67-72 % for 75 % reading the clock every round, 81.7 % reading it every 1.6 ms
 * (docs/DESIGN.md, "Timers"). getrusage(RUSAGE_THREAD) reports the thread's run time as of its
 * last tick or switch without updating it (a few ms stale, which a deadline can afford), so the
 * loop's only preemptions are the scheduler's own, at ticks. CPUPROF_ROUND_CLOCK=1 reads the
 * thread's CPU clock instead, to reproduce the bias. */
#ifndef CPU_DEADLINE_H
#define CPU_DEADLINE_H
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#ifndef RUSAGE_THREAD
#define RUSAGE_THREAD 1 /* Linux's value; <sys/resource.h> names it under _GNU_SOURCE only */
#endif

struct cpu_deadline {
  double end;
  int exact_clock;
};

/* The calling thread's CPU time in seconds: as of its last tick or switch, or exact. */
static inline double cpu_deadline_now(int exact_clock) {
  if (exact_clock) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
  }
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* A deadline `seconds` of the calling thread's CPU time from now. */
static inline struct cpu_deadline cpu_deadline_in(double seconds) {
  int exact_clock = getenv("CPUPROF_ROUND_CLOCK") != NULL;
  struct cpu_deadline d = {cpu_deadline_now(exact_clock) + seconds, exact_clock};
  return d;
}

/* Whether the deadline has passed (a few ms late at most). */
static inline int cpu_deadline_passed(const struct cpu_deadline *d) {
  return cpu_deadline_now(d->exact_clock) >= d->end;
}
#endif
