//! Scratch buffers for stack walks, so that the handler's own stack use does not grow with the
//! configured depth (handlers may run on small alternate signal stacks).
//!
//! Up to 64 handlers can hold a buffer at once; a bitmap CAS claims one. If all are in use the
//! sample is counted as lost rather than waiting.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct ScratchPool {
    in_use: AtomicU64,
    depth: usize,
    buffers: Box<[UnsafeCell<u64>]>,
}

// SAFETY: a buffer is only accessed through the `Scratch` that claimed its bit, so no two
// threads touch the same cells at once.
unsafe impl Sync for ScratchPool {}
unsafe impl Send for ScratchPool {}

pub struct Scratch<'a> {
    pool: &'a ScratchPool,
    index: usize,
}

impl ScratchPool {
    pub fn new(depth: usize) -> Self {
        let buffers = (0..64 * depth).map(|_| UnsafeCell::new(0)).collect();
        ScratchPool {
            in_use: AtomicU64::new(0),
            depth,
            buffers,
        }
    }

    /// Claims a free buffer. Async-signal-safe.
    pub fn claim(&self) -> Option<Scratch<'_>> {
        let mut bits = self.in_use.load(Ordering::Relaxed);
        loop {
            let index = (!bits).trailing_zeros() as usize;
            if index >= 64 {
                return None;
            }
            match self
                .in_use
                .compare_exchange_weak(bits, bits | 1 << index, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(Scratch { pool: self, index }),
                Err(now) => bits = now,
            }
        }
    }
}

impl Scratch<'_> {
    pub fn buffer(&mut self) -> &mut [u64] {
        let cells = &self.pool.buffers[self.index * self.pool.depth..(self.index + 1) * self.pool.depth];
        // SAFETY: this Scratch owns bit `index`, hence these cells, exclusively until dropped.
        unsafe { std::slice::from_raw_parts_mut(cells.as_ptr() as *mut u64, cells.len()) }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.pool.in_use.fetch_and(!(1 << self.index), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_exclusive_and_returned() {
        let pool = ScratchPool::new(4);
        let mut held: Vec<_> = (0..64).map(|_| pool.claim().unwrap()).collect();
        assert!(pool.claim().is_none());
        for (i, s) in held.iter_mut().enumerate() {
            s.buffer().fill(i as u64);
        }
        for (i, s) in held.iter_mut().enumerate() {
            assert!(s.buffer().iter().all(|&v| v == i as u64));
        }
        held.pop();
        assert!(pool.claim().is_some());
    }
}
