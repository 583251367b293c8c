//! Which stack memory of an interrupted thread is known to be mapped, so that the common walk
//! needs no kernel-checked copy (no system call in the handler).
//!
//! The registry maps a thread's thread pointer (`%fs:0` on x86-64, `tpidr_el0` on aarch64, read without a system call)
//! to the range of its stack. It is filled outside signal context: the handler only *requests*
//! a thread it does not know, with the interrupted SP, and the writer thread resolves requests
//! against `/proc/self/maps`. A range is accepted only when it cannot disappear while the
//! thread runs on it:
//! * the main thread's `[stack]` mapping, vouched up to its end;
//! * a glibc thread stack: the thread's control block sits at the top of the mapping that
//!   holds its stack, so `[sp, thread pointer)` lies inside the thread's own stack block, which
//!   is not unmapped while the thread lives.
//!
//! Anything else (sigaltstacks, coroutine stacks, unknown threads) is read through the kernel
//! (`safe_read`).
//! A stale entry (thread exited, control block reused) is harmless: glibc places a reused
//! control block at the same stack top, and entries are used only when `lo <= sp < hi`.

use crate::arch::current_sp;
pub use crate::arch::thread_pointer;
use crate::format::Maps;
use crate::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SLOTS: usize = 1024;
const REQUEST_SLOTS: usize = 32;
const PROBE_LIMIT: usize = 16;
/// Key of a deleted slot: probing continues past it.
const TOMBSTONE: u64 = 1;
/// A thread whose stack could not be vouched for is not looked up again for this long.
const RETRY_UNRESOLVED: Duration = Duration::from_secs(5);

pub struct ThreadStacks {
    keys: [AtomicU64; SLOTS],
    los: [AtomicU64; SLOTS],
    his: [AtomicU64; SLOTS],
    request_tps: [AtomicU64; REQUEST_SLOTS],
    request_sps: [AtomicU64; REQUEST_SLOTS],
    /// Writer-side state: threads that could not be vouched for, and when.
    unresolved: Mutex<Vec<(u64, Instant)>>,
}

/// The process-wide registry.
pub static THREAD_STACKS: ThreadStacks = ThreadStacks::new();

impl ThreadStacks {
    const fn new() -> Self {
        ThreadStacks {
            keys: [const { AtomicU64::new(0) }; SLOTS],
            los: [const { AtomicU64::new(0) }; SLOTS],
            his: [const { AtomicU64::new(0) }; SLOTS],
            request_tps: [const { AtomicU64::new(0) }; REQUEST_SLOTS],
            request_sps: [const { AtomicU64::new(0) }; REQUEST_SLOTS],
            unresolved: Mutex::new(Vec::new()),
        }
    }

    /// The writer-side lock, held across `fork` (`session::children`).
    pub(crate) fn fork_lock(&'static self) -> &'static dyn crate::sync::ForkLock {
        &self.unresolved
    }

    /// The top of the memory vouched for above `sp` on the thread `tp`, if known.
    /// Async-signal-safe.
    pub fn vouched_top(&self, tp: u64, sp: u64) -> Option<u64> {
        let start = slot_of(tp);
        for i in 0..PROBE_LIMIT {
            let s = (start + i) % SLOTS;
            let key = self.keys[s].load(Ordering::Acquire);
            if key == 0 {
                return None;
            }
            if key != tp {
                continue;
            }
            let lo = self.los[s].load(Ordering::Relaxed);
            let hi = self.his[s].load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.keys[s].load(Ordering::Relaxed) != tp {
                return None;
            }
            return (lo <= sp && sp < hi).then_some(hi);
        }
        None
    }

    /// The thread pointer of the registered thread whose stack holds `sp`, if exactly one
    /// registered thread's does (stale entries of exited threads may overlap a new stack).
    /// Scans every slot: for the wall sampler, not for signal context.
    pub fn thread_at(&self, sp: u64) -> Option<u64> {
        let mut found = None;
        for s in 0..SLOTS {
            let key = self.keys[s].load(Ordering::Acquire);
            if key <= TOMBSTONE {
                continue;
            }
            let (lo, hi) = (self.los[s].load(Ordering::Relaxed), self.his[s].load(Ordering::Relaxed));
            std::sync::atomic::fence(Ordering::Acquire);
            if self.keys[s].load(Ordering::Relaxed) != key || !(lo <= sp && sp < hi) {
                continue;
            }
            match found {
                Some(other) if other != key => return None,
                _ => found = Some(key),
            }
        }
        found
    }

    /// Asks the writer thread to find `tp`'s stack. Best effort; async-signal-safe.
    pub fn request(&self, tp: u64, sp: u64) {
        for i in 0..REQUEST_SLOTS {
            let cur = self.request_tps[i].load(Ordering::Relaxed);
            if cur == tp {
                return;
            }
            if cur == 0
                && self.request_tps[i]
                    .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.request_sps[i].store(sp, Ordering::Release);
                return;
            }
        }
    }

    /// Resolves pending requests against the current mappings. Not for signal context.
    pub fn resolve_requests(&self) {
        let mut unresolved = self.unresolved.lock();
        unresolved.retain(|(_, since)| since.elapsed() < RETRY_UNRESOLVED);
        let mut maps: Option<Maps> = None;
        for i in 0..REQUEST_SLOTS {
            let tp = self.request_tps[i].load(Ordering::Relaxed);
            let sp = self.request_sps[i].load(Ordering::Acquire);
            if tp == 0 || sp == 0 {
                continue;
            }
            if !unresolved.iter().any(|&(t, _)| t == tp) {
                let maps = maps.get_or_insert_with(|| Maps::parse(&crate::in_program::procfs::read_self_maps()));
                match vouchable_range(maps, tp, sp) {
                    Some((lo, hi)) => self.insert(tp, lo, hi),
                    None => unresolved.push((tp, Instant::now())),
                }
            }
            self.request_sps[i].store(0, Ordering::Relaxed);
            self.request_tps[i].store(0, Ordering::Release);
        }
    }

    /// Records the current thread's stack directly (used when a thread registers itself).
    pub fn register_current_thread(&self) {
        let sp = current_sp();
        let maps = Maps::parse(&crate::in_program::procfs::read_self_maps());
        if let Some((lo, hi)) = vouchable_range(&maps, thread_pointer(), sp) {
            let _guard = self.unresolved.lock();
            self.insert(thread_pointer(), lo, hi);
        }
    }

    /// Inserts or replaces `tp`'s range. Callers hold `self.unresolved` (one writer at a time).
    fn insert(&self, tp: u64, lo: u64, hi: u64) {
        let start = slot_of(tp);
        let mut free = None;
        for i in 0..PROBE_LIMIT {
            let s = (start + i) % SLOTS;
            let key = self.keys[s].load(Ordering::Relaxed);
            if key == tp {
                // Retire the old slot rather than rewrite it under a reader's feet.
                self.keys[s].store(TOMBSTONE, Ordering::Release);
            } else if free.is_none() && (key == 0 || key == TOMBSTONE) {
                free = Some(s);
            }
            if key == 0 {
                break;
            }
        }
        let Some(s) = free else {
            // The neighbourhood is full of other threads (many dead): forget everything; walks
            // read through the kernel until threads are requested again.
            for key in &self.keys {
                key.store(0, Ordering::Release);
            }
            return self.insert(tp, lo, hi);
        };
        self.los[s].store(lo, Ordering::Relaxed);
        self.his[s].store(hi, Ordering::Relaxed);
        self.keys[s].store(tp, Ordering::Release);
    }
}

/// The range a stack walk may trust for thread `tp` interrupted at `sp`, per the module rules.
fn vouchable_range(maps: &Maps, tp: u64, sp: u64) -> Option<(u64, u64)> {
    let vma = maps
        .entries
        .iter()
        .find(|e| e.contains(sp) && e.perms.starts_with("rw"))?;
    if vma.path == "[stack]" {
        Some((vma.start, vma.end))
    } else if vma.contains(tp) && sp < tp {
        Some((vma.start, tp))
    } else {
        None
    }
}

fn slot_of(tp: u64) -> usize {
    ((tp >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_threads_are_resolved_and_vouched() {
        let registry: &'static ThreadStacks = Box::leak(Box::new(ThreadStacks::new()));
        std::thread::spawn(move || {
            let (tp, sp) = (thread_pointer(), current_sp());
            assert_eq!(registry.vouched_top(tp, sp), None);
            registry.request(tp, sp);
            registry.resolve_requests();
            let top = registry.vouched_top(tp, sp).expect("a pthread stack is vouchable");
            assert_eq!(top, tp);
            assert_eq!(registry.vouched_top(tp, tp + 8), None, "sp outside the range");
            assert_eq!(registry.vouched_top(tp ^ 0x1000, sp), None, "another thread");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn unvouchable_stacks_stay_unknown() {
        let registry = ThreadStacks::new();
        let heap = vec![0u64; 1024];
        let fake_sp = heap.as_ptr() as u64 + 64;
        registry.request(thread_pointer(), fake_sp);
        registry.resolve_requests();
        assert_eq!(registry.vouched_top(thread_pointer(), fake_sp), None);
    }

    #[test]
    fn full_neighbourhoods_are_reset_not_overflowed() {
        let registry = ThreadStacks::new();
        let base = 0x7000_0000_0000u64;
        for i in 0..5000u64 {
            let tp = base + i * 0x10_0000;
            let _g = registry.unresolved.lock();
            registry.insert(tp, tp - 0x1000, tp);
        }
        let last = base + 4999 * 0x10_0000;
        assert_eq!(registry.vouched_top(last, last - 8), Some(last));
    }
}
