/* cpuprof: the heap profiler API of gperftools' <gperftools/heap-profiler.h>, implemented by
 * libcpuprof.so for any allocator underneath (glibc's malloc, or one preloaded after
 * libcpuprof.so), not only tcmalloc. Programs written for gperftools compile unchanged against
 * this header and link with -lcpuprof instead of -ltcmalloc. Sampling and dump triggers follow
 * the HEAP_PROFILE_* variables (docs/HEAP.md). */
#ifndef CPUPROF_GPERFTOOLS_HEAP_PROFILER_H_
#define CPUPROF_GPERFTOOLS_HEAP_PROFILER_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Starts a heap profile written to prefix.0001.heap, prefix.0002.heap, ... (on the triggers,
 * on HeapProfilerDump, and at HeapProfilerStop or exit). Nothing happens, with the reason on
 * stderr, if one is running or the program's malloc is not libcpuprof.so's. */
void HeapProfilerStart(const char *prefix);

/* Non-zero while a heap profile runs. */
int IsHeapProfilerRunning(void);

/* Writes the last file and stops. */
void HeapProfilerStop(void);

/* Writes a file now; reason (may be NULL) is said on stderr. */
void HeapProfilerDump(const char *reason);

/* The profile so far in gperftools' text format, in a block from malloc that the caller frees;
 * NULL if no heap profile runs. */
char *GetHeapProfile(void);

#ifdef __cplusplus
}
#endif

#endif /* CPUPROF_GPERFTOOLS_HEAP_PROFILER_H_ */
