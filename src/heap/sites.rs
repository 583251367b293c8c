//! Where sampled allocations were made: one entry per (call chain, size class), with what was
//! allocated there and what of it was freed (a contention profile keeps its waits in a table
//! of this kind: `crate::contention`). Lock-free and allocation-free, for the
//! allocation path: an entry is claimed with a CAS (`EMPTY` to `BUSY`), its chain written,
//! then published with a `Release` store of its key; counters are atomic adds. A thread that
//! meets a `BUSY` entry does not wait for it (its owner may be the very thread it interrupted)
//! but probes on, so one chain can have two entries: [`Sites::for_each`] readers merge by
//! chain. Entries are never removed while the profile runs; a full table counts what it
//! could not place (`Sites::dropped`).
//!
//! The size class keeps objects of very different sizes on separate lines of the profile:
//! readers scale each line back from its *mean* object size (`format::heap::unsample`),
//! which is exact only when the line's objects have about the same size. Four classes per
//! power of two keep sizes within 19 % of each other on one line.

use super::mapped::Mapped;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries in the table (a power of two).
pub const CAPACITY: usize = 1 << 16;
/// Longest chain kept, innermost first.
pub const MAX_DEPTH: usize = 64;
const PROBES: usize = 64;
const EMPTY: u64 = 0;
const BUSY: u64 = 1;
/// Words per entry's row: the chain's length, then its addresses.
const ROW: usize = 1 + MAX_DEPTH;

/// Counters of one entry: sampled objects and bytes allocated, and freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteCounts {
    pub alloc_objects: u64,
    pub alloc_bytes: u64,
    pub freed_objects: u64,
    pub freed_bytes: u64,
}

pub struct Sites {
    /// `EMPTY`, `BUSY`, or the entry's key (its hash with bit 1 set: never 0 or 1).
    keys: Mapped<AtomicU64>,
    rows: Mapped<AtomicU64>,
    /// Four counters per entry, in [`SiteCounts`] order.
    counts: Mapped<AtomicU64>,
    dropped: AtomicU64,
}

/// The size class of an allocation of `size` bytes: its power of two and the next two bits.
pub fn size_class(size: usize) -> u64 {
    let size = size.max(1) as u64;
    let log = 63 - size.leading_zeros() as u64;
    let fraction = if log >= 2 { (size >> (log - 2)) & 3 } else { 0 };
    log * 4 + fraction
}

fn key_of(chain: &[u64], class: u64) -> u64 {
    let mut h = class.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ chain.len() as u64;
    for &pc in chain {
        h = (h ^ pc).wrapping_mul(0x100_0000_01b3).rotate_left(29);
    }
    (h ^ (h >> 31)) | 2
}

impl Sites {
    /// A table in fresh anonymous memory; `None` if it cannot be mapped.
    pub fn map() -> Option<Sites> {
        Some(Sites {
            keys: Mapped::new(CAPACITY)?,
            rows: Mapped::new(CAPACITY * ROW)?,
            counts: Mapped::new(CAPACITY * 4)?,
            dropped: AtomicU64::new(0),
        })
    }

    /// Forgets every entry (a restarted profile). Entries being written meanwhile may be
    /// lost or left with a cut chain.
    pub fn clear(&self) {
        self.keys.clear();
        self.rows.clear();
        self.counts.clear();
        self.dropped.store(0, Ordering::Relaxed);
    }

    /// The entry of `chain` (innermost first, cut to [`MAX_DEPTH`]) and `class`, added if new;
    /// `None` if the table is full around it (counted). Async-signal-safe.
    pub fn entry(&self, chain: &[u64], class: u64) -> Option<usize> {
        let chain = &chain[..chain.len().min(MAX_DEPTH)];
        let key = key_of(chain, class);
        let mut slot = key as usize;
        for _ in 0..PROBES {
            slot = (slot + 1) & (CAPACITY - 1);
            let cell = &self.keys[slot];
            match cell.load(Ordering::Acquire) {
                k if k == key && self.row_is(slot, chain, class) => return Some(slot),
                EMPTY
                    if cell
                        .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok() =>
                {
                    self.write_row(slot, chain, class);
                    cell.store(key, Ordering::Release);
                    return Some(slot);
                }
                _ => {}
            }
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        None
    }

    fn row(&self, slot: usize) -> &[AtomicU64] {
        &self.rows[slot * ROW..(slot + 1) * ROW]
    }

    fn write_row(&self, slot: usize, chain: &[u64], class: u64) {
        let row = self.row(slot);
        row[0].store(chain.len() as u64 | class << 32, Ordering::Relaxed);
        for (cell, &pc) in row[1..].iter().zip(chain) {
            cell.store(pc, Ordering::Relaxed);
        }
    }

    fn row_is(&self, slot: usize, chain: &[u64], class: u64) -> bool {
        let row = self.row(slot);
        row[0].load(Ordering::Relaxed) == (chain.len() as u64 | class << 32)
            && row[1..]
                .iter()
                .zip(chain)
                .all(|(cell, &pc)| cell.load(Ordering::Relaxed) == pc)
    }

    /// Counts an allocation of `size` bytes at entry `slot`. Async-signal-safe.
    pub fn allocated(&self, slot: usize, size: u64) {
        self.add(slot, 1, size);
    }

    /// Adds `objects` and `bytes` to the first two counters of entry `slot` (what other
    /// tables of this kind count there: a contention profile's waits and their delay).
    /// Async-signal-safe.
    pub fn add(&self, slot: usize, objects: u64, bytes: u64) {
        self.counts[slot * 4].fetch_add(objects, Ordering::Relaxed);
        self.counts[slot * 4 + 1].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts the free of an object of `size` bytes allocated at entry `slot`.
    /// Async-signal-safe.
    pub fn freed(&self, slot: usize, size: u64) {
        if slot < CAPACITY {
            self.counts[slot * 4 + 2].fetch_add(1, Ordering::Relaxed);
            self.counts[slot * 4 + 3].fetch_add(size, Ordering::Relaxed);
        }
    }

    /// Makes every entry's allocated counts what it still holds (allocated less freed), and
    /// its freed counts 0: a forked child's history starts at the fork, with the blocks it
    /// inherited. Async-signal-safe; for a single-threaded child (nothing else counts
    /// meanwhile).
    pub fn keep_only_in_use(&self) {
        for slot in 0..CAPACITY {
            if self.keys[slot].load(Ordering::Acquire) <= BUSY {
                continue;
            }
            let c = &self.counts[slot * 4..slot * 4 + 4];
            let freed = (c[2].swap(0, Ordering::Relaxed), c[3].swap(0, Ordering::Relaxed));
            let _ = c[0].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(freed.0))
            });
            let _ = c[1].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(freed.1))
            });
        }
    }

    /// Samples that found no entry.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Visits each published entry: its chain (innermost first), size class and counts. Not
    /// for the allocation path (the caller may allocate in `f`).
    pub fn for_each(&self, mut f: impl FnMut(&[u64], u64, SiteCounts)) {
        let mut chain = [0u64; MAX_DEPTH];
        for slot in 0..CAPACITY {
            let key = self.keys[slot].load(Ordering::Acquire);
            if key == EMPTY || key == BUSY {
                continue;
            }
            let row = self.row(slot);
            let head = row[0].load(Ordering::Relaxed);
            let len = ((head & 0xffff_ffff) as usize).min(MAX_DEPTH);
            for (out, cell) in chain.iter_mut().zip(&row[1..=len]) {
                *out = cell.load(Ordering::Relaxed);
            }
            let c = |i: usize| self.counts[slot * 4 + i].load(Ordering::Relaxed);
            f(
                &chain[..len],
                head >> 32,
                SiteCounts {
                    alloc_objects: c(0),
                    alloc_bytes: c(1),
                    freed_objects: c(2),
                    freed_bytes: c(3),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_keeps_what_is_in_use() {
        let sites = Sites::map().unwrap();
        let a = sites.entry(&[0x10, 0x20], 3).unwrap();
        sites.allocated(a, 100);
        sites.allocated(a, 100);
        sites.allocated(a, 100);
        sites.freed(a, 100);
        let b = sites.entry(&[0x30], 3).unwrap();
        sites.allocated(b, 8);
        sites.freed(b, 8);
        sites.keep_only_in_use();
        let mut seen = Vec::new();
        sites.for_each(|chain, _, c| seen.push((chain.to_vec(), c)));
        seen.sort_by_key(|(chain, _)| chain.clone());
        let held = |objects, bytes| SiteCounts {
            alloc_objects: objects,
            alloc_bytes: bytes,
            freed_objects: 0,
            freed_bytes: 0,
        };
        assert_eq!(seen, vec![(vec![0x10, 0x20], held(2, 200)), (vec![0x30], held(0, 0))]);
    }

    #[test]
    fn size_classes_split_powers_of_two_in_four() {
        assert_eq!(size_class(16), size_class(19));
        assert_ne!(size_class(16), size_class(20));
        assert_ne!(size_class(1 << 20), size_class(1 << 19));
        assert_eq!(size_class(0), size_class(1));
    }

    #[test]
    fn one_entry_per_chain_and_class() {
        let sites = Sites::map().unwrap();
        let a = sites.entry(&[1, 2, 3], 5).unwrap();
        assert_eq!(sites.entry(&[1, 2, 3], 5), Some(a));
        let b = sites.entry(&[1, 2, 3], 6).unwrap();
        assert_ne!(a, b);
        sites.allocated(a, 100);
        sites.allocated(a, 100);
        sites.freed(a, 100);
        let mut seen = Vec::new();
        sites.for_each(|chain, _, counts| seen.push((chain.to_vec(), counts)));
        seen.sort_by_key(|(_, c)| std::cmp::Reverse(c.alloc_objects));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, vec![1, 2, 3]);
        assert_eq!(
            (seen[0].1.alloc_objects, seen[0].1.alloc_bytes, seen[0].1.freed_bytes),
            (2, 200, 100)
        );
        sites.clear();
        let mut n = 0;
        sites.for_each(|_, _, _| n += 1);
        assert_eq!(n, 0);
    }

    #[test]
    fn threads_racing_on_one_chain_lose_nothing() {
        let sites = Sites::map().unwrap();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..10_000u64 {
                        if let Some(e) = sites.entry(&[i % 7, 42], 3) {
                            sites.allocated(e, 8);
                        }
                    }
                });
            }
        });
        let mut total = 0;
        sites.for_each(|_, _, c| total += c.alloc_objects);
        assert_eq!(total + sites.dropped(), 40_000);
    }
}
