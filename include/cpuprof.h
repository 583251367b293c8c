/* cpuprof extensions to gperftools' profiler.h (link -lcpuprof). */
#ifndef CPUPROF_H_
#define CPUPROF_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Starts an HTTP endpoint in this process serving CPU profiles on demand:
 *   GET  /pprof/profile?seconds=N        raw gperftools profile (google-pprof, go tool pprof)
 *   GET  /debug/pprof/profile?seconds=N  gzipped pprof protobuf (go tool pprof, Parca, Pyroscope)
 *   GET|POST /pprof/symbol, GET /pprof/cmdline  pprof's remote-server protocol
 * `address` is "port", ":port" or "host:port"; a bare port binds 127.0.0.1 only. Port 0 picks
 * a free port. Returns the port bound, or -1 (the reason is printed on stderr). Like setting
 * CPUPROF_HTTP=address in the environment, for this process only: the variable also gives the
 * programs this one execs the port once it is free (see README, "Process trees"). Every answer
 * names the process in an X-Cpuprof-Pid header. */
int CpuprofServeHttp(const char *address);

/* Starts profiling in epoch mode (continuous profiling): every `epoch_seconds` (<= 0: the
 * CPUPROFILE_EPOCH variable, else 600; fractions allowed) the samples of the epoch just ended
 * become one complete gperftools profile, database/<epoch start UTC>/<program>.<pid>.prof,
 * written under a temporary name and renamed into place. The budget comes from
 * CPUPROFILE_DB_MAX_BYTES and CPUPROFILE_DB_MAX_AGE. Stop with ProfilerStop (which completes
 * the last epoch). Returns 1 on success, 0 if already profiling or on error (on stderr).
 * The same as setting CPUPROFILE_DB=database in the environment. */
int CpuprofStartDatabase(const char *database, double epoch_seconds);

/* Starts a wall-clock profile of every thread into `wall_fname`: `frequency` samples per
 * second of wall time (<= 0: the CPUPROFILE_WALL_FREQUENCY variable, else 100; at most 1000)
 * of each thread, running, runnable or blocked, each labelled with its thread and state
 * (cpuprof top splits functions by state; convert --to pprof gives the labels). Blocked
 * threads are never signalled, so their calls never fail with EINTR. If `cpu_fname` is not
 * NULL, the CPU profile (at CPUPROFILE_FREQUENCY) is written there in the same run. Stop with
 * ProfilerStop. Returns 1 on success, 0 if already profiling or on error (on stderr). The same
 * as setting CPUPROFILE_WALL (and CPUPROFILE) in the environment. */
int CpuprofStartWall(const char *wall_fname, int frequency, const char *cpu_fname);

/* Labels on samples: which endpoint, tenant or trace the CPU time went to. A label set is
 * interned once and immutable, valid for the process's life; installing one on a thread is a
 * load and a store, and every sample the thread takes meanwhile carries it (cpuprof top --by
 * KEY, --tagfocus KEY=VALUE; go tool pprof -tags on the converted profile). */
typedef struct CpuprofLabels CpuprofLabels;

/* The set of `pairs` key/value pairs in `keys_and_values` = { key0, value0, key1, value1, ... }
 * (a later key replaces an earlier equal one; a NULL string reads as ""). The same pairs give
 * the same set. At most 16384 distinct sets per process (beyond: one set
 * cpuprof.labels=over-cap, counted), 16 pairs per set, keys of 64 bytes and values of 256 (cut
 * beyond, counted). Takes a lock: intern sets once, ahead of the hot path. NULL on a bad
 * argument (the reason on stderr). */
const CpuprofLabels *CpuprofLabelsIntern(const char *const keys_and_values[], int pairs);

/* Installs `set` (NULL: no labels) on the calling thread and returns the set installed before,
 * so that scopes nest:  const CpuprofLabels *prev = CpuprofLabelsSwap(set); ...;
 * CpuprofLabelsSwap(prev);  Async-signal-safe. */
const CpuprofLabels *CpuprofLabelsSwap(const CpuprofLabels *set);

/* Starts a contention profile (docs/CONTENTION.md): the waits of threads that block in
 * pthread_mutex_lock, the reader-writer locks, semaphores and futex waits, one sampled per
 * `period_ns` nanoseconds waited on average (0: the default, 1 ms), charged to the waiter's
 * call chain; written to `fname` by CpuprofStopContention or at exit, in the format
 * google-pprof and go tool pprof read, and the same waiting charged to the threads that held
 * the locks (at pthread_mutex_unlock, pthread_rwlock_unlock, sem_post, a futex wake) to
 * `fname.holders`.
 * The same as CPUPROFILE_CONTENTION. Returns 1 on success, 0 if one runs or on error (on
 * stderr). */
int CpuprofStartContention(const char *fname, unsigned long long period_ns);

/* Stops the contention profile and writes its file. Returns 1 if written, 0 if none ran or
 * the file could not be written (on stderr). */
int CpuprofStopContention(void);

#ifdef __cplusplus
}
#endif

#endif /* CPUPROF_H_ */
