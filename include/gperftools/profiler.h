/* cpuprof: the CPU profiler API of gperftools' <gperftools/profiler.h>, implemented by
 * libcpuprof.so. Programs written for gperftools compile unchanged against this header and
 * link with -lcpuprof instead of -lprofiler. */
#ifndef CPUPROF_GPERFTOOLS_PROFILER_H_
#define CPUPROF_GPERFTOOLS_PROFILER_H_

#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Options for ProfilerStartWithOptions. Zero-initialise it before setting fields. */
struct ProfilerOptions {
  /* Called inside the profiling signal handler on the interrupted thread: the sample is kept
   * only if it returns non-zero. Must be async-signal-safe. NULL keeps every sample. */
  int (*filter_in_thread)(void *arg);
  void *filter_in_thread_arg;
};

/* Starts profiling into fname. Returns 1 on success, 0 if a profile is already running or the
 * file cannot be created (the reason is printed on stderr). */
int ProfilerStartWithOptions(const char *fname, const struct ProfilerOptions *options);
int ProfilerStart(const char *fname);

/* Stops profiling and completes the file (trailer and mapped objects). */
void ProfilerStop(void);

/* Writes what has been sampled so far to the file. */
void ProfilerFlush(void);

/* Deprecated; do nothing, as in gperftools. */
void ProfilerEnable(void);
void ProfilerDisable(void);

/* Non-zero while profiling with a timer that samples every thread. */
int ProfilingIsEnabledForAllThreads(void);

/* Declares the calling thread to the profiler. */
void ProfilerRegisterThread(void);

struct ProfilerState {
  int enabled;             /* non-zero while profiling */
  time_t start_time;       /* when profiling started */
  char profile_name[1024]; /* file being written */
  int samples_gathered;    /* samples so far */
};
void ProfilerGetCurrentState(struct ProfilerState *state);

/* Stack of the caller, or of the signal context uc (a ucontext_t *) when not NULL, skipping
 * skip_count frames. Returns the number of return addresses stored in result. */
int ProfilerGetStackTrace(void **result, int max_depth, int skip_count, const void *uc);

#ifdef __cplusplus
}
#endif

#endif /* CPUPROF_GPERFTOOLS_PROFILER_H_ */
