//! The calling thread's heap-sampling countdown, a C variable in initial-exec TLS
//! (countdown.c: stable Rust can declare neither a foreign thread-local nor its TLS model),
//! found inline from the thread pointer (`cpuprof::initial_exec_address!`): a call to a C
//! accessor instead cost a call and a return on every allocation while a heap profile runs.

use cpuprof_core::heap::Countdown;

/// The calling thread's countdown, valid for the thread's life.
#[inline(always)]
pub fn this_thread() -> *mut Countdown {
    cpuprof_core::initial_exec_address!("cpuprof_heap_countdown") as *mut Countdown
}
