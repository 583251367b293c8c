//! The only lock type in cpuprof's control plane: a futex mutex that counts acquisitions per
//! thread, so a test can show that the signal handler's path takes none
//! ([`locks_taken_on_this_thread`] stays unchanged on a thread while it is sampled), and that
//! can be held across `fork` and released in both processes (`session::children`).
//!
//! Locks belong to the control plane only: a handler that took one could deadlock against the
//! code it interrupted. A futex word of our own rather than `parking_lot`: `fork` copies a lock
//! held by another thread as held for good, and parking_lot's wake-ups go through a table
//! shared by every parking_lot lock of the process (the program's too), whose internal locks
//! a forked child may inherit held. With one word per lock, the `pthread_atfork` handlers can
//! hold every cpuprof lock while the process forks and simply mark them free afterwards.

use crate::in_program::futex;
use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

thread_local! {
    // Const-initialised and without a destructor: no lazy registration on first use.
    static LOCKS_TAKEN: Cell<u64> = const { Cell::new(0) };
}

const FREE: u32 = 0;
const LOCKED: u32 = 1;
/// Locked, and a thread may be sleeping on the word: the unlock must wake one.
const CONTENDED: u32 = 2;

/// A mutual-exclusion lock over a `T`.
pub struct Mutex<T> {
    word: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives one thread at a time access to the value.
unsafe impl<T: Send> Send for Mutex<T> {}
unsafe impl<T: Send> Sync for Mutex<T> {}

/// Access to a locked [`Mutex`]'s value; unlocks when dropped.
pub struct MutexGuard<'a, T> {
    mutex: &'a Mutex<T>,
}

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex {
            word: AtomicU32::new(FREE),
            value: UnsafeCell::new(value),
        }
    }

    fn counted(&self) -> MutexGuard<'_, T> {
        let _ = LOCKS_TAKEN.try_with(|n| n.set(n.get() + 1));
        MutexGuard { mutex: self }
    }

    fn try_acquire(&self) -> bool {
        self.word
            .compare_exchange(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub fn lock(&self) -> MutexGuard<'_, T> {
        if !self.try_acquire() {
            // Marked contended before sleeping, so the holder's unlock wakes a sleeper.
            while self.word.swap(CONTENDED, Ordering::Acquire) != FREE {
                futex::wait(&self.word, CONTENDED, Duration::from_secs(1));
            }
        }
        self.counted()
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.try_acquire().then(|| self.counted())
    }

    /// Takes the lock if it becomes free within `limit`, polling every millisecond. For code
    /// that may run in a signal handler (libcpuprof.so's `exec` path) or inside `fork`: it
    /// must not wait forever for a lock the code it interrupted may hold.
    pub fn try_lock_for(&self, limit: Duration) -> Option<MutexGuard<'_, T>> {
        let deadline = futex::monotonic_now() + limit;
        loop {
            if let Some(guard) = self.try_lock() {
                return Some(guard);
            }
            if futex::monotonic_now() >= deadline {
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

    /// Takes the lock, waiting for it as [`lock`](Self::lock) does (asleep, woken by the
    /// holder's unlock) but no longer than `limit`. For the fork handlers: a thread that takes
    /// and releases the lock in a tight loop would starve a waiter that only polls.
    pub fn lock_within(&self, limit: Duration) -> Option<MutexGuard<'_, T>> {
        if self.try_acquire() {
            return Some(self.counted());
        }
        let deadline = futex::monotonic_now() + limit;
        while self.word.swap(CONTENDED, Ordering::Acquire) != FREE {
            let now = futex::monotonic_now();
            if now >= deadline {
                return None;
            }
            futex::wait(&self.word, CONTENDED, deadline - now);
        }
        Some(self.counted())
    }

    fn unlock(&self) {
        if self.word.swap(FREE, Ordering::Release) == CONTENDED {
            futex::wake_one(&self.word);
        }
    }
}

impl<T> Default for Mutex<T>
where
    T: Default,
{
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.mutex.value.get() }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and is borrowed mutably.
        unsafe { &mut *self.mutex.value.get() }
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        self.mutex.unlock();
    }
}

/// A lock the `pthread_atfork` handlers hold while the process forks, so that the child's
/// copy of what it guards is consistent and the lock is free in both processes afterwards.
pub trait ForkLock: Sync {
    /// Takes the lock within `limit` and keeps it past this call. Returns whether it is held.
    fn hold_for_fork(&self, limit: Duration) -> bool;

    /// Releases a lock taken by [`hold_for_fork`](Self::hold_for_fork): in the parent (waking
    /// a waiter), or in the child, where no other thread exists to wait on it.
    ///
    /// # Safety
    /// The calling thread holds the lock by `hold_for_fork`.
    unsafe fn release_after_fork(&self);
}

impl<T: Send> ForkLock for Mutex<T> {
    fn hold_for_fork(&self, limit: Duration) -> bool {
        self.lock_within(limit).map(std::mem::forget).is_some()
    }

    unsafe fn release_after_fork(&self) {
        self.unlock();
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

    #[test]
    fn excludes_and_wakes_waiters() {
        let m = Mutex::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        *m.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*m.lock(), 80_000);
        assert!(m.try_lock().is_some());
        let held = m.lock();
        assert!(m.try_lock().is_none());
        assert!(m.try_lock_for(Duration::from_millis(5)).is_none());
        drop(held);
    }

    #[test]
    fn a_lock_held_for_fork_is_free_after_release() {
        let m = Mutex::new(1);
        assert!(m.hold_for_fork(Duration::from_millis(10)));
        assert!(m.try_lock().is_none());
        assert!(!m.hold_for_fork(Duration::from_millis(2)), "already held");
        // SAFETY: held above by this thread.
        unsafe { m.release_after_fork() };
        assert_eq!(*m.try_lock().expect("free"), 1);
    }
}
