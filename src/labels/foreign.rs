//! Label sets that the program laid out in its own memory for any profiler to read (the
//! custom-labels ABI, [`super::custom_labels`]), interned from the signal handler.
//!
//! cpuprof's own sets are interned by the program's threads ([`super::LabelSet::new`], with a
//! lock and an allocation), so a sample carries a number. A set found in the program's memory
//! has no number yet, and the handler cannot lock or allocate: it hashes the set's strings
//! (read through `/proc/self/mem`, which never faults) and looks the hashes up in a fixed,
//! lock-free table; a set seen for the first time claims an empty slot with one
//! compare-and-swap and copies its strings into a fixed arena, reserved with one fetch-add.
//! The slot is published (its hash stored with `Release`) only once the copy is complete; the
//! writer thread turns a published slot into a [`LabelSet`] when it writes the profile.
//!
//! A set is its pairs, whatever their order in the program's array: the hash of a set is the
//! sum of its pairs' hashes. Two hashes of 64 bits each must match. Two handlers meeting the
//! same new set at once may each claim a slot: the set then has two numbers with the same
//! pairs, which every reader merges (samples are merged by their labels' text).
//!
//! Bounded: [`SLOTS`] sets and [`ARENA`] bytes of strings per process; a new set beyond
//! either is the over-the-cap set and counted ([`super::losses`]), as are keys and values cut
//! to [`super::MAX_KEY`] and [`super::MAX_VALUE`] bytes and pairs beyond [`super::MAX_PAIRS`].

use super::{LabelSet, MAX_KEY, MAX_PAIRS, MAX_VALUE};
use crate::unwind::safe_read;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Numbers of these sets are `FIRST_ID + slot`, above every number of cpuprof's own sets.
pub(super) const FIRST_ID: u32 = 1 << 24;
/// Distinct sets a process can intern this way.
pub(super) const SLOTS: usize = 4096;
/// Slots tried for one set before it counts as over the cap (the table is then crowded).
const PROBES: usize = 64;
/// Bytes for the sets' strings.
pub(super) const ARENA: usize = 1 << 20;

/// Slot states below every real hash (hashes are raised above them).
const EMPTY: u64 = 0;
const CLAIMED: u64 = 1;
const ABANDONED: u64 = 2;
/// `start` of a slot whose set found the arena full: it stands for the over-the-cap set.
const NO_ROOM: u32 = u32::MAX;

struct Slot {
    /// `EMPTY`, `CLAIMED` (being filled), `ABANDONED` (the copy failed), or the set's hash
    /// once its strings are in the arena.
    hash: AtomicU64,
    /// The second hash, written before `hash` is published.
    check: AtomicU64,
    /// Where the set's encoding starts in the arena, and its length.
    start: AtomicU32,
    len: AtomicU32,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        hash: AtomicU64::new(EMPTY),
        check: AtomicU64::new(0),
        start: AtomicU32::new(0),
        len: AtomicU32::new(0),
    }
}; SLOTS];

/// The strings of published sets: pair count, then per pair the key's and value's lengths
/// (two bytes each, little-endian) and their bytes. Each range is written by the one handler
/// that reserved it, before its slot is published, and only read after.
struct Arena(UnsafeCell<[u8; ARENA]>);
// SAFETY: disjoint ranges, each written once by its reserver before a Release store that
// every reader acquires (see above).
unsafe impl Sync for Arena {}
static BYTES: Arena = Arena(UnsafeCell::new([0; ARENA]));
static USED: AtomicUsize = AtomicUsize::new(0);

/// The writer's [`LabelSet`]s for published slots, made on first use.
static MADE: [AtomicPtr<LabelSet>; SLOTS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];

/// Where one pair of a set lies in the program's memory.
#[derive(Clone, Copy, Default)]
pub(super) struct PairAt {
    pub key: u64,
    pub key_len: usize,
    pub value: u64,
    pub value_len: usize,
}

/// A pair as hashed: its strings' addresses and lengths (cut to the caps) and hashes.
#[derive(Clone, Copy, Default)]
struct Hashed {
    at: PairAt,
    key_hash: u64,
    pair: (u64, u64),
}

/// What [`intern`] made of a set.
pub(super) enum Interned {
    /// Its number.
    Id(u32),
    /// Over a cap: the over-the-cap set stands for it.
    OverCap,
    /// Its strings could not be read, or changed while they were copied: no labels.
    Unreadable,
}

/// The number of the set of `pairs` (in the program's memory; a later pair with a key seen
/// before is ignored, as the custom-labels ABI says), interning it if it is new.
/// Async-signal-safe: reads through `/proc/self/mem`, no lock, no allocation.
pub(super) fn intern(pairs: &[PairAt]) -> Interned {
    let mut kept = [Hashed::default(); MAX_PAIRS];
    let mut n = 0;
    for &at in pairs {
        let Some(key_hash) = hash_string(at.key, at.key_len, MAX_KEY) else {
            return Interned::Unreadable;
        };
        if kept[..n].iter().any(|k| k.key_hash == key_hash.0) {
            continue;
        }
        if n == MAX_PAIRS {
            super::CUT.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Some(value_hash) = hash_string(at.value, at.value_len, MAX_VALUE) else {
            return Interned::Unreadable;
        };
        if at.key_len > MAX_KEY || at.value_len > MAX_VALUE {
            super::CUT.fetch_add(1, Ordering::Relaxed);
        }
        let at = PairAt {
            key_len: at.key_len.min(MAX_KEY),
            value_len: at.value_len.min(MAX_VALUE),
            ..at
        };
        kept[n] = Hashed {
            at,
            key_hash: key_hash.0,
            pair: (mix(key_hash.0, value_hash.0), mix(key_hash.1 ^ 0x9e37, value_hash.1)),
        };
        n += 1;
    }
    let kept = &kept[..n];
    if kept.is_empty() {
        return Interned::Unreadable;
    }
    let (hash, check) = set_hashes(kept);
    let first = hash as usize % SLOTS;
    for probe in 0..PROBES {
        let index = (first + probe) % SLOTS;
        let slot = &TABLE[index];
        let mut state = slot.hash.load(Ordering::Acquire);
        if state == EMPTY {
            match slot
                .hash
                .compare_exchange(EMPTY, CLAIMED, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return fill(index, kept, hash, check),
                Err(now) => state = now,
            }
        }
        if state == hash && slot.check.load(Ordering::Relaxed) == check {
            return match slot.start.load(Ordering::Relaxed) {
                NO_ROOM => Interned::OverCap,
                _ => Interned::Id(FIRST_ID + index as u32),
            };
        }
    }
    super::OVER_CAP.fetch_add(1, Ordering::Relaxed);
    Interned::OverCap
}

/// Copies `kept`'s strings into the arena for the slot `index` just claimed, checks that
/// they are what was hashed, and publishes the slot.
fn fill(index: usize, kept: &[Hashed], hash: u64, check: u64) -> Interned {
    let slot = &TABLE[index];
    let len = 1 + kept.iter().map(|k| 4 + k.at.key_len + k.at.value_len).sum::<usize>();
    let start = USED.fetch_add(len, Ordering::Relaxed);
    if start + len > ARENA {
        super::OVER_CAP.fetch_add(1, Ordering::Relaxed);
        slot.start.store(NO_ROOM, Ordering::Relaxed);
        slot.check.store(check, Ordering::Relaxed);
        slot.hash.store(hash, Ordering::Release);
        return Interned::OverCap;
    }
    // SAFETY: `start..start + len` was reserved for this call alone, inside the arena.
    let out = unsafe { std::slice::from_raw_parts_mut((BYTES.0.get() as *mut u8).add(start), len) };
    out[0] = kept.len() as u8;
    let mut at = 1;
    let mut copied = [Hashed::default(); MAX_PAIRS];
    for (k, c) in kept.iter().zip(copied.iter_mut()) {
        let (kl, vl) = (k.at.key_len, k.at.value_len);
        out[at..at + 2].copy_from_slice(&(kl as u16).to_le_bytes());
        out[at + 2..at + 4].copy_from_slice(&(vl as u16).to_le_bytes());
        let key = at + 4..at + 4 + kl;
        let value = key.end..key.end + vl;
        at = value.end;
        let read_key = safe_read::copy_bytes_in_handler(k.at.key, &mut out[key.clone()]);
        let read_value = safe_read::copy_bytes_in_handler(k.at.value, &mut out[value.clone()]);
        if read_key != kl || read_value != vl {
            slot.hash.store(ABANDONED, Ordering::Release);
            return Interned::Unreadable;
        }
        let (kh, vh) = (bytes_hashes(&out[key]), bytes_hashes(&out[value]));
        c.pair = (mix(kh.0, vh.0), mix(kh.1 ^ 0x9e37, vh.1));
    }
    // What was copied must be what was hashed: another thread may have changed the strings.
    if set_hashes(&copied[..kept.len()]) != (hash, check) {
        slot.hash.store(ABANDONED, Ordering::Release);
        return Interned::Unreadable;
    }
    slot.start.store(start as u32, Ordering::Relaxed);
    slot.len.store(len as u32, Ordering::Relaxed);
    slot.check.store(check, Ordering::Relaxed);
    slot.hash.store(hash, Ordering::Release);
    Interned::Id(FIRST_ID + index as u32)
}

/// The set numbered `id` (a number [`intern`] gave), made into a [`LabelSet`] on first use.
/// For the writer thread: allocates.
pub(super) fn by_id(id: u32) -> Option<&'static LabelSet> {
    let index = id.checked_sub(FIRST_ID)? as usize;
    let slot = TABLE.get(index)?;
    if slot.hash.load(Ordering::Acquire) <= ABANDONED {
        return None;
    }
    let made = MADE[index].load(Ordering::Acquire);
    // SAFETY: published from a leaked box, never freed.
    if let Some(set) = unsafe { made.as_ref() } {
        return Some(set);
    }
    let (start, len) = match slot.start.load(Ordering::Relaxed) {
        NO_ROOM => return Some(super::over_cap_set()),
        start => (start as usize, slot.len.load(Ordering::Relaxed) as usize),
    };
    // SAFETY: a published range, never written again.
    let bytes = unsafe { std::slice::from_raw_parts((BYTES.0.get() as *const u8).add(start), len) };
    let mut pairs = decode(bytes);
    pairs.sort();
    let set = Box::into_raw(Box::new(LabelSet {
        id,
        pairs: pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
    }));
    match MADE[index].compare_exchange(std::ptr::null_mut(), set, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just leaked.
        Ok(_) => Some(unsafe { &*set }),
        Err(theirs) => {
            // SAFETY: ours was never shared; theirs is leaked and published.
            unsafe {
                drop(Box::from_raw(set));
                Some(&*theirs)
            }
        }
    }
}

/// The pairs of an arena encoding; bytes that are not UTF-8 are replaced (U+FFFD).
fn decode(bytes: &[u8]) -> Vec<(String, String)> {
    let count = bytes.first().copied().unwrap_or(0) as usize;
    let mut pairs = Vec::with_capacity(count);
    let mut at = 1;
    for _ in 0..count {
        let kl = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
        let vl = u16::from_le_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
        let key = &bytes[at + 4..at + 4 + kl];
        let value = &bytes[at + 4 + kl..at + 4 + kl + vl];
        at += 4 + kl + vl;
        pairs.push((
            String::from_utf8_lossy(key).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    pairs
}

/// The two hashes of the first `max` bytes of the `len` at `addr`, read through the kernel.
fn hash_string(addr: u64, len: usize, max: usize) -> Option<(u64, u64)> {
    let mut buf = [0u8; MAX_VALUE];
    let len = len.min(max);
    (safe_read::copy_bytes_in_handler(addr, &mut buf[..len]) == len).then(|| bytes_hashes(&buf[..len]))
}

/// A set's two hashes: sums of its pairs', so the pairs' order does not matter; raised above
/// the slot states.
fn set_hashes(pairs: &[Hashed]) -> (u64, u64) {
    let (mut a, mut b) = (pairs.len() as u64, 0u64);
    for p in pairs {
        a = a.wrapping_add(p.pair.0);
        b = b.wrapping_add(p.pair.1);
    }
    (a.max(ABANDONED + 1), b)
}

/// Two independent 64-bit hashes of `bytes` (FNV-1a, and a multiply-rotate over words).
fn bytes_hashes(bytes: &[u8]) -> (u64, u64) {
    let mut fnv = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        fnv = (fnv ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut words = bytes.len() as u64;
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        words = mix(words, u64::from_le_bytes(w));
    }
    (fnv, words)
}

fn mix(a: u64, b: u64) -> u64 {
    (a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .rotate_left(29)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(key: &'static str, value: &'static str) -> PairAt {
        PairAt {
            key: key.as_ptr() as u64,
            key_len: key.len(),
            value: value.as_ptr() as u64,
            value_len: value.len(),
        }
    }

    fn id(pairs: &[PairAt]) -> u32 {
        match intern(pairs) {
            Interned::Id(id) => id,
            _ => panic!("not interned"),
        }
    }

    #[test]
    fn a_set_is_its_pairs_whatever_their_order_and_later_duplicates() {
        safe_read::acquire().unwrap();
        let a = id(&[at("endpoint", "/foreign-a"), at("tenant", "acme")]);
        let again = id(&[
            at("tenant", "acme"),
            at("endpoint", "/foreign-a"),
            at("tenant", "other"),
        ]);
        assert_eq!(a, again);
        let b = id(&[at("endpoint", "/foreign-b"), at("tenant", "acme")]);
        assert_ne!(a, b);
        let set = by_id(a).unwrap();
        assert_eq!(
            set.pairs().collect::<Vec<_>>(),
            vec![("endpoint", "/foreign-a"), ("tenant", "acme")]
        );
        assert!(std::ptr::eq(by_id(a).unwrap(), set));
        assert!(by_id(FIRST_ID + SLOTS as u32).is_none());
        safe_read::release();
    }

    #[test]
    fn unreadable_strings_give_no_set() {
        safe_read::acquire().unwrap();
        let bad = PairAt {
            key: 8,
            key_len: 4,
            ..at("k", "v")
        };
        assert!(matches!(intern(&[bad]), Interned::Unreadable));
        safe_read::release();
    }
}
