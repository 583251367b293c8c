//! cpuprof: a sampling CPU profiler for Linux (x86-64, aarch64) that writes gperftools'
//! profiles, so `google-pprof`, `go tool pprof` and the `cpuprof` command read them, and that
//! can also hand a profile back to the program, named, to print or save in other formats.
//!
//! Profile into a file, as `CPUPROFILE` does for any program:
//!
//! ```no_run
//! # fn main() -> Result<(), cpuprof::Error> {
//! let guard = cpuprof::Profiler::start("out.prof")?;
//! // ... the work to profile ...
//! guard.stop()?; // or let the guard drop
//! # Ok(())
//! # }
//! ```
//!
//! Or keep the profile in memory and read it in the program ([`Report`]): the top functions,
//! folded stacks, a pprof protobuf, a flame graph (feature `flamegraph`), samples labelled with
//! their threads' names.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = cpuprof::Profiler::builder().frequency(1000).start_in_memory()?;
//! let mut x = 0u64;
//! for i in 0..50_000_000u64 {
//!     x = std::hint::black_box(x.rotate_left(5) ^ i);
//! }
//! let report = guard.report()?;
//! report.write_top(&mut std::io::stdout(), 5)?;
//! report.write_pprof(&mut std::fs::File::create(std::env::temp_dir().join("doc.pb.gz"))?)?;
//! # Ok(())
//! # }
//! ```
//!
//! [`ProfilerBuilder`] sets the rate, the timer, the stack walker, wall-clock mode and epochs
//! (a database of profiles, one per period). One profile runs per process at a time: the
//! timers and the signal are the process's.
//!
//! Also here: [`format`](mod@format), to read and write the raw format and pprof's, and [`http`],
//! an endpoint that serves profiles on demand. The other public modules are the profiler's
//! internals, shared with its C library (`libcpuprof.so`) and the `cpuprof` command, and not
//! part of the API; docs/DESIGN.md describes them.

#![deny(missing_docs)]

#[doc(hidden)]
pub mod arch;
mod claim_pool;
pub mod contention;
// The one ELF reader, shared with the `cpuprof` command: not part of the API.
#[doc(hidden)]
pub mod elf;
pub mod error;
pub mod format;
pub mod heap;
pub mod http;
#[doc(hidden)]
pub mod in_program;
pub mod labels;
mod profiler;
pub mod report;
#[doc(hidden)]
pub mod sampler;
#[doc(hidden)]
pub mod session;
mod symbolize;
mod sync;
#[doc(hidden)]
pub mod table;
#[doc(hidden)]
pub mod unwind;
#[doc(hidden)]
pub mod wall;
#[doc(hidden)]
pub mod writer;

pub use error::Error;
pub use profiler::{Profiler, ProfilerBuilder, ProfilerGuard};
pub use report::heap::HeapReport;
pub use report::Report;
pub use sampler::{SignalError, UnwinderChoice};
pub use session::options::TimerChoice;
pub use session::Summary;
#[doc(hidden)]
pub use sync::locks_taken_on_this_thread;
