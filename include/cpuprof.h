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
 * a free port. Returns the port bound, or -1 (the reason is printed on stderr). The same as
 * setting CPUPROF_HTTP=address in the environment. */
int CpuprofServeHttp(const char *address);

/* Starts profiling in epoch mode (continuous profiling): every `epoch_seconds` (<= 0: the
 * CPUPROFILE_EPOCH variable, else 600; fractions allowed) the samples of the epoch just ended
 * become one complete gperftools profile, database/<epoch start UTC>/<program>.<pid>.prof,
 * written under a temporary name and renamed into place. The budget comes from
 * CPUPROFILE_DB_MAX_BYTES and CPUPROFILE_DB_MAX_AGE. Stop with ProfilerStop (which completes
 * the last epoch). Returns 1 on success, 0 if already profiling or on error (on stderr).
 * The same as setting CPUPROFILE_DB=database in the environment. */
int CpuprofStartDatabase(const char *database, double epoch_seconds);

#ifdef __cplusplus
}
#endif

#endif /* CPUPROF_H_ */
