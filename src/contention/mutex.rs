//! A `std::sync::Mutex` whose contended locks are recorded in the contention profile, for Rust
//! programs that use the crate without preloading libcpuprof.so (whose interposers see
//! `pthread_mutex_lock` and futex waits in any program).

use super::{is_running, now_ns, waited};
use std::sync::{LockResult, MutexGuard, TryLockError};

/// A [`std::sync::Mutex`] that, while a contention profile runs ([`super::start`]), tries first
/// and times a lock that would block, recording the wait under the caller's chain. Otherwise
/// a `lock` costs one load more than std's.
///
/// ```
/// let counter = cpuprof::contention::Mutex::new(0u64);
/// cpuprof::contention::start(cpuprof::contention::DEFAULT_PERIOD_NS).ok();
/// *counter.lock().unwrap() += 1;
/// let profile = cpuprof::contention::current();
/// # drop(profile);
/// ```
#[derive(Debug, Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

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
            return self.0.lock();
        }
        match self.0.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::Poisoned(e)) => Err(e),
            Err(TryLockError::WouldBlock) => {
                let start = now_ns();
                let result = self.0.lock();
                waited(crate::arch::calling_registers(), now_ns().saturating_sub(start), 0);
                result
            }
        }
    }

    /// As [`std::sync::Mutex::try_lock`] (never waits, so never recorded).
    pub fn try_lock(&self) -> Result<MutexGuard<'_, T>, TryLockError<MutexGuard<'_, T>>> {
        self.0.try_lock()
    }

    /// As [`std::sync::Mutex::get_mut`].
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.0.get_mut()
    }

    /// As [`std::sync::Mutex::is_poisoned`].
    pub fn is_poisoned(&self) -> bool {
        self.0.is_poisoned()
    }
}
