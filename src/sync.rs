//! The only lock type in cpuprof: a `parking_lot` mutex that counts acquisitions per thread,
//! so a test can show that the signal handler's path takes none ([`locks_taken_on_this_thread`]
//! stays unchanged on a thread while it is sampled). Locks belong to the control plane only:
//! a handler that took one could deadlock against the code it interrupted.

use std::cell::Cell;

thread_local! {
    // Const-initialised and without a destructor: no lazy registration on first use.
    static LOCKS_TAKEN: Cell<u64> = const { Cell::new(0) };
}

pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
pub use parking_lot::Condvar;

pub struct Mutex<T>(parking_lot::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex(parking_lot::const_mutex(value))
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        let _ = LOCKS_TAKEN.try_with(|n| n.set(n.get() + 1));
        self.0.lock()
    }

    /// The lock if it is free now (for a forked child, where a holder may no longer exist).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let _ = LOCKS_TAKEN.try_with(|n| n.set(n.get() + 1));
        self.0.try_lock()
    }

    /// Takes the lock if it becomes free within `limit`, polling every millisecond. For code
    /// that may run in a signal handler (libcpuprof.so's `exec` path): it must not wait forever
    /// for a lock the code it interrupted may hold, nor park (parking uses thread-locals).
    pub fn try_lock_for(&self, limit: std::time::Duration) -> Option<MutexGuard<'_, T>> {
        let _ = LOCKS_TAKEN.try_with(|n| n.set(n.get() + 1));
        let deadline = crate::sys::futex::monotonic_now() + limit;
        loop {
            if let Some(guard) = self.0.try_lock() {
                return Some(guard);
            }
            if crate::sys::futex::monotonic_now() >= deadline {
                return None;
            }
            let ms = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            // SAFETY: nanosleep with a valid duration; async-signal-safe.
            unsafe { libc::nanosleep(&ms, std::ptr::null_mut()) };
        }
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

/// How many cpuprof locks the calling thread has taken so far.
pub fn locks_taken_on_this_thread() -> u64 {
    LOCKS_TAKEN.try_with(Cell::get).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_acquisitions_of_the_calling_thread_only() {
        let m = Mutex::new(0);
        let before = locks_taken_on_this_thread();
        *m.lock() += 1;
        *m.lock() += 1;
        std::thread::scope(|s| {
            s.spawn(|| *m.lock() += 1);
        });
        assert_eq!(locks_taken_on_this_thread() - before, 2);
        assert_eq!(*m.lock(), 3);
    }
}
