/* The calling thread's heap-sampling countdown (cpuprof::heap::Countdown), in initial-exec
 * TLS: reached with one %fs-relative load, never through __tls_get_addr, which may allocate
 * (and so re-enter malloc) the first time a thread touches a dynamic TLS block. Rust cannot
 * choose the TLS model on stable, hence C. The layout matches the Rust struct (repr(C)). */
#include <stdint.h>

struct cpuprof_countdown {
  int64_t left;
  uint64_t rng;
  uint32_t busy;
};

static __thread struct cpuprof_countdown countdown __attribute__((tls_model("initial-exec")));

__attribute__((visibility("hidden"))) struct cpuprof_countdown *cpuprof_heap_countdown(void) {
  return &countdown;
}
