/* The threads' heap-sampling countdowns (cpuprof::heap::Countdown), in initial-exec TLS:
 * reached with one thread-pointer-relative address (countdown.rs), never through
 * __tls_get_addr, which may allocate (and so re-enter malloc) the first time a thread
 * touches a dynamic TLS block. Rust cannot choose the TLS model on stable, hence C. The
 * layout matches the Rust struct (repr(C)). */
#include <stdint.h>

struct cpuprof_countdown {
  int64_t left;
  uint64_t rng;
  uint32_t busy;
};

__attribute__((visibility("hidden"), tls_model("initial-exec")))
__thread struct cpuprof_countdown cpuprof_heap_countdown;
