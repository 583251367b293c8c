//! The heap profile's own thread, while a profile runs: every 100 ms it rebuilds the unwind
//! tables' snapshot when objects were loaded or unloaded ([`super::walker`]), finds the stacks
//! of threads seen for the first time (`unwind::THREAD_STACKS`), and writes a file when one
//! is due (`HEAP_PROFILE_TIME_INTERVAL`, or a trigger an allocation crossed). It blocks every
//! signal (`in_program::thread`) and ends when the profile stops.
//!
//! A single-threaded process gets no such thread while it stays single-threaded, as for CPU
//! profiles (`writer::threadless`): a second thread would break programs that check they
//! have one (`unshare(CLONE_NEWUSER)`, Chromium's zygote) and take glibc's allocator off its
//! single-thread paths (+3-13 % on allocation-heavy programs, `docs/PERFORMANCE.md`). The
//! thread starts with the program's first one (libcpuprof.so's `pthread_create` calls
//! [`start_if_deferred`]); until then the triggers are checked at sampled allocations
//! (`dumps::when_due_without_thread`), and the snapshot is refreshed when a file is written
//! at the end or on `HeapProfilerDump`. A forked child starts the same way.

use super::recorder::{is_running, WALK_DEPTH};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static RUNNING: AtomicBool = AtomicBool::new(false);
/// Set while a profile runs in a single-threaded process without its thread.
static DEFERRED: AtomicBool = AtomicBool::new(false);
const PERIOD: Duration = Duration::from_millis(100);

/// Starts the thread unless it runs, or defers it in a single-threaded process whose thread
/// creation libcpuprof.so sees. Not for the allocation path.
pub fn ensure_running() {
    if crate::writer::threadless::deferral_enabled() && crate::in_program::procfs::self_thread_count_once() == Some(1) {
        DEFERRED.store(true, Ordering::SeqCst);
        return;
    }
    spawn();
}

/// Whether a profile runs without its thread in a single-threaded process.
pub(super) fn is_deferred() -> bool {
    DEFERRED.load(Ordering::Relaxed)
}

/// The program is about to start a thread of its own: a deferred thread starts now. Not for
/// the allocation path.
pub fn start_if_deferred() {
    if DEFERRED.swap(false, Ordering::SeqCst) && is_running() {
        spawn();
    }
}

fn spawn() {
    if RUNNING.swap(true, Ordering::SeqCst) {
        return;
    }
    let builder = std::thread::Builder::new().name("cpuprof-heap".into());
    let spawned = crate::in_program::thread::spawn_signal_free(builder, || {
        while is_running() {
            super::walker::refresh_if_stale(WALK_DEPTH);
            crate::unwind::THREAD_STACKS.resolve_requests();
            super::dumps::when_due();
            std::thread::sleep(PERIOD);
        }
        RUNNING.store(false, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        RUNNING.store(false, Ordering::SeqCst);
        crate::say!("cpuprof: heap profile: no thread of its own ({e}): unwind tables are refreshed only when a file is written");
    }
}

/// In a forked child: the parent's thread is not here. The child is single-threaded: its
/// own starts with its first thread.
pub(crate) fn in_forked_child() {
    RUNNING.store(false, Ordering::SeqCst);
    DEFERRED.store(is_running(), Ordering::SeqCst);
}
