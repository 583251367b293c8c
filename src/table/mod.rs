//! The call-chain table: a fixed-size, lock-free, set-associative hash table that merges
//! identical call chains, evicting the least-counted entry of a full bucket into an
//! [`EvictionRing`] for the writer thread. Every method used by signal handlers
//! ([`CallChainTable::record`]) is async-signal-safe: no allocation, no locks, no system calls,
//! no panics on any input. Several handlers may run it at once.
//!
//! Each entry has a state word `[tag:22][generation:8][count:32][state:2]` and a row of
//! `1 + max_depth` slots holding the chain's length and PCs. A row is written only by a thread
//! that moved the word to `BUSY` with a CAS, and becomes visible by the `Release` store of a
//! `READY` word whose generation is one more than before. Readers compare or copy a row
//! between loading the word and a CAS on that same word, so a row that was rewritten meanwhile
//! makes the CAS fail. The generation is what guarantees this: without it, an entry evicted and
//! refilled with the *same* chain and count during a copy restores the very same word, and the
//! CAS would accept a torn copy (found by the loom model below). The tag is only a prefilter
//! before the full comparison of rows.

mod ring;

pub use ring::EvictionRing;

/// The atomics the table is built from: std's, or loom's when model-checking
/// (see Cargo.toml for the command).
mod atomic {
    #[cfg(loom)]
    pub use loom::sync::atomic::{fence, AtomicU64, Ordering};
    #[cfg(not(loom))]
    pub use std::sync::atomic::{fence, AtomicU64, Ordering};
}

use atomic::{fence, AtomicU64, Ordering};

const EMPTY: u64 = 0;
const BUSY: u64 = 1;
const READY: u64 = 2;
const STATE_MASK: u64 = 3;
const COUNT_SHIFT: u32 = 2;
const COUNT_MAX: u64 = u32::MAX as u64;
const GENERATION_SHIFT: u32 = 34;
const GENERATION_MASK: u64 = 0xff;
const TAG_SHIFT: u32 = 42;
/// How often `record` retries after losing a race before it counts the sample as lost.
const MAX_ATTEMPTS: usize = 8;

/// Sizes of the table and its eviction ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableConfig {
    /// Number of buckets, rounded up to a power of two.
    pub buckets: usize,
    /// Entries per bucket.
    pub ways: usize,
    /// Longest chain stored, PC included; longer chains are cut.
    pub max_depth: usize,
    /// Capacity of the eviction ring in 8-byte slots.
    pub ring_slots: usize,
}

impl Default for TableConfig {
    /// gperftools' geometry: 1024 buckets of 4 entries, depth 254, a 2 MiB eviction buffer.
    fn default() -> Self {
        TableConfig {
            buckets: 1024,
            ways: 4,
            max_depth: 254,
            ring_slots: 4096 * Self::RING_SLOTS_PER_ENTRY,
        }
    }
}

impl TableConfig {
    /// Eviction ring slots per table entry in the default geometry.
    const RING_SLOTS_PER_ENTRY: usize = 64;

    /// The default geometry resized to hold `entries` call chains (rounded up to whole
    /// buckets of a power-of-two count), the eviction ring scaled with it.
    pub fn with_entries(self, entries: usize) -> Self {
        let ways = self.ways.max(1);
        let buckets = entries.div_ceil(ways).next_power_of_two().max(1);
        TableConfig {
            buckets,
            ring_slots: buckets * ways * Self::RING_SLOTS_PER_ENTRY,
            ..self
        }
    }

    /// Bytes of memory the table and ring reserve (pages are touched only when used).
    pub fn memory_bytes(&self) -> usize {
        let entries = self.buckets.next_power_of_two() * self.ways;
        8 * (entries * (2 + self.max_depth) + self.ring_slots.next_power_of_two())
    }
}

/// Counters kept by the table. `samples` counts sample weight offered to `record`; every unit
/// of it ends up either in the table, in an evicted record, or in `lost`.
#[derive(Debug, Default)]
pub struct TableStats {
    pub samples: AtomicU64,
    pub evictions: AtomicU64,
    pub lost: AtomicU64,
    /// Why: part of `lost`, by reason ([`Loss`]).
    pub lost_by: [AtomicU64; Loss::COUNT],
    /// Samples recorded at their function without its callers: no walk workspace was free
    /// (handlers preempted in great numbers on a loaded machine).
    pub without_callers: AtomicU64,
}

/// Why a sample was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Other handlers held every entry of the chain's bucket, attempt after attempt.
    Contention,
    /// The eviction ring was full: the writer did not drain it in time.
    RingFull,
    /// Recorded, but the file refused the records (full disk, size limit, descriptor taken).
    Unwritten,
}

impl Loss {
    pub const COUNT: usize = 3;
    pub const ALL: [Loss; Loss::COUNT] = [Loss::Contention, Loss::RingFull, Loss::Unwritten];

    /// What the stop's message says of it.
    pub fn reason(self) -> &'static str {
        match self {
            Loss::Contention => "the call-chain table's bucket held by other handlers",
            Loss::RingFull => "the eviction ring full",
            Loss::Unwritten => "refused by the file",
        }
    }
}

impl TableStats {
    /// Samples lost for `why`.
    pub fn lost_for(&self, why: Loss) -> u64 {
        self.lost_by[why as usize].load(Ordering::Relaxed)
    }

    fn add_lost(&self, weight: u64, why: Loss) {
        self.lost.fetch_add(weight, Ordering::Relaxed);
        self.lost_by[why as usize].fetch_add(weight, Ordering::Relaxed);
    }
}

pub struct CallChainTable {
    words: Box<[AtomicU64]>,
    /// Row `i` is `rows[i * row_len..][..row_len]`: `[len, pc0, pc1, ...]`.
    rows: Box<[AtomicU64]>,
    row_len: usize,
    ways: usize,
    bucket_mask: u64,
    ring: EvictionRing,
    pub stats: TableStats,
}

impl CallChainTable {
    pub fn new(config: TableConfig) -> Self {
        let buckets = config.buckets.next_power_of_two().max(1);
        let ways = config.ways.max(1);
        let max_depth = config.max_depth.max(1);
        // A record must fit in the ring, so the ring holds at least two of the longest.
        let ring_slots = config.ring_slots.max(2 * (max_depth + 2));
        CallChainTable {
            words: zeroed_atomics(buckets * ways),
            rows: zeroed_atomics(buckets * ways * (max_depth + 1)),
            row_len: max_depth + 1,
            ways,
            bucket_mask: buckets as u64 - 1,
            ring: EvictionRing::new(ring_slots, max_depth),
            stats: TableStats::default(),
        }
    }

    pub fn max_depth(&self) -> usize {
        self.row_len - 1
    }

    /// Capacity of the eviction ring, in slots (a record of n PCs takes n + 2).
    pub fn ring_capacity_slots(&self) -> usize {
        self.ring.capacity_slots()
    }

    /// Adds `weight` samples for the chain `pcs` (cut to `max_depth`). Async-signal-safe.
    pub fn record(&self, pcs: &[u64], weight: u64) {
        if pcs.is_empty() || weight == 0 {
            return;
        }
        let pcs = &pcs[..pcs.len().min(self.max_depth())];
        let weight = weight.min(COUNT_MAX);
        self.stats.samples.fetch_add(weight, Ordering::Relaxed);
        let hash = hash_chain(pcs);
        let tag = hash >> TAG_SHIFT;
        let first = ((hash & self.bucket_mask) as usize) * self.ways;
        let mut why = Loss::Contention;
        for _ in 0..MAX_ATTEMPTS {
            match self.try_record(first, tag, pcs, weight) {
                Attempt::Done => return,
                Attempt::RingFull => {
                    why = Loss::RingFull;
                    break;
                }
                Attempt::Raced => continue,
            }
        }
        self.stats.add_lost(weight, why);
    }

    /// Counts `weight` samples that were recorded here but that the file refused (they are
    /// already among `samples`). Async-signal-safe.
    pub fn count_unwritten(&self, weight: u64) {
        self.stats.add_lost(weight, Loss::Unwritten);
    }

    fn try_record(&self, first: usize, tag: u64, pcs: &[u64], weight: u64) -> Attempt {
        let mut free: Option<(usize, u64)> = None;
        let mut victim: Option<(usize, u64)> = None;
        for i in first..first + self.ways {
            let word = self.words[i].load(Ordering::Acquire);
            match word & STATE_MASK {
                EMPTY => free = free.or(Some((i, word))),
                READY => {
                    let count = word_count(word);
                    if word >> TAG_SHIFT == tag && count + weight <= COUNT_MAX && self.row_equals(i, pcs) {
                        let bumped = word + (weight << COUNT_SHIFT);
                        return match self.words[i].compare_exchange(word, bumped, Ordering::AcqRel, Ordering::Relaxed) {
                            Ok(_) => Attempt::Done,
                            Err(_) => Attempt::Raced,
                        };
                    }
                    if victim.is_none_or(|(_, w)| count < word_count(w)) {
                        victim = Some((i, word));
                    }
                }
                _ => {} // BUSY: another handler owns it.
            }
        }
        let Some((i, word)) = free.or(victim) else {
            return Attempt::Raced;
        };
        if self.words[i]
            .compare_exchange(word, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Attempt::Raced;
        }
        let count = word_count(word);
        if word & STATE_MASK == READY && count > 0 {
            if !self.ring.push(count, self.row_pcs(i)) {
                // Put the victim back untouched; the new sample is what gets lost.
                self.words[i].store(word, Ordering::Release);
                return Attempt::RingFull;
            }
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let row = self.row(i);
        row[0].store(pcs.len() as u64, Ordering::Relaxed);
        for (slot, &pc) in row[1..].iter().zip(pcs) {
            slot.store(pc, Ordering::Relaxed);
        }
        let generation = ((word >> GENERATION_SHIFT) + 1) & GENERATION_MASK;
        self.words[i].store(
            tag << TAG_SHIFT | generation << GENERATION_SHIFT | weight << COUNT_SHIFT | READY,
            Ordering::Release,
        );
        Attempt::Done
    }

    /// Hands every evicted record to `f` as `(count, pcs)`. Not for signal context.
    pub fn drain_evicted(&self, f: impl FnMut(u64, &[u64])) {
        self.ring.drain(f)
    }

    /// [`drain_evicted`](Self::drain_evicted) into `scratch` (at least
    /// [`max_depth`](Self::max_depth) long), without the consumer's lock: async-signal-safe.
    ///
    /// # Safety
    /// No other consumer drains the ring at the same time (the caller has the ring to itself:
    /// see `writer::threadless`).
    pub unsafe fn drain_evicted_exclusive(&self, scratch: &mut [u64], f: impl FnMut(u64, &[u64])) {
        // SAFETY: the caller's promise.
        unsafe { self.ring.drain_exclusive(scratch, f) }
    }

    /// Slots of the eviction ring in use (records waiting for the writer). Async-signal-safe.
    pub fn ring_used_slots(&self) -> usize {
        self.ring.used_slots()
    }

    /// Takes the counts accumulated in the table, handing each non-zero `(count, pcs)` to `f`.
    /// Chains stay in place with count 0, so a hot chain keeps its entry. Safe to run while
    /// handlers record; not for signal context.
    pub fn harvest(&self, f: impl FnMut(u64, &[u64])) {
        let mut chain = vec![0; self.max_depth()];
        self.harvest_with(&mut chain, f);
    }

    /// [`harvest`](Self::harvest) through `scratch` (at least [`max_depth`](Self::max_depth)
    /// long): async-signal-safe, for a process that has no writer thread yet.
    pub fn harvest_with(&self, scratch: &mut [u64], mut f: impl FnMut(u64, &[u64])) {
        for i in 0..self.words.len() {
            loop {
                let word = self.words[i].load(Ordering::Acquire);
                if word & STATE_MASK != READY || word_count(word) == 0 {
                    break;
                }
                let n = self.copy_row(i, scratch);
                let emptied = word & !(COUNT_MAX << COUNT_SHIFT);
                if self.words[i]
                    .compare_exchange(word, emptied, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    f(word_count(word), &scratch[..n]);
                    break;
                }
            }
        }
    }

    /// Hands each non-zero count in the table to `f` without taking it: what a harvest would
    /// take now, for a checkpoint's copy (`writer`). A row is copied between two loads
    /// of its word and kept only if the word did not change (the generation makes a refilled
    /// row differ); a row that keeps changing is left out of this copy. Async-signal-safe;
    /// `scratch` at least [`max_depth`](Self::max_depth) long.
    pub fn peek_with(&self, scratch: &mut [u64], mut f: impl FnMut(u64, &[u64])) {
        for i in 0..self.words.len() {
            for _ in 0..MAX_ATTEMPTS {
                let word = self.words[i].load(Ordering::Acquire);
                if word & STATE_MASK != READY || word_count(word) == 0 {
                    break;
                }
                let n = self.copy_row(i, scratch);
                // The row's loads complete before the word is loaded again (a seqlock's read).
                fence(Ordering::Acquire);
                if self.words[i].load(Ordering::Relaxed) == word {
                    f(word_count(word), &scratch[..n]);
                    break;
                }
            }
        }
    }

    /// Copies entry `i`'s chain into `scratch` (cut to its length); returns its length. The
    /// caller checks the entry's word around the copy.
    fn copy_row(&self, i: usize, scratch: &mut [u64]) -> usize {
        let row = self.row_pcs(i);
        for (dst, pc) in scratch.iter_mut().zip(row) {
            *dst = pc.load(Ordering::Relaxed);
        }
        row.len().min(scratch.len())
    }

    fn row(&self, i: usize) -> &[AtomicU64] {
        &self.rows[i * self.row_len..(i + 1) * self.row_len]
    }

    fn row_pcs(&self, i: usize) -> &[AtomicU64] {
        let row = self.row(i);
        let len = (row[0].load(Ordering::Relaxed) as usize).min(self.row_len - 1);
        &row[1..1 + len]
    }

    fn row_equals(&self, i: usize, pcs: &[u64]) -> bool {
        let stored = self.row_pcs(i);
        stored.len() == pcs.len() && stored.iter().zip(pcs).all(|(s, &p)| s.load(Ordering::Relaxed) == p)
    }
}

enum Attempt {
    Done,
    Raced,
    RingFull,
}

fn word_count(word: u64) -> u64 {
    (word >> COUNT_SHIFT) & COUNT_MAX
}

fn hash_chain(pcs: &[u64]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64 ^ pcs.len() as u64;
    for &pc in pcs {
        h = (h ^ pc).wrapping_mul(0xBF58_476D_1CE4_E5B9).rotate_left(29);
    }
    h ^ (h >> 31)
}

/// A slice of zeroed atomics from `alloc_zeroed`, so that untouched pages cost no memory.
#[cfg(not(loom))]
pub(crate) fn zeroed_atomics(n: usize) -> Box<[AtomicU64]> {
    let n = n.max(1);
    let layout = std::alloc::Layout::array::<AtomicU64>(n).expect("table size overflows");
    // SAFETY: the layout is non-empty; AtomicU64 is valid when all bytes are zero; the pointer
    // comes from the global allocator with this exact layout, as Box<[T]> requires.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut AtomicU64;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n))
    }
}

/// Loom's atomics cannot be made from zeroed memory.
#[cfg(loom)]
pub(crate) fn zeroed_atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n.max(1)).map(|_| AtomicU64::new(0)).collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn small(buckets: usize, ways: usize, ring_slots: usize) -> CallChainTable {
        CallChainTable::new(TableConfig {
            buckets,
            ways,
            max_depth: 16,
            ring_slots,
        })
    }

    /// Everything the table holds or evicted, summed per chain.
    fn contents(t: &CallChainTable) -> HashMap<Vec<u64>, u64> {
        let mut all = HashMap::new();
        let mut add = |c: u64, pcs: &[u64]| *all.entry(pcs.to_vec()).or_insert(0) += c;
        t.drain_evicted(&mut add);
        t.harvest(&mut add);
        all
    }

    #[test]
    fn identical_chains_merge() {
        let t = small(16, 4, 1024);
        for _ in 0..10 {
            t.record(&[1, 2, 3], 1);
        }
        t.record(&[1, 2], 3);
        t.record(&[1, 2, 3], 5);
        let c = contents(&t);
        assert_eq!(c, HashMap::from([(vec![1, 2, 3], 15), (vec![1, 2], 3)]));
        assert_eq!(t.stats.evictions.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn chains_longer_than_max_depth_are_cut() {
        let t = small(4, 1, 1024);
        let long: Vec<u64> = (1..100).collect();
        t.record(&long, 1);
        assert_eq!(contents(&t), HashMap::from([(long[..16].to_vec(), 1)]));
    }

    #[test]
    fn harvest_takes_counts_and_keeps_chains() {
        let t = small(16, 4, 1024);
        t.record(&[7, 8], 2);
        assert_eq!(contents(&t), HashMap::from([(vec![7, 8], 2)]));
        assert!(contents(&t).is_empty());
        t.record(&[7, 8], 1);
        assert_eq!(contents(&t), HashMap::from([(vec![7, 8], 1)]));
        assert_eq!(t.stats.evictions.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn peek_copies_counts_without_taking_them() {
        let t = small(16, 4, 1024);
        t.record(&[7, 8], 2);
        t.record(&[9], 1);
        let mut scratch = vec![0; t.max_depth()];
        let mut seen = HashMap::new();
        t.peek_with(&mut scratch, |c, p| *seen.entry(p.to_vec()).or_insert(0) += c);
        assert_eq!(seen, HashMap::from([(vec![7, 8], 2), (vec![9], 1)]));
        // Still there for the harvest; a harvested (zero) count is not copied.
        assert_eq!(contents(&t), seen);
        t.peek_with(&mut scratch, |_, p| panic!("{p:?} has no count"));
    }

    #[test]
    fn a_flood_of_distinct_chains_evicts_without_losing_or_doubling() {
        let t = small(8, 2, 1 << 16);
        let mut expected = HashMap::new();
        for i in 1..=20_000u64 {
            let chain = vec![i % 5000 + 1, i % 3 + 1];
            t.record(&chain, 1);
            *expected.entry(chain).or_insert(0) += 1;
            if i % 1000 == 0 {
                // The writer drains periodically; without it the ring would fill.
                let mut drained = HashMap::new();
                t.drain_evicted(|c, p| *drained.entry(p.to_vec()).or_insert(0) += c);
                for (k, v) in drained {
                    *expected.get_mut(&k).unwrap() -= v;
                }
            }
        }
        assert!(t.stats.evictions.load(Ordering::Relaxed) > 10_000);
        assert_eq!(t.stats.lost.load(Ordering::Relaxed), 0);
        expected.retain(|_, v| *v > 0);
        assert_eq!(contents(&t), expected);
    }

    #[test]
    fn a_full_ring_counts_lost_samples() {
        let t = small(1, 1, 64); // ring holds 64 slots = 3 evicted records of depth 16
        for i in 1..=100u64 {
            t.record(&(i..i + 16).collect::<Vec<_>>(), 1);
        }
        let lost = t.stats.lost.load(Ordering::Relaxed);
        let kept: u64 = contents(&t).values().sum();
        assert!(lost > 0);
        assert_eq!(kept + lost, 100);
    }

    #[test]
    fn many_threads_at_once_lose_and_double_nothing() {
        let t = Arc::new(small(64, 4, 1 << 14));
        let drained = Arc::new(std::sync::Mutex::new(HashMap::<Vec<u64>, u64>::new()));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drainer = {
            let (t, drained, done) = (t.clone(), drained.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    let mut d = drained.lock().unwrap();
                    t.drain_evicted(|c, p| *d.entry(p.to_vec()).or_insert(0) += c);
                    t.harvest(|c, p| *d.entry(p.to_vec()).or_insert(0) += c);
                }
            })
        };
        let threads: Vec<_> = (0..8u64)
            .map(|th| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut mine = HashMap::new();
                    let mut x = th + 1;
                    for _ in 0..100_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Shared hot chains plus a long tail of rare ones.
                        let chain = if x % 4 == 0 {
                            vec![x % 997 + 1, 5]
                        } else {
                            vec![x % 7 + 1, 9, 9]
                        };
                        t.record(&chain, 1 + (x >> 60));
                        *mine.entry(chain).or_insert(0) += 1 + (x >> 60);
                    }
                    mine
                })
            })
            .collect();
        let mut expected = HashMap::new();
        for th in threads {
            for (k, v) in th.join().unwrap() {
                *expected.entry(k).or_insert(0u64) += v;
            }
        }
        done.store(true, Ordering::Release);
        drainer.join().unwrap();
        let mut got = std::mem::take(&mut *drained.lock().unwrap());
        for (k, v) in contents(&t) {
            *got.entry(k).or_insert(0) += v;
        }
        let lost = t.stats.lost.load(Ordering::Relaxed);
        let offered: u64 = expected.values().sum();
        assert_eq!(t.stats.samples.load(Ordering::Relaxed), offered);
        assert_eq!(
            got.values().sum::<u64>() + lost,
            offered,
            "every sample is stored or counted lost"
        );
        for (k, v) in &got {
            assert!(
                expected.get(k).is_some_and(|e| v <= e),
                "chain {k:?} over-counted or invented"
            );
        }
    }
}

/// Model checks: every interleaving (up to loom's preemption bound) of handlers recording
/// into a one-entry table, forcing eviction races, while the writer drains and harvests.
#[cfg(all(test, loom))]
mod loom {
    use super::*;
    use ::loom::sync::Arc;
    use ::loom::thread;
    use std::collections::HashMap;

    fn collect(t: &CallChainTable, into: &mut HashMap<Vec<u64>, u64>) {
        let mut add = |c: u64, pcs: &[u64]| *into.entry(pcs.to_vec()).or_insert(0) += c;
        t.drain_evicted(&mut add);
        t.harvest(&mut add);
    }

    #[test]
    fn concurrent_records_evictions_and_harvests_lose_and_double_nothing() {
        ::loom::model(|| {
            let t = Arc::new(CallChainTable::new(TableConfig {
                buckets: 1,
                ways: 1,
                max_depth: 2,
                ring_slots: 64,
            }));
            let handlers: Vec<_> = [[1u64, 2], [3, 4]]
                .into_iter()
                .map(|chain| {
                    let t = t.clone();
                    thread::spawn(move || {
                        t.record(&chain, 1);
                        t.record(&[1, 2], 1);
                    })
                })
                .collect();
            let mut seen = HashMap::new();
            collect(&t, &mut seen); // the writer thread, concurrently
            for h in handlers {
                h.join().unwrap();
            }
            collect(&t, &mut seen);
            let lost = t.stats.lost.load(Ordering::Relaxed);
            let stored: u64 = seen.values().sum();
            assert_eq!(
                stored + lost,
                4,
                "every sample stored or counted lost: {seen:?}, lost {lost}"
            );
            assert!(seen.get(&vec![1, 2]).copied().unwrap_or(0) <= 3, "{seen:?}");
            assert!(seen.get(&vec![3, 4]).copied().unwrap_or(0) <= 1, "{seen:?}");
            assert!(
                seen.keys().all(|k| *k == vec![1, 2] || *k == vec![3, 4]),
                "no invented chain: {seen:?}"
            );
        });
    }
}
