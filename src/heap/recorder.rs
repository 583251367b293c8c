//! The process's heap profile while it runs: the sampled allocations' sites and the sampled
//! blocks still allocated, and what the allocation path calls.
//!
//! Everything here that the allocation path calls ([`is_running`], [`allocated`],
//! [`forget`]) obeys the signal handler's rules: no allocation, no lock, no system call on
//! the common path, nothing that can panic. The tables are mapped when the first profile
//! starts and stay mapped (a free in flight may be reading them); a restart clears them.

use super::blocks::Blocks;
use super::countdown::Countdown;
use super::sites::{size_class, SiteCounts, Sites, MAX_DEPTH};
use crate::format::heap::{unsample, HeapCounts, HeapKind, HeapProfile, HeapRecord};
use crate::unwind::Registers;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Frames a walk keeps: the chain's and the few of ours above it.
pub(super) const WALK_DEPTH: usize = MAX_DEPTH + 8;

/// tcmalloc's and Go's default: one sample per 512 KiB allocated, on average.
pub const DEFAULT_PERIOD: u64 = 512 * 1024;

struct Tables {
    sites: Sites,
    blocks: Blocks,
}

static TABLES: OnceLock<Tables> = OnceLock::new();
/// The tables once mapped, for the allocation path (a load, no `OnceLock` state machine).
static TABLES_PTR: AtomicPtr<Tables> = AtomicPtr::new(std::ptr::null_mut());
/// Whether a profile runs; read directly by the interposers' fast paths.
pub static RUNNING: AtomicBool = AtomicBool::new(false);
static PERIOD: AtomicU64 = AtomicU64::new(DEFAULT_PERIOD);
/// Estimates of the bytes allocated and freed since the start (each sample scaled back),
/// for the dump triggers.
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static FREED: AtomicU64 = AtomicU64::new(0);

/// Why a heap or contention profile (`crate::contention`, whose table is of this kind) could
/// not start; each names the profile (`"heap"`, `"contention"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartError {
    /// Its tables (tens of MiB of address space, committed as used) could not be mapped.
    NoMemory(&'static str),
    /// A profile of the kind is already running.
    Running(&'static str),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::NoMemory(kind) => write!(f, "cannot map the {kind} profile's tables"),
            StartError::Running(kind) => write!(f, "a {kind} profile is already running"),
        }
    }
}

impl std::error::Error for StartError {}

#[inline(always)]
fn tables() -> Option<&'static Tables> {
    // SAFETY: set once from a `'static` OnceLock value, never freed.
    unsafe { TABLES_PTR.load(Ordering::Acquire).as_ref() }
}

/// Starts sampling about one allocation per `period` bytes (at least 1: every allocation).
/// A restart forgets the previous profile. Not for the allocation path.
pub fn start(period: u64) -> Result<(), StartError> {
    if RUNNING.load(Ordering::SeqCst) {
        return Err(StartError::Running("heap"));
    }
    let tables = match TABLES.get() {
        Some(t) => {
            t.sites.clear();
            t.blocks.clear();
            t
        }
        None => {
            let made = Tables {
                sites: Sites::map().ok_or(StartError::NoMemory("heap"))?,
                blocks: Blocks::map().ok_or(StartError::NoMemory("heap"))?,
            };
            TABLES.get_or_init(|| made)
        }
    };
    TABLES_PTR.store(tables as *const Tables as *mut Tables, Ordering::Release);
    super::walker::prepare(WALK_DEPTH);
    ALLOCATED.store(0, Ordering::Relaxed);
    FREED.store(0, Ordering::Relaxed);
    PERIOD.store(period.max(1), Ordering::Relaxed);
    RUNNING.store(true, Ordering::SeqCst);
    super::poller::ensure_running();
    Ok(())
}

/// Stops sampling; the profile stays readable ([`profile`]) until the next start. Frees of
/// blocks sampled before keep being counted.
pub fn stop() {
    RUNNING.store(false, Ordering::SeqCst);
}

/// Whether a heap profile is running. Async-signal-safe: one load.
#[inline(always)]
pub fn is_running() -> bool {
    RUNNING.load(Ordering::Relaxed)
}

/// Counts an allocation of `size` bytes at `address` on the thread whose countdown is
/// `countdown`, while a profile runs (callers check [`is_running`] first, before touching
/// the thread's countdown: with no profile running an allocation costs that one load). The
/// common case is a subtraction and a compare; the sampled one walks the stack. `skip`:
/// frames of the caller's own to leave out (its frame and those above it inside the
/// profiler), so the chain begins where the program allocated. Async-signal-safe.
#[inline(always)]
pub fn allocated(countdown: &mut Countdown, address: *mut u8, size: usize, skip: usize) {
    if !address.is_null() && countdown.take(size) {
        sampled(countdown, address, size, skip);
    }
}

/// The rest of [`allocated`], for a caller that took `size` from the countdown itself
/// before the allocation ([`Countdown::take`] said yes): the preloaded `malloc` decides
/// before calling the allocator, so that the common case passes it on with a jump. A failed
/// allocation (`address` null) is not recorded; the countdown stays spent, and the thread's
/// next allocation is the sampled one. Async-signal-safe.
#[inline(never)]
#[cold]
pub fn sampled(countdown: &mut Countdown, address: *mut u8, size: usize, skip: usize) {
    let regs = crate::arch::calling_registers();
    if address.is_null() || countdown.busy != 0 {
        return;
    }
    if crate::in_program::thread::is_own_thread() {
        // cpuprof's threads' allocations are not the program's: never sampled.
        countdown.left = i64::MAX / 2;
        return;
    }
    if crate::in_program::thread::is_own_work() {
        // A program thread inside cpuprof (a file the program asked for): not the program's.
        // The countdown stays spent: the thread's next allocation of its own is sampled.
        return;
    }
    countdown.busy = 1;
    let period = PERIOD.load(Ordering::Relaxed);
    let address = address as u64;
    let seed = address ^ crate::unwind::thread_pointer().rotate_left(17);
    if countdown.rearm(period, seed) && is_running() {
        record(regs, address, size as u64, period, skip + 1);
        // The file's own allocations (made while `busy`) leave the countdown as it was drawn.
        let left = countdown.left;
        super::dumps::when_due_without_thread();
        countdown.left = left;
    }
    countdown.busy = 0;
}

/// The allocator interposers' library's code, `[start, end)` ([`leave_out_code`]).
static OWN_CODE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Says where the code of the library calling [`allocated`] lies (the preloaded library's
/// executable segment): the frames there at the top of a sampled chain are left out as well
/// as the `skip` ones, however many there are (an interposer's fast path may or may not have
/// passed to its slow one by a tail call, depending on the build).
pub fn leave_out_code(start: u64, end: u64) {
    OWN_CODE[0].store(start, Ordering::Relaxed);
    OWN_CODE[1].store(end, Ordering::Relaxed);
}

/// Whether `pc` lies in the interposers' library's code ([`leave_out_code`]).
pub(crate) fn is_own_code(pc: u64) -> bool {
    (OWN_CODE[0].load(Ordering::Relaxed)..OWN_CODE[1].load(Ordering::Relaxed)).contains(&pc)
}

/// Records the sampled block: its chain from `regs` (this frame and `skip` more left out).
fn record(regs: Registers, address: u64, size: u64, period: u64, skip: usize) {
    let Some(tables) = tables() else { return };
    let mut frames = [0u64; WALK_DEPTH];
    let n = super::walker::walk(regs, &mut frames);
    let skip = skip.min(n);
    let own = frames[skip..n].iter().take_while(|&&pc| is_own_code(pc)).count();
    let Some(chain) = frames.get_mut(skip + own..n) else {
        return;
    };
    if let Some(first) = chain.first_mut() {
        // A return address: readers keep the first address as it is, so name the call.
        *first = first.saturating_sub(1);
    }
    if let Some(site) = tables.sites.entry(chain, size_class(size as usize)) {
        tables.sites.allocated(site, size);
        tables.blocks.add(address, size, site);
    }
    ALLOCATED.fetch_add(unsample(1, size, period).1, Ordering::Relaxed);
}

/// Whether the block at `address` may have been sampled, for a `free` to take the common
/// path (false: nothing to forget) after one load, or two and a byte read once a profile has
/// started. Async-signal-safe.
#[inline(always)]
pub fn may_be_sampled(address: *mut u8) -> bool {
    tables().is_some_and(|t| t.blocks.may_hold(address as u64))
}

/// Called before the block at `address` is given back (freed, or moved by `realloc`): if it
/// was sampled, it is no longer in use. Async-signal-safe; an unsampled block costs a load
/// and a byte read.
#[inline(always)]
pub fn forget(address: *mut u8) {
    if address.is_null() {
        return;
    }
    if let Some(tables) = tables() {
        if let Some(removed) = tables.blocks.remove(address as u64) {
            tables.sites.freed(removed.site, removed.size);
            FREED.fetch_add(
                unsample(1, removed.size, PERIOD.load(Ordering::Relaxed)).1,
                Ordering::Relaxed,
            );
        }
    }
}

/// In a forked child: the parent's history is the parent's. What the child holds stays in
/// use under the sites that allocated it; allocated totals start there (without this, every
/// child of a prefork server repeated the parent's allocations, and sums over the process tree
/// counted them once per child). Async-signal-safe.
pub(crate) fn in_forked_child() {
    if let Some(tables) = tables() {
        tables.sites.keep_only_in_use();
    }
    let freed = FREED.swap(0, Ordering::Relaxed);
    let _ = ALLOCATED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| Some(a.saturating_sub(freed)));
}

/// Estimated bytes allocated since the start, and in use now (samples scaled back).
pub fn estimated_bytes() -> (u64, u64) {
    let (a, f) = (ALLOCATED.load(Ordering::Relaxed), FREED.load(Ordering::Relaxed));
    (a, a.saturating_sub(f))
}

/// What the profile could not hold: samples whose site table was full, and sampled blocks
/// whose free cannot be seen (their bucket was full).
pub fn losses() -> (u64, u64) {
    tables().map_or((0, 0), |t| (t.sites.dropped(), t.blocks.untracked()))
}

/// The profile so far, one line per call chain and size class (chains recorded twice
/// merged), largest in use first, with the maps text `maps_text`. Not for the allocation
/// path: it allocates.
pub fn profile(maps_text: Vec<u8>) -> HeapProfile {
    // Keyed by chain and size class: the class keeps the line's objects of about one size,
    // which readers' scaling by the mean size needs (see `sites`).
    let mut lines: HashMap<(Vec<u64>, u64), HeapCounts> = HashMap::new();
    if let Some(tables) = tables() {
        tables.sites.for_each(|chain, class, c| {
            let line = lines.entry((chain.to_vec(), class)).or_default();
            *line = line.plus(counts(c));
        });
    }
    let mut records: Vec<HeapRecord> = lines
        .into_iter()
        .filter(|(_, c)| c.alloc_objects > 0)
        .map(|((stack, _), counts)| HeapRecord { counts, stack })
        .collect();
    records.sort_by(|a, b| {
        (b.counts.inuse_bytes, b.counts.alloc_bytes, &a.stack).cmp(&(
            a.counts.inuse_bytes,
            a.counts.alloc_bytes,
            &b.stack,
        ))
    });
    HeapProfile {
        kind: HeapKind::Heap,
        period: PERIOD.load(Ordering::Relaxed),
        records,
        maps_text,
    }
}

fn counts(c: SiteCounts) -> HeapCounts {
    HeapCounts {
        inuse_objects: c.alloc_objects.saturating_sub(c.freed_objects),
        inuse_bytes: c.alloc_bytes.saturating_sub(c.freed_bytes),
        alloc_objects: c.alloc_objects,
        alloc_bytes: c.alloc_bytes,
    }
}
