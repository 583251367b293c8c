//! cpuprof: a sampling CPU profiler for Linux that writes gperftools-compatible profiles.
//!
//! Layers, bottom up (each testable without the ones above it):
//! * [`arch`]: what differs between x86-64 and aarch64 (registers, stack switch, framehop);
//! * [`format`]: writer and reader of the legacy profile format;
//! * [`table`]: the lock-free call-chain table and eviction ring;
//! * [`unwind`]: stack walking that cannot fault;
//! * [`sampler`]: timers and the signal handler (the only code run in signal context);
//! * [`session`]: start, flush, stop, the writer thread, options and environment variables;
//! * [`sys`]: cpuprof's own threads (which block every signal) and descriptors (kept at high
//!   numbers, checked before each use);
//! * front ends: [`Profiler`] here, the on-demand [`http`] endpoint, the C ABI in `cdylib/`,
//!   the `cpuprof` CLI in `cli/`.

pub mod arch;
mod claim_pool;
pub mod error;
pub mod format;
pub mod http;
mod profiler;
pub mod report;
pub mod sampler;
pub mod session;
pub mod symbolize;
mod sync;
pub mod sys;
pub mod table;
pub mod unwind;

pub use error::Error;
pub use profiler::{Profiler, ProfilerBuilder, ProfilerGuard};
pub use report::Report;
pub use sampler::UnwinderChoice;
pub use session::options::TimerChoice;
pub use session::Summary;
pub use sync::locks_taken_on_this_thread;
