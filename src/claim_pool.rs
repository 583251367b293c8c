//! A pool of preallocated objects that signal handlers claim with one CAS on a bitmap:
//! per-sample working memory (walk buffers, unwinder caches) without allocation, locks or
//! thread-locals. If every object is in use the claim fails at once; callers then degrade
//! (count the sample lost, or walk without the cache) rather than wait.
//!
//! A pool starts with some objects and can be given more, up to [`MAX_ITEMS`], from outside
//! signal context ([`ClaimPool::grow_to`], by several threads at once, none waiting): threads
//! as they start, and the writer's poll, keep the walk workspaces at least as many as the
//! process has threads, since each thread can be inside one profiling handler at a time, and on
//! a loaded machine many handlers are preempted at once.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The most objects a pool can hold.
pub const MAX_ITEMS: usize = 4096;

pub struct ClaimPool<T> {
    /// One bit per object, set while it is claimed.
    in_use: Box<[AtomicU64]>,
    /// One bit per object, set once it is made (and never cleared before the pool is dropped).
    made: Box<[AtomicU64]>,
    items: Box<[AtomicPtr<T>]>,
    /// Slots given to makers so far: each `grow_to` caller makes the ones it reserved, so
    /// several threads can grow the pool at once, none waiting for another.
    reserved: AtomicUsize,
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
    /// A pool of `count` items (at least 1) made by `make`, which can grow to `capacity`
    /// (at most [`MAX_ITEMS`]).
    pub fn new(count: usize, capacity: usize, make: impl FnMut() -> T) -> Self {
        let capacity = capacity.clamp(1, MAX_ITEMS);
        let words = capacity.div_ceil(64);
        let pool = ClaimPool {
            in_use: (0..words).map(|_| AtomicU64::new(0)).collect(),
            made: (0..words).map(|_| AtomicU64::new(0)).collect(),
            items: (0..capacity).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            reserved: AtomicUsize::new(0),
        };
        pool.grow_to(count.max(1), make);
        pool
    }

    /// Makes items until `count` (at most the capacity) are made or being made. Not for
    /// signal context: it allocates. Callers at the same time each make their share.
    pub fn grow_to(&self, count: usize, mut make: impl FnMut() -> T) {
        let count = count.min(self.items.len());
        while self.reserved.load(Ordering::Relaxed) < count {
            let index = self.reserved.fetch_add(1, Ordering::Relaxed);
            if index >= self.items.len() {
                self.reserved.store(self.items.len(), Ordering::Relaxed);
                return;
            }
            self.items[index].store(Box::into_raw(Box::new(make())), Ordering::Release);
            self.made[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
        }
    }

    /// How many items are made (not counting those being made).
    pub fn made(&self) -> usize {
        self.made
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    /// How many items there are (or are being made).
    pub fn len(&self) -> usize {
        self.reserved.load(Ordering::Relaxed).min(self.items.len())
    }

    /// Claims a free item. Async-signal-safe.
    pub fn claim(&self) -> Option<Claimed<'_, T>> {
        let words = self.len().div_ceil(64);
        for (w, word) in self.in_use.iter().enumerate().take(words) {
            let made = self.made[w].load(Ordering::Acquire);
            let mut bits = word.load(Ordering::Relaxed);
            loop {
                let bit = (made & !bits).trailing_zeros() as usize;
                if bit >= 64 {
                    break;
                }
                match word.compare_exchange_weak(bits, bits | 1 << bit, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => {
                        return Some(Claimed {
                            pool: self,
                            index: 64 * w + bit,
                        })
                    }
                    Err(now) => bits = now,
                }
            }
        }
        None
    }
}

impl<T> Drop for ClaimPool<T> {
    fn drop(&mut self) {
        for slot in self.items.iter() {
            let item = slot.load(Ordering::Acquire);
            if !item.is_null() {
                // SAFETY: made by Box::into_raw in `grow_to`; no claim outlives the pool.
                drop(unsafe { Box::from_raw(item) });
            }
        }
    }
}

impl<T> Deref for Claimed<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this claim owns bit `index`, hence the item (made before its `made` bit was
        // set), until dropped.
        unsafe { &*self.pool.items[self.index].load(Ordering::Relaxed) }
    }
}

impl<T> DerefMut for Claimed<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { &mut *self.pool.items[self.index].load(Ordering::Relaxed) }
    }
}

impl<T> Drop for Claimed<'_, T> {
    fn drop(&mut self) {
        self.pool.in_use[self.index / 64].fetch_and(!(1 << (self.index % 64)), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_exclusive_and_returned() {
        let pool = ClaimPool::new(64, 64, || vec![0u64; 4]);
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
        let pool = ClaimPool::new(2, 2, || 0u8);
        let (a, b) = (pool.claim(), pool.claim());
        assert!(a.is_some() && b.is_some() && pool.claim().is_none());
    }

    #[test]
    fn a_pool_grows_past_one_word_up_to_its_capacity() {
        let pool = ClaimPool::new(3, 200, || 7u32);
        let first: Vec<_> = (0..3).map(|_| pool.claim().unwrap()).collect();
        assert!(pool.claim().is_none(), "items not made are never claimed");
        pool.grow_to(150, || 8u32);
        assert_eq!(pool.len(), 150);
        let more: Vec<_> = (0..147).map(|_| pool.claim().unwrap()).collect();
        assert!(pool.claim().is_none());
        let mut indices: Vec<usize> = first.iter().chain(&more).map(|c| c.index).collect();
        indices.sort();
        indices.dedup();
        assert_eq!(indices, (0..150).collect::<Vec<_>>());
        assert!(more.iter().all(|c| **c == 8) && first.iter().all(|c| **c == 7));
        pool.grow_to(10_000, || 9u32);
        assert_eq!(pool.len(), 200);
        drop(more);
        assert!(pool.claim().is_some());
    }
}
