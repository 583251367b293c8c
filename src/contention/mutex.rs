//! A `std::sync::Mutex` whose contended locks are recorded in the contention profile, for Rust
//! programs that use the crate without preloading libcpuprof.so (whose interposers see
//! `pthread_mutex_lock` and futex waits in any program).

use super::{arrive, charge_holder, holders, is_running, now_ns, releasing, waited};
use std::ops::{Deref, DerefMut};
use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};

/// A [`std::sync::Mutex`] that, while a contention profile runs ([`super::start`]), tries first
/// and times a lock that would block, recording the wait under the caller's chain (the
/// waiters' view), and whose guard charges the waits its holding caused to the chain that drops
/// it (the holders' view). Otherwise a `lock` costs one load more than std's, and a release
/// one more.
///
/// ```
/// use cpuprof::contention::{self, View};
/// let counter = contention::Mutex::new(0u64);
/// contention::start(contention::DEFAULT_PERIOD_NS).ok();
/// *counter.lock().unwrap() += 1;
/// let waiters = contention::current(View::Waiters);
/// let holders = contention::current(View::Holders);
/// # drop((waiters, holders));
/// ```
#[derive(Debug, Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// The guard of a [`Mutex`]: std's, and at its drop, the release charged with what the lock's
/// waiters accrued while it was held.
#[derive(Debug)]
pub struct MutexGuard<'a, T: ?Sized> {
    /// `None` only while dropping.
    inner: Option<std::sync::MutexGuard<'a, T>>,
    lock: usize,
}

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    /// The value, the mutex consumed (as [`std::sync::Mutex::into_inner`]).
    pub fn into_inner(self) -> LockResult<T> {
        self.0.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks as [`std::sync::Mutex::lock`]; a wait is recorded while a profile runs.
    #[inline(never)]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        if !is_running() {
            return self.guard(self.0.lock());
        }
        match self.0.try_lock() {
            Ok(guard) => Ok(self.wrap(guard)),
            Err(TryLockError::Poisoned(e)) => self.guard(Err(e)),
            Err(TryLockError::WouldBlock) => {
                let start = now_ns();
                let waiting = arrive(self.address(), start);
                let result = self.0.lock();
                if let Some(w) = waiting {
                    holders::depart(w);
                }
                waited(crate::arch::calling_registers(), now_ns().saturating_sub(start), 0);
                self.guard(result)
            }
        }
    }

    /// As [`std::sync::Mutex::try_lock`] (never waits, so never recorded as a wait).
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Ok(self.wrap(guard)),
            Err(TryLockError::Poisoned(e)) => Err(TryLockError::Poisoned(PoisonError::new(self.wrap(e.into_inner())))),
            Err(TryLockError::WouldBlock) => Err(TryLockError::WouldBlock),
        }
    }

    /// As [`std::sync::Mutex::get_mut`].
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.0.get_mut()
    }

    /// As [`std::sync::Mutex::is_poisoned`].
    pub fn is_poisoned(&self) -> bool {
        self.0.is_poisoned()
    }

    /// The key of this lock's waiters (its address, never read through).
    fn address(&self) -> usize {
        (&self.0 as *const std::sync::Mutex<T>).cast::<u8>() as usize
    }

    fn wrap<'a>(&'a self, inner: std::sync::MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        MutexGuard {
            inner: Some(inner),
            lock: self.address(),
        }
    }

    fn guard<'a>(&'a self, result: LockResult<std::sync::MutexGuard<'a, T>>) -> LockResult<MutexGuard<'a, T>> {
        match result {
            Ok(inner) => Ok(self.wrap(inner)),
            Err(e) => Err(PoisonError::new(self.wrap(e.into_inner()))),
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_deref().expect("a live guard")
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner.as_deref_mut().expect("a live guard")
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    #[inline(never)]
    fn drop(&mut self) {
        if !is_running() || !holders::anyone_waiting() {
            return;
        }
        // Taken before the release, as the interposers do (a woken waiter could leave first).
        let delay = releasing(self.lock);
        self.inner = None;
        if delay > 0 {
            charge_holder(crate::arch::calling_registers(), delay, 0);
        }
    }
}
