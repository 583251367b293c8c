//! Checkpoints of a contention profile's file, so that a process killed by `SIGKILL` or the
//! OOM killer leaves its waits up to the last one rather than an empty file: every
//! `CPUPROFILE_CHECKPOINT` seconds (2 by default, as for CPU profiles; `off`: none) in which
//! waits came in, a thread of ours writes the profile so far over the file, as `_exit` does
//! (`contention::raw_writer`: the text and the maps, no build-id lines; the file written at
//! the end has them).
//!
//! Not from the lock path where a thread can do it: the thread that waited holds the lock it
//! just took, and writing there would lengthen its critical section. The thread blocks every
//! signal, and, as every thread of cpuprof's, starts only once the program has a thread of its
//! own (`pthread_create` calls [`start_if_deferred`]). Until then (a single-threaded process:
//! a prefork server's worker waiting on a semaphore in shared memory, another process's post
//! ending its waits), the waiting thread writes a checkpoint that is due itself, after its
//! wait ([`after_wait`]): at most once per interval, and only if the lock path's try of the
//! file finds it free.

use cpuprof_core::contention;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The interval in milliseconds; 0: no checkpoints.
static EVERY_MS: AtomicU64 = AtomicU64::new(0);
/// Whether the thread runs.
static SPAWNED: AtomicBool = AtomicBool::new(false);
/// Set while checkpoints wait for the program's first thread.
static DEFERRED: AtomicBool = AtomicBool::new(false);
/// While deferred: when the last checkpoint was due (`contention::now_ns`), and the samples it
/// wrote (`contention::recorded`).
static DUE_FROM_NS: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Checkpoints every `every` (none: `None`) while the profile started with a file runs.
pub fn start(every: Option<Duration>) {
    let ms = every.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1));
    EVERY_MS.store(ms, Ordering::SeqCst);
    if ms == 0 {
        return;
    }
    if cpuprof_core::writer::threadless::deferral_enabled()
        && cpuprof_core::in_program::procfs::self_thread_count_once() == Some(1)
    {
        defer();
    } else {
        spawn();
    }
}

/// The program is about to start a thread: deferred checkpoints start now.
pub fn start_if_deferred() {
    if DEFERRED.swap(false, Ordering::SeqCst) && contention::is_running() {
        spawn();
    }
}

/// In a forked child (single-threaded, the parent's thread not here): checkpoints of its own
/// file start with its first thread.
pub fn in_forked_child() {
    SPAWNED.store(false, Ordering::SeqCst);
    DEFERRED.store(false, Ordering::SeqCst);
    if contention::is_running() && EVERY_MS.load(Ordering::SeqCst) > 0 {
        defer();
    }
}

/// Checkpoints wait for the program's first thread; meanwhile its waits write them.
fn defer() {
    DUE_FROM_NS.store(contention::now_ns(), Ordering::SeqCst);
    WRITTEN.store(0, Ordering::SeqCst);
    DEFERRED.store(true, Ordering::SeqCst);
}

/// After a wait of the program's, in a process whose checkpoints wait for its first thread:
/// the checkpoint, if one is due and waits came in since the last. One load otherwise.
/// Async-signal-safe (the file is only tried).
#[inline]
pub fn after_wait() {
    if DEFERRED.load(Ordering::Relaxed) {
        write_if_due();
    }
}

#[cold]
fn write_if_due() {
    let every_ns = EVERY_MS.load(Ordering::Relaxed).saturating_mul(1_000_000);
    let (now, due_from) = (contention::now_ns(), DUE_FROM_NS.load(Ordering::Relaxed));
    if every_ns == 0 || now.saturating_sub(due_from) < every_ns {
        return;
    }
    // One thread takes this interval's checkpoint (a signal handler's wait could race ours).
    if DUE_FROM_NS
        .compare_exchange(due_from, now, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let recorded = contention::recorded();
    if recorded != WRITTEN.load(Ordering::Relaxed) && super::try_write_checkpoint() {
        WRITTEN.store(recorded, Ordering::Relaxed);
    }
}

fn spawn() {
    if SPAWNED.swap(true, Ordering::SeqCst) {
        return;
    }
    let builder = std::thread::Builder::new().name("cpuprof-waits".into());
    let spawned = cpuprof_core::in_program::thread::spawn_signal_free(builder, || {
        let mut written = contention::recorded();
        while contention::is_running() {
            std::thread::sleep(Duration::from_millis(EVERY_MS.load(Ordering::SeqCst)));
            let recorded = contention::recorded();
            if recorded != written && contention::is_running() {
                super::write_checkpoint();
                written = recorded;
            }
        }
        SPAWNED.store(false, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        SPAWNED.store(false, Ordering::SeqCst);
        cpuprof_core::say!(
            "cpuprof: contention profile: no thread for checkpoints ({e}): a process killed by SIGKILL leaves its file empty"
        );
    }
}
