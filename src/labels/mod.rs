//! Labels on CPU samples: which endpoint, tenant or trace the CPU time went to.
//!
//! A [`LabelSet`] is an immutable, interned set of key/value strings ([`LabelSet::new`]); a
//! thread's current set is one number in its TLS slot, which the signal handler copies into
//! the sample: no string copy, no lock, no allocation, no lazily created thread-local
//! (`arch::thread_labels`). Installing a set ([`LabelSet::enter`], [`with`], [`swap`]) is a
//! load and a store. Sets are never freed: a sample that names one can be written whenever.
//!
//! Bounded: at most [`MAX_SETS`] distinct sets in a process (a set interned beyond that is the
//! one set `cpuprof.labels=over-cap`, and counted), at most [`MAX_PAIRS`] pairs per set,
//! keys of [`MAX_KEY`] bytes and values of [`MAX_VALUE`] bytes (longer ones are cut at a
//! character boundary, and counted). [`losses`] says what fell over the caps; profiles say it
//! too.
//!
//! Labels the program set through the custom-labels ABI (for eBPF profilers) are read too
//! ([`custom_labels`]), on threads with no cpuprof set installed.
//!
//! ```
//! let checkout = cpuprof::labels::LabelSet::new(&[("endpoint", "/checkout")]);
//! let total = cpuprof::labels::with(checkout, || (0..1000u64).sum::<u64>());
//! assert_eq!(total, 499_500);
//! ```

pub mod custom_labels;
mod foreign;
mod future;
#[cfg(feature = "tracing")]
mod tracing_layer;

pub use future::{Labelled, WithLabels};
#[cfg(feature = "tracing")]
pub use tracing_layer::LabelLayer;

use crate::sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Distinct label sets a process can intern (numbers 1 to `MAX_SETS - 1`; the last is the
/// over-the-cap set).
pub const MAX_SETS: usize = 1 << 14;
/// Distinct sets read through the custom-labels ABI that a process can intern.
pub const MAX_FOREIGN_SETS: usize = foreign::SLOTS;
/// Pairs kept per set; further pairs are dropped (counted as cut).
pub const MAX_PAIRS: usize = 16;
/// Bytes kept of a key.
pub const MAX_KEY: usize = 64;
/// Bytes kept of a value (a W3C trace id is 32).
pub const MAX_VALUE: usize = 256;

/// An interned, immutable set of labels, valid for the life of the process.
#[derive(Debug)]
pub struct LabelSet {
    id: u32,
    pairs: Box<[(Box<str>, Box<str>)]>,
}

/// The sets by number, for the handler-free lookups of [`swap`] and the writer.
static BY_ID: [AtomicPtr<LabelSet>; MAX_SETS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_SETS];
/// The interned sets by their pairs.
type Registry = HashMap<Vec<(String, String)>, &'static LabelSet>;
static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static OVER_CAP: AtomicU64 = AtomicU64::new(0);
static CUT: AtomicU64 = AtomicU64::new(0);
const OVER_CAP_ID: u32 = MAX_SETS as u32 - 1;

impl LabelSet {
    /// The set of `pairs` (a later pair replaces an earlier one of the same key), interned:
    /// the same pairs give the same set. Takes a lock; not for signal handlers. Install it
    /// with [`LabelSet::enter`], [`with`] or [`swap`].
    pub fn new<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> &'static LabelSet {
        let mut kept: Vec<(String, String)> = Vec::with_capacity(pairs.len().min(MAX_PAIRS));
        for (k, v) in pairs {
            let (k, v) = (cut(k.as_ref(), MAX_KEY), cut(v.as_ref(), MAX_VALUE));
            if let Some(pair) = kept.iter_mut().find(|(key, _)| *key == k) {
                pair.1 = v;
            } else if kept.len() < MAX_PAIRS {
                kept.push((k, v));
            } else {
                CUT.fetch_add(1, Ordering::Relaxed);
            }
        }
        kept.sort();
        let (set, first) = {
            let mut registry = REGISTRY.lock();
            let registry = registry.get_or_insert_with(HashMap::new);
            if let Some(set) = registry.get(&kept) {
                return set;
            }
            let id = registry.len() as u32 + 1;
            if id >= OVER_CAP_ID {
                OVER_CAP.fetch_add(1, Ordering::Relaxed);
                return over_cap(registry);
            }
            let set = publish(id, &kept);
            registry.insert(kept, set);
            (set, id == 1)
        };
        if first {
            // Labels are written after the maps by the writer thread: a profile that started
            // without one (`writer::threadless`, a single-threaded process) gets it now.
            crate::writer::start_waiting_writer();
        }
        set
    }

    /// Its number in this process (never 0).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its (key, value) pairs, keys sorted and distinct.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (&**k, &**v))
    }

    /// The set numbered `id`, if one is. Sets read from the program's memory
    /// ([`custom_labels`]) are made into a `LabelSet` here, on first use.
    pub fn by_id(id: u32) -> Option<&'static LabelSet> {
        if id >= foreign::FIRST_ID {
            return foreign::by_id(id);
        }
        let p = BY_ID.get(id as usize)?.load(Ordering::Acquire);
        // SAFETY: published from a leaked box, never freed.
        match unsafe { p.as_ref() } {
            // The handler names the over-the-cap set without publishing it.
            None if id == OVER_CAP_ID => Some(over_cap_set()),
            set => set,
        }
    }

    /// Installs this set on the calling thread until the guard drops, which puts back the
    /// set that was installed before (scopes nest).
    pub fn enter(&'static self) -> LabelGuard {
        LabelGuard {
            previous: swap(Some(self)),
            _not_send: std::marker::PhantomData,
        }
    }
}

/// A `value` of at most `max` bytes, cut at a character boundary (counted when cut).
fn cut(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_string();
    }
    CUT.fetch_add(1, Ordering::Relaxed);
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_string()
}

fn publish(id: u32, pairs: &[(String, String)]) -> &'static LabelSet {
    let set: &'static LabelSet = Box::leak(Box::new(LabelSet {
        id,
        pairs: pairs
            .iter()
            .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
            .collect(),
    }));
    BY_ID[id as usize].store(set as *const LabelSet as *mut LabelSet, Ordering::Release);
    set
}

/// The over-the-cap set, published if it was not yet. Takes the registry's lock.
fn over_cap_set() -> &'static LabelSet {
    over_cap(REGISTRY.lock().get_or_insert_with(HashMap::new))
}

/// The one set that stands for every set interned over the cap.
fn over_cap(registry: &mut Registry) -> &'static LabelSet {
    let pairs = vec![("cpuprof.labels".to_string(), "over-cap".to_string())];
    if let Some(set) = registry.get(&pairs) {
        return set;
    }
    let set = LabelSet::by_id(OVER_CAP_ID).unwrap_or_else(|| publish(OVER_CAP_ID, &pairs));
    registry.insert(pairs, set);
    set
}

/// Installs `set` (`None`: no labels) on the calling thread and returns the set installed
/// before. A load and a store.
pub fn swap(set: Option<&'static LabelSet>) -> Option<&'static LabelSet> {
    // SAFETY: the calling thread's own slot, valid for its life.
    let slot = unsafe { &*crate::arch::thread_labels() };
    // A load and a store, not an atomic exchange (a locked instruction, ~8 ns here): only
    // this thread writes its slot; its signal handler only reads it.
    let previous = slot.load(Ordering::Relaxed);
    slot.store(set.map_or(0, |s| s.id), Ordering::Relaxed);
    LabelSet::by_id(previous)
}

/// The calling thread's set, if one is installed.
pub fn current() -> Option<&'static LabelSet> {
    LabelSet::by_id(current_id())
}

/// The number of the calling thread's set, 0 if none. Async-signal-safe: one load.
#[inline(always)]
pub fn current_id() -> u32 {
    // SAFETY: the calling thread's own slot, valid for its life.
    unsafe { &*crate::arch::thread_labels() }.load(Ordering::Relaxed)
}

/// The number of the labels of a sample the calling thread takes of itself: its cpuprof set,
/// or else the set it installed through the custom-labels ABI; 0 for none.
/// Async-signal-safe; uses a few KiB of stack (the handler calls it on its walk stack).
#[inline(always)]
pub(crate) fn sample_id() -> u32 {
    match current_id() {
        0 => custom_labels::current(),
        id => id,
    }
}

/// Whether to keep the labels of the trace `trace_id` when keeping one trace in `n`: the same
/// answer for the same id in every process and service (FNV-1a of its bytes, modulo `n`), so
/// a kept trace is kept everywhere it went.
///
/// Trace ids as labels cost a set per trace, kept for the life of the process (and at most
/// [`MAX_SETS`]); a server that labels every request with its trace id fills that in minutes.
/// Label only the traces this keeps, and the other labels (endpoint, tenant) on every request.
pub fn keep_trace(trace_id: &str, n: u64) -> bool {
    let hash = trace_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % n.max(1) == 0
}

/// Whether any thread may have labels: a set was interned, or custom labels are read.
pub(crate) fn in_use() -> bool {
    !BY_ID[1].load(Ordering::Relaxed).is_null() || custom_labels::reading()
}

/// The number of the labels of another thread of the process, blocked, whose thread pointer
/// is `tp`: its cpuprof set, or else its custom-labels set; 0 for none. Reads its memory
/// through `/proc/self/mem` (the thread may have exited: a number that names no set is none).
/// For the wall sampler; not for signal context.
pub(crate) fn of_blocked_thread(tp: u64) -> u32 {
    // The slot is initial-exec TLS of this library: the same offset from every thread's
    // thread pointer.
    let offset = (crate::arch::thread_labels() as u64).wrapping_sub(crate::arch::thread_pointer());
    let mut id = [0u8; 4];
    let own = match crate::unwind::safe_read::copy_bytes(tp.wrapping_add(offset), &mut id) {
        4 => u32::from_ne_bytes(id),
        _ => 0,
    };
    match own {
        0 => custom_labels::of_thread(tp),
        id if LabelSet::by_id(id).is_some() => id,
        _ => 0,
    }
}

/// Runs `f` with `set` installed on the calling thread, then puts back the previous set.
pub fn with<R>(set: &'static LabelSet, f: impl FnOnce() -> R) -> R {
    let _guard = set.enter();
    f()
}

/// What the caps cost so far: sets interned over [`MAX_SETS`] (or over the table of sets read
/// from the program's memory), and keys, values or pairs cut.
pub fn losses() -> (u64, u64) {
    (OVER_CAP.load(Ordering::Relaxed), CUT.load(Ordering::Relaxed))
}

/// Puts back the set installed before [`LabelSet::enter`] when dropped, on the thread that
/// entered (hence not `Send`).
#[must_use = "the labels are removed when the guard drops"]
pub struct LabelGuard {
    previous: Option<&'static LabelSet>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for LabelGuard {
    fn drop(&mut self) {
        swap(self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_interned_sorted_and_cut_to_the_caps() {
        let a = LabelSet::new(&[("tenant", "acme"), ("endpoint", "/a")]);
        let b = LabelSet::new(&[("endpoint", "/a"), ("tenant", "acme")]);
        assert!(std::ptr::eq(a, b));
        assert_eq!(
            a.pairs().collect::<Vec<_>>(),
            vec![("endpoint", "/a"), ("tenant", "acme")]
        );
        assert!(std::ptr::eq(LabelSet::by_id(a.id()).unwrap(), a));
        let later = LabelSet::new(&[("k", "1"), ("k", "2")]);
        assert_eq!(later.pairs().collect::<Vec<_>>(), vec![("k", "2")]);
        let (_, cut_before) = losses();
        let long = "é".repeat(MAX_VALUE);
        let cut_set = LabelSet::new(&[("trace", long.as_str())]);
        let (_, value) = cut_set.pairs().next().unwrap();
        assert!(value.len() <= MAX_VALUE && long.starts_with(value));
        assert!(losses().1 > cut_before);
    }

    #[test]
    fn scopes_nest_and_restore_per_thread() {
        let outer = LabelSet::new(&[("scope", "outer")]);
        let inner = LabelSet::new(&[("scope", "inner")]);
        assert_eq!(current_id(), 0);
        with(outer, || {
            assert_eq!(current_id(), outer.id());
            with(inner, || {
                assert!(std::ptr::eq(current().unwrap(), inner));
                std::thread::spawn(|| assert_eq!(current_id(), 0, "another thread's slot"))
                    .join()
                    .unwrap();
            });
            assert_eq!(current_id(), outer.id());
        });
        assert!(current().is_none());
        assert!(swap(Some(inner)).is_none());
        assert!(std::ptr::eq(swap(None).unwrap(), inner));
    }
}
