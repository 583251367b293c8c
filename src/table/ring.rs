//! A bounded multi-producer, single-consumer ring of evicted call chains.
//!
//! Producers are signal handlers (any number at once); the consumer is the writer thread.
//! A record occupies `2 + depth` consecutive slots (modulo the capacity):
//! `[header = len << 1 | 1][count][pc]...`. A producer reserves space by advancing
//! `reserved` with a CAS, fills the body, and publishes by storing the header last with
//! `Release`; the consumer reads records in reservation order and stops at the first
//! header that is still 0 (reserved but not yet published). It zeroes what it consumed before
//! advancing `consumed`, so producers always write into zeroed slots.

use super::atomic::{AtomicU64, Ordering};
use super::zeroed_atomics;
use crate::sync::Mutex;

pub struct EvictionRing {
    slots: Box<[AtomicU64]>,
    mask: u64,
    reserved: AtomicU64,
    consumed: AtomicU64,
    /// Serialises consumers (the writer thread, and `stop` after it has joined), with their
    /// scratch row.
    consumer: Mutex<Vec<u64>>,
    /// The longest chain a record holds.
    max_pcs: usize,
}

impl EvictionRing {
    /// A ring of `capacity_slots` rounded up to a power of two, for chains of at most
    /// `max_pcs`.
    pub fn new(capacity_slots: usize, max_pcs: usize) -> Self {
        let cap = capacity_slots.next_power_of_two().max(64);
        EvictionRing {
            slots: zeroed_atomics(cap),
            mask: cap as u64 - 1,
            reserved: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            consumer: Mutex::new(Vec::new()),
            max_pcs,
        }
    }

    pub fn capacity_slots(&self) -> usize {
        self.slots.len()
    }

    /// Appends a record; returns false (and writes nothing) when there is no room.
    /// Async-signal-safe: no allocation, no locks, no system calls.
    pub fn push(&self, count: u64, pcs: &[AtomicU64]) -> bool {
        let len = 2 + pcs.len() as u64;
        let cap = self.mask + 1;
        let mut start = self.reserved.load(Ordering::Relaxed);
        loop {
            let consumed = self.consumed.load(Ordering::Acquire);
            // `start` may be stale (read before other producers reserved and the consumer
            // freed past it): the space then looks larger than it is, and the CAS below fails
            // and reloads it. Saturating: `consumed` can exceed a stale `start`.
            if (start + len).saturating_sub(consumed) > cap {
                return false;
            }
            match self
                .reserved
                .compare_exchange_weak(start, start + len, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => start = now,
            }
        }
        self.slot(start + 1).store(count, Ordering::Relaxed);
        for (i, pc) in pcs.iter().enumerate() {
            self.slot(start + 2 + i as u64)
                .store(pc.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.slot(start).store(len << 1 | 1, Ordering::Release);
        true
    }

    /// Hands every published record to `f` as `(count, pcs)`, in order, and frees its space.
    pub fn drain(&self, f: impl FnMut(u64, &[u64])) {
        let mut scratch = self.consumer.lock();
        scratch.resize(self.max_pcs, 0);
        // SAFETY: the consumer lock makes this the only consumer.
        unsafe { self.drain_exclusive(&mut scratch, f) }
    }

    /// [`drain`](Self::drain) without the consumer lock, through the caller's `scratch`
    /// (records longer than it are cut). Async-signal-safe.
    ///
    /// # Safety
    /// No other consumer runs at the same time.
    pub unsafe fn drain_exclusive(&self, scratch: &mut [u64], mut f: impl FnMut(u64, &[u64])) {
        let mut pos = self.consumed.load(Ordering::Relaxed);
        loop {
            let header = self.slot(pos).load(Ordering::Acquire);
            if header == 0 {
                break;
            }
            let len = header >> 1;
            let pcs = (len.saturating_sub(2) as usize).min(scratch.len());
            for (i, dst) in scratch[..pcs].iter_mut().enumerate() {
                *dst = self.slot(pos + 2 + i as u64).load(Ordering::Relaxed);
            }
            let count = self.slot(pos + 1).load(Ordering::Relaxed);
            for i in 0..len {
                self.slot(pos + i).store(0, Ordering::Relaxed);
            }
            pos += len;
            self.consumed.store(pos, Ordering::Release);
            f(count, &scratch[..pcs]);
        }
    }

    /// Slots reserved and not yet consumed. Async-signal-safe.
    pub fn used_slots(&self) -> usize {
        let reserved = self.reserved.load(Ordering::Relaxed);
        reserved.saturating_sub(self.consumed.load(Ordering::Relaxed)) as usize
    }

    fn slot(&self, index: u64) -> &AtomicU64 {
        &self.slots[(index & self.mask) as usize]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn atomics(v: &[u64]) -> Vec<AtomicU64> {
        v.iter().map(|&x| AtomicU64::new(x)).collect()
    }

    #[test]
    fn records_come_out_in_order_and_space_is_reused() {
        let ring = EvictionRing::new(64, 62);
        for round in 0..100u64 {
            assert!(ring.push(round, &atomics(&[1, 2, round])));
            assert!(ring.push(7, &atomics(&[9])));
            let mut out = Vec::new();
            ring.drain(|c, pcs| out.push((c, pcs.to_vec())));
            assert_eq!(out, vec![(round, vec![1, 2, round]), (7, vec![9])]);
        }
    }

    /// Producers that read `reserved` before the consumer frees past it (a stale start) must
    /// neither overflow nor give up while there is room: the aarch64 run of the epochs race
    /// test found `start + len - consumed` underflowing.
    #[test]
    fn producers_with_a_stale_start_neither_overflow_nor_give_up_on_room() {
        let ring = Arc::new(EvictionRing::new(64, 62));
        let pushed = Arc::new(AtomicU64::new(0));
        let producers: Vec<_> = (0..3)
            .map(|_| {
                let (ring, pushed) = (ring.clone(), pushed.clone());
                std::thread::spawn(move || {
                    let pcs = atomics(&[5, 6]);
                    for _ in 0..100_000 {
                        if ring.push(1, &pcs) {
                            pushed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let mut drained = 0;
        while producers.iter().any(|p| !p.is_finished()) {
            ring.drain(|count, _| drained += count);
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
        ring.drain(|count, _| drained += count);
        assert_eq!(drained, pushed.load(Ordering::Relaxed));
        assert!(drained > 0);
    }

    #[test]
    fn a_full_ring_refuses_instead_of_overwriting() {
        let ring = EvictionRing::new(64, 62);
        let pcs = atomics(&[1; 14]); // 16 slots a record
        for _ in 0..4 {
            assert!(ring.push(1, &pcs));
        }
        assert!(!ring.push(1, &pcs));
        let mut n = 0;
        ring.drain(|_, _| n += 1);
        assert_eq!(n, 4);
        assert!(ring.push(1, &pcs));
    }

    #[test]
    fn concurrent_producers_lose_nothing_they_were_told_was_stored() {
        let ring = Arc::new(EvictionRing::new(1 << 12, 1 << 12));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    let mut stored = 0u64;
                    for i in 0..50_000u64 {
                        let pcs = atomics(&[t + 1, i, t * 1000 + i % 7]);
                        while !ring.push(1, &pcs) {
                            std::thread::yield_now();
                        }
                        stored += 1;
                    }
                    stored
                })
            })
            .collect();
        let consumer = {
            let (ring, stop) = (ring.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut per_thread = [0u64; 4];
                loop {
                    let done = stop.load(Ordering::Acquire);
                    ring.drain(|c, pcs| {
                        assert_eq!(pcs.len(), 3);
                        assert_eq!(pcs[2], (pcs[0] - 1) * 1000 + pcs[1] % 7, "torn record");
                        per_thread[pcs[0] as usize - 1] += c;
                    });
                    if done {
                        return per_thread;
                    }
                }
            })
        };
        let stored: Vec<u64> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        stop.store(true, Ordering::Release);
        assert_eq!(consumer.join().unwrap().to_vec(), stored);
    }
}
