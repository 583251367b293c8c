//! Threads of cpuprof's own (the writer, the CPUPROFILESIGNAL toggle thread, the HTTP
//! endpoint's): none may ever receive a signal, and none is part of the program's profile
//! ([`own_tids`]: the wall-clock sampler leaves them out).
//!
//! A process-directed signal goes to any thread that does not block it. A daemon that blocks
//! SIGHUP in all of its threads and takes it with `sigwait` or a `signalfd` would otherwise
//! have it delivered to a cpuprof thread, where the default action kills the process. The mask
//! must be in place before the thread runs its first instruction, so it is inherited rather
//! than set by the thread itself.

use crate::sync::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{Builder, JoinHandle};

/// Thread ids of cpuprof's running threads.
static OWN: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// The list's lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &OWN
}

/// The thread ids of cpuprof's own threads now (not for signal context: it locks).
pub fn own_tids() -> Vec<libc::pid_t> {
    OWN.lock().clone()
}

/// The thread pointers of cpuprof's running threads, for [`is_own_thread`] (0: a free slot;
/// threads beyond the slots are not found there).
static OWN_TPS: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

/// Whether the calling thread is one of cpuprof's: its allocations are not the program's (the
/// heap profile leaves them out). Async-signal-safe: a scan of 16 words.
pub fn is_own_thread() -> bool {
    let tp = crate::arch::thread_pointer();
    OWN_TPS.iter().any(|slot| slot.load(Ordering::Relaxed) == tp)
}

/// Program threads inside cpuprof's own work (writing a heap profile the program asked for,
/// building its report): what they allocate or wait for meanwhile is cpuprof's, not the
/// program's. By thread pointer, as [`OWN_TPS`]; 16 at once at most (more are not left out).
static OWN_WORK_TPS: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

/// While it lives, the calling thread is doing cpuprof's work ([`is_own_work`]).
#[must_use]
pub struct OwnWork(Option<usize>);

/// Marks the calling thread as doing cpuprof's work until the guard drops (nested calls
/// keep the outer mark). Async-signal-safe.
pub fn own_work() -> OwnWork {
    if is_own_work() {
        return OwnWork(None);
    }
    let tp = crate::arch::thread_pointer();
    OwnWork(OWN_WORK_TPS.iter().position(|slot| {
        slot.compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }))
}

impl Drop for OwnWork {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            OWN_WORK_TPS[slot].store(0, Ordering::Relaxed);
        }
    }
}

/// Whether the calling thread is doing cpuprof's work ([`own_work`]). Async-signal-safe: a
/// scan of 16 words.
pub fn is_own_work() -> bool {
    let tp = crate::arch::thread_pointer();
    OWN_WORK_TPS.iter().any(|slot| slot.load(Ordering::Relaxed) == tp)
}

/// The calling thread's entry in [`OWN`], for as long as it lives.
struct OwnThread(libc::pid_t);

impl OwnThread {
    fn register() -> OwnThread {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        OWN.lock().push(tid);
        let tp = crate::arch::thread_pointer();
        let _ = OWN_TPS.iter().find(|slot| {
            slot.compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        OwnThread(tid)
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        OWN.lock().retain(|t| *t != self.0);
        let tp = crate::arch::thread_pointer();
        if let Some(slot) = OWN_TPS.iter().find(|slot| slot.load(Ordering::Relaxed) == tp) {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

/// Spawns a thread of cpuprof's own that blocks every signal from its start: the creating
/// thread blocks all signals, spawns (the new thread inherits the mask), and restores its own
/// mask. Signals sent to the creator meanwhile stay pending and are delivered at the restore.
/// The thread is listed as cpuprof's ([`own_tids`]) while it runs.
pub fn spawn_signal_free<F, T>(builder: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: sigfillset and pthread_sigmask on local sets, for the calling thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        let spawned = builder.spawn(move || {
            let _own = OwnThread::register();
            f()
        });
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        spawned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(signal: libc::c_int) -> bool {
        // SAFETY: reads the calling thread's mask into a local set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, signal) == 1
        }
    }

    #[test]
    fn own_threads_are_listed_while_they_run() {
        let child = spawn_signal_free(Builder::new(), || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            (tid, own_tids().contains(&tid))
        })
        .unwrap();
        let (tid, listed) = child.join().unwrap();
        assert!(listed, "a thread of cpuprof's is listed while it runs");
        assert!(!own_tids().contains(&tid), "and not after it ended");
    }

    #[test]
    fn the_new_thread_blocks_everything_and_the_creator_keeps_its_mask() {
        let creator_before = blocked(libc::SIGHUP);
        let child = spawn_signal_free(Builder::new(), || {
            [
                libc::SIGHUP,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGXFSZ,
                libc::SIGPROF,
                libc::SIGRTMAX(),
            ]
            .into_iter()
            .all(blocked)
        })
        .unwrap();
        assert!(child.join().unwrap(), "a signal is unblocked in the new thread");
        // SAFETY: gettid has no preconditions.
        assert!(!own_tids().contains(&unsafe { libc::gettid() }));
        assert_eq!(blocked(libc::SIGHUP), creator_before);
        assert!(!blocked(libc::SIGTERM));
    }
}
