/* Deadlines in CPU time for the known-answer workloads, checked without reading the CPU clock
 * after every round of work.
 *
 * Reading one's own CPU clock is a system call that brings the thread's run time up to date in
 * the scheduler, which may find its slice used up and preempt it at the call's return, between
 * two ticks. On a loaded CPU a loop that reads it after every round then runs in slices that
 * begin at a round's start, and every tick-driven CPU timer (per-thread POSIX timers, setitimer)
 * samples what a round runs first less than what it runs last: hot_a 67-72 % for 75 %
 * (docs/DESIGN.md, "Timers"). So the CPU clock is read at most every 20 ms of wall time, timed
 * by the monotonic clock (vDSO: no system call). CPUPROF_ROUND_CLOCK=1 reads it after every
 * round, to reproduce the bias. */
#ifndef CPU_DEADLINE_H
#define CPU_DEADLINE_H
#include <stdlib.h>
#include <time.h>

struct cpu_deadline {
  clockid_t clock;
  double end;
  double next_read;
  int every_round;
};

static inline double cpu_deadline_clock(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A deadline `seconds` of `clock` (a CPU clock) from now. */
static inline struct cpu_deadline cpu_deadline_in(clockid_t clock, double seconds) {
  struct cpu_deadline d = {clock, cpu_deadline_clock(clock) + seconds, 0.0,
                           getenv("CPUPROF_ROUND_CLOCK") != NULL};
  return d;
}

/* Whether the deadline has passed; at most 20 ms of wall time late. */
static inline int cpu_deadline_passed(struct cpu_deadline *d) {
  if (!d->every_round) {
    double now = cpu_deadline_clock(CLOCK_MONOTONIC);
    if (now < d->next_read) return 0;
    d->next_read = now + 0.02;
  }
  return cpu_deadline_clock(d->clock) >= d->end;
}
#endif
