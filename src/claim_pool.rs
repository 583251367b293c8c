//! A fixed pool of up to 64 preallocated objects that signal handlers claim with one CAS on a
//! bitmap: per-sample working memory (walk buffers, unwinder caches) without allocation,
//! locks or thread-locals. If every object is in use the claim fails at once; callers then
//! degrade (count the sample lost, or walk without the cache) rather than wait.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct ClaimPool<T> {
    in_use: AtomicU64,
    items: Box<[UnsafeCell<T>]>,
}

// SAFETY: an item is only reached through the `Claimed` that set its bit, so no two threads
// use the same item at once; T itself moves between threads with its claims.
unsafe impl<T: Send> Sync for ClaimPool<T> {}
unsafe impl<T: Send> Send for ClaimPool<T> {}

pub struct Claimed<'a, T> {
    pool: &'a ClaimPool<T>,
    index: usize,
}

impl<T> ClaimPool<T> {
    /// A pool of `count` (at most 64) items made by `make`.
    pub fn new(count: usize, mut make: impl FnMut() -> T) -> Self {
        let items = (0..count.clamp(1, 64)).map(|_| UnsafeCell::new(make())).collect();
        ClaimPool {
            in_use: AtomicU64::new(0),
            items,
        }
    }

    /// Claims a free item. Async-signal-safe.
    pub fn claim(&self) -> Option<Claimed<'_, T>> {
        let mut bits = self.in_use.load(Ordering::Relaxed);
        loop {
            let index = (!bits).trailing_zeros() as usize;
            if index >= self.items.len() {
                return None;
            }
            match self
                .in_use
                .compare_exchange_weak(bits, bits | 1 << index, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(Claimed { pool: self, index }),
                Err(now) => bits = now,
            }
        }
    }
}

impl<T> Deref for Claimed<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this claim owns bit `index`, hence the item, until dropped.
        unsafe { &*self.pool.items[self.index].get() }
    }
}

impl<T> DerefMut for Claimed<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { &mut *self.pool.items[self.index].get() }
    }
}

impl<T> Drop for Claimed<'_, T> {
    fn drop(&mut self) {
        self.pool.in_use.fetch_and(!(1 << self.index), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_exclusive_and_returned() {
        let pool = ClaimPool::new(64, || vec![0u64; 4]);
        let mut held: Vec<_> = (0..64).map(|_| pool.claim().unwrap()).collect();
        assert!(pool.claim().is_none());
        for (i, item) in held.iter_mut().enumerate() {
            item.fill(i as u64);
        }
        for (i, item) in held.iter().enumerate() {
            assert!(item.iter().all(|&v| v == i as u64));
        }
        held.pop();
        assert!(pool.claim().is_some());
    }

    #[test]
    fn small_pools_refuse_beyond_their_size() {
        let pool = ClaimPool::new(2, || 0u8);
        let (a, b) = (pool.claim(), pool.claim());
        assert!(a.is_some() && b.is_some() && pool.claim().is_none());
    }
}
