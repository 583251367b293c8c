//! The sampled blocks still allocated, by address, so that their `free` (or `realloc`) takes
//! them out of the in-use counts. Every `free` of the program asks; almost every answer is
//! "not sampled", and it is made cheap: a byte per page of the address space (folded into
//! 64 Ki slots, 64 KiB in all) counts the sampled blocks that begin there, so an unsampled
//! free reads that one byte. By page, not by a hash of the address: a program frees blocks
//! near the ones it just freed or touched, so the bytes it reads share a few cache lines (128
//! pages' worth each), where a hashed index read a random line of the 64 KiB each time and
//! missed the L1 cache under python3's working set (measured: 63 % of `free`'s own time on that
//! read). The blocks themselves are kept in buckets by a hash of the address, each one cache
//! line of eight addresses, filled and emptied with CAS: no lock, no probing chains, nothing
//! to rehash. A block that finds its bucket full is not tracked (counted in
//! [`Blocks::untracked`]): it stays "in use" in the profile.
//!
//! Why this is sound without locks: a block is added after the allocator returned it and
//! removed before it is given back, so its add happens before its removal (the program's
//! own ordering between the allocating and the freeing thread), and its address cannot be
//! handed out again while it is here. A page's count is changed by one atomic
//! read-modify-write per block, so it is exact; one that reaches 255 stays there (a page
//! whose frees all take the slow path), never wrapping to a wrong zero.

use super::mapped::Mapped;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const BUCKETS: usize = 1 << 16;
const WAYS: usize = 8;
/// Page slots: 64 Ki pages of 4 KiB, 256 MiB of address space before the index folds.
const PAGE_SLOTS: usize = 1 << 16;
const PAGE_SHIFT: u32 = 12;

pub struct Blocks {
    addresses: Mapped<AtomicU64>,
    /// Per slot: `(site + 1) | size << 17`, 0 if unknown.
    values: Mapped<AtomicU64>,
    /// Per page slot: tracked blocks that begin in its pages (255: at least that many).
    pages: Mapped<AtomicU8>,
    untracked: AtomicU64,
}

/// A removed block: where it was allocated and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Removed {
    pub site: usize,
    pub size: u64,
}

fn bucket_of(address: u64) -> usize {
    // Allocations are 16-byte aligned at least: the low bits say nothing.
    let h = (address >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 48) as usize & (BUCKETS - 1)
}

/// The page slot of `address`: its page number, the bits above 256 MiB folded in so that
/// regions 256 MiB apart (glibc's 64 MiB-aligned thread arenas) do not share every slot.
#[inline(always)]
fn page_slot(address: u64) -> usize {
    let page = address >> PAGE_SHIFT;
    (page ^ (page >> 16)) as usize & (PAGE_SLOTS - 1)
}

impl Blocks {
    pub fn map() -> Option<Blocks> {
        Some(Blocks {
            addresses: Mapped::new(BUCKETS * WAYS)?,
            values: Mapped::new(BUCKETS * WAYS)?,
            pages: Mapped::new(PAGE_SLOTS)?,
            untracked: AtomicU64::new(0),
        })
    }

    /// Forgets every block (a restarted profile).
    pub fn clear(&self) {
        self.addresses.clear();
        self.values.clear();
        self.pages.clear();
        self.untracked.store(0, Ordering::Relaxed);
    }

    fn count_of(&self, address: u64) -> &AtomicU8 {
        &self.pages[page_slot(address)]
    }

    /// Remembers the sampled block at `address` of `size` bytes, allocated at `site`.
    /// Async-signal-safe.
    pub fn add(&self, address: u64, size: u64, site: usize) {
        let bucket = bucket_of(address);
        for slot in bucket * WAYS..(bucket + 1) * WAYS {
            if self.addresses[slot]
                .compare_exchange(0, address, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                let value = (site as u64 + 1) & 0x1_ffff | size.min(u64::MAX >> 17) << 17;
                self.values[slot].store(value, Ordering::Relaxed);
                // Saturates: a count that reached the top stays there.
                let _ = self
                    .count_of(address)
                    .fetch_update(Ordering::Release, Ordering::Relaxed, |n| n.checked_add(1));
                return;
            }
        }
        self.untracked.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the block at `address` may have been sampled: false for almost every block,
    /// answered by reading one byte. Async-signal-safe.
    #[inline(always)]
    pub fn may_hold(&self, address: u64) -> bool {
        self.count_of(address).load(Ordering::Acquire) != 0
    }

    /// Takes the block at `address` out, if it was sampled. Async-signal-safe; the common
    /// answer (`None`) reads one byte.
    #[inline]
    pub fn remove(&self, address: u64) -> Option<Removed> {
        if !self.may_hold(address) {
            return None;
        }
        self.remove_from(bucket_of(address), address)
    }

    #[cold]
    fn remove_from(&self, bucket: usize, address: u64) -> Option<Removed> {
        for slot in bucket * WAYS..(bucket + 1) * WAYS {
            let cell = &self.addresses[slot];
            if cell.load(Ordering::Relaxed) != address {
                continue;
            }
            let value = self.values[slot].swap(0, Ordering::Relaxed);
            if cell
                .compare_exchange(address, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                return None;
            }
            // A cleared table (restart) may read 0 here: never wrap below it; and a saturated
            // count no longer knows how many it holds.
            let _ = self
                .count_of(address)
                .fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
                    (n != u8::MAX).then(|| n.checked_sub(1)).flatten()
                });
            let site = (value & 0x1_ffff) as usize;
            return (site != 0).then(|| Removed {
                site: site - 1,
                size: value >> 17,
            });
        }
        None
    }

    /// Sampled blocks that found their bucket full.
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_removes() {
        let blocks = Blocks::map().unwrap();
        blocks.add(0x1000, 64, 3);
        assert_eq!(blocks.remove(0x2000), None);
        assert_eq!(blocks.remove(0x1000), Some(Removed { site: 3, size: 64 }));
        assert_eq!(blocks.remove(0x1000), None);
    }

    #[test]
    fn a_full_bucket_counts_what_it_cannot_keep() {
        let blocks = Blocks::map().unwrap();
        // Addresses in one bucket: search for them.
        let target = bucket_of(0x10);
        let same: Vec<u64> = (1..)
            .map(|i| i * 16)
            .filter(|&a| bucket_of(a) == target)
            .take(WAYS + 2)
            .collect();
        for &a in &same {
            blocks.add(a, 16, 0);
        }
        assert_eq!(blocks.untracked(), 2);
        for &a in &same[..WAYS] {
            assert!(blocks.remove(a).is_some());
        }
        assert!(same.iter().all(|&a| !blocks.may_hold(a)));
    }

    /// Blocks in one page are counted by its byte; a neighbouring page's blocks are not
    /// asked about; a count past 255 stays "maybe" for good, and every block is still found.
    #[test]
    fn pages_count_their_blocks_and_saturate() {
        let blocks = Blocks::map().unwrap();
        let page = 0x7f00_1234_5000u64;
        blocks.add(page + 0x40, 32, 1);
        assert!(blocks.may_hold(page + 0x80), "the same page");
        assert!(!blocks.may_hold(page + 4096), "the next page");
        assert_eq!(blocks.remove(page + 0x40).map(|r| r.site), Some(1));
        assert!(!blocks.may_hold(page + 0x40));
        // 256 blocks of 16 bytes in one page: the count saturates.
        for i in 0..256 {
            blocks.add(page + i * 16, 16, 2);
        }
        assert_eq!(blocks.untracked(), 0);
        for i in 0..256 {
            assert!(blocks.remove(page + i * 16).is_some(), "block {i}");
        }
        assert!(blocks.may_hold(page), "saturated: stays a maybe");
    }

    #[test]
    fn threads_add_and_remove_their_own_blocks() {
        let blocks = Blocks::map().unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let blocks = &blocks;
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let a = (t << 40) | (i << 4);
                        blocks.add(a, i, 1);
                        assert_eq!(blocks.remove(a).map(|r| r.size), Some(i));
                    }
                });
            }
        });
        assert_eq!(blocks.untracked(), 0);
    }
}
