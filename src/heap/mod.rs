//! Heap profiles: which call chains allocated the memory a program holds, and all it
//! allocated, sampled by bytes as tcmalloc and Go sample them, for any program.
//!
//! Three ways in, as for CPU profiles:
//! * `LD_PRELOAD=libcpuprof.so HEAPPROFILE=prefix ./app` (or linking `-lcpuprof`): the
//!   library's `malloc`, `free`, `calloc`, `realloc`, ... count every allocation and pass it
//!   on to the allocator the program would have used; files are written as gperftools'
//!   heap profiler writes them ([`dumps`]). gperftools' `heap-profiler.h` API is there too.
//! * A Rust program without preloading: `#[global_allocator] static A:
//!   cpuprof::heap::Sampled<std::alloc::System> = cpuprof::heap::Sampled::new(std::alloc::System);`
//!   then [`start`] and [`profile`] (or `HEAPPROFILE`-style files with [`dumps::start`]).
//! * The HTTP endpoint: `/pprof/heap`, `/pprof/growth`, `/debug/pprof/heap`, `/debug/pprof/allocs`.
//!
//! How an allocation is counted: a per-thread byte countdown ([`countdown`]); the allocation
//! that crosses zero is sampled — its call chain walked and entered in the site table
//! (`sites`), its address remembered (`blocks`) so that its free is seen. Everything on
//! the allocation and free path follows the signal handler's rules: no allocation, no lock,
//! no system call on the common path, no lazily initialised thread-local.

mod blocks;
pub mod countdown;
pub mod dumps;
mod mapped;
mod poller;
pub mod recorder;
pub(crate) mod sites;
pub(crate) mod walker;

pub use countdown::Countdown;
pub use poller::start_if_deferred;
pub use recorder::{is_running, losses, start, stop, StartError, DEFAULT_PERIOD};

use crate::format::heap::HeapProfile;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

/// The heap profile so far, with the process's maps (and the build-ids of its code).
pub fn profile() -> HeapProfile {
    dumps::current(&mut crate::writer::mappings::SeenMappings::default())
}

/// The heap profile so far with every address named, as [`crate::ProfilerGuard::report`] is
/// for CPU profiles: `top`, folded stacks and pprof per value (in use or allocated, bytes or
/// objects).
pub fn report() -> crate::HeapReport {
    let _own = crate::in_program::thread::own_work();
    crate::HeapReport::new(profile())
}

/// A Rust global allocator that samples the allocations it passes to `A`, for heap profiles
/// of a Rust program with no preloaded library. Nothing is sampled until [`start`] (or
/// [`dumps::start`]); until then an allocation costs one thread-local subtraction more.
///
/// ```no_run
/// #[global_allocator]
/// static ALLOC: cpuprof::heap::Sampled<std::alloc::System> = cpuprof::heap::Sampled::new(std::alloc::System);
///
/// cpuprof::heap::start(cpuprof::heap::DEFAULT_PERIOD)?;
/// let v: Vec<u64> = (0..1_000_000).collect();
/// let profile = cpuprof::heap::profile();
/// profile.write_text(&mut std::fs::File::create("app.heap")?)?;
/// # drop(v);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sampled<A> {
    inner: A,
}

impl<A> Sampled<A> {
    /// Wraps the allocator `inner`.
    pub const fn new(inner: A) -> Self {
        Sampled { inner }
    }
}

thread_local! {
    // `const`, no destructor: nothing is allocated or registered when a thread first uses it,
    // and it stays usable while the thread ends.
    static COUNTDOWN: Cell<Countdown> = const { Cell::new(Countdown { left: 0, rng: 0, busy: 0 }) };
}

/// Counts an allocation made through [`Sampled`]. Never inlined, so the frames it leaves
/// out are always the same: itself and `Sampled`'s method.
#[inline(never)]
fn counted(address: *mut u8, size: usize) {
    if !recorder::is_running() {
        return;
    }
    let _ = COUNTDOWN.try_with(|cell| {
        let mut countdown = cell.get();
        recorder::allocated(&mut countdown, address, size, 2);
        cell.set(countdown);
    });
}

// SAFETY: every call is passed to `inner` unchanged; the counting around it touches no
// memory the caller owns.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Sampled<A> {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.inner.alloc(layout) };
        counted(p, layout.size());
        p
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        counted(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        recorder::forget(ptr);
        // SAFETY: as above.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as a free and an allocation. The free before the call: once it returns,
        // the old address may be another thread's new (sampled) block. A failed call leaves
        // the old block allocated but out of the in-use counts (an allocation failure, rare).
        recorder::forget(ptr);
        // SAFETY: as above.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        counted(p, new_size);
        p
    }
}
