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

#ifdef __cplusplus
}
#endif

#endif /* CPUPROF_H_ */
