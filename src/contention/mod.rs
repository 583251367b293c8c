//! Lock contention profiles: where threads wait for each other, and how long, for any program
//! (`CPUPROFILE_CONTENTION`, `/pprof/contention`, `/debug/pprof/mutex` and `/debug/pprof/block`).
//!
//! libcpuprof.so's `pthread_mutex_lock`, `pthread_rwlock_rdlock`/`wrlock`, `sem_wait` and
//! `syscall(SYS_futex, FUTEX_WAIT...)` (the waits Rust's `std::sync` and `parking_lot` make
//! without pthreads) try first and time only the calls that would block, then report the delay
//! here ([`waited`]). An uncontended lock costs a load of [`RUNNING`] and the try.
//!
//! A Rust program that uses the crate without the library gets its `std::sync::Mutex` waits
//! through [`Mutex`], a wrapper that does the same, with [`start`] and [`current`].
//!
//! **Sampling by delay**, so a lock storm cannot flood the profile: a wait of `d` ns is
//! recorded with probability `min(1, d / period)` (`CPUPROFILE_CONTENTION_PERIOD`, 1 ms by
//! default), and a recorded wait stands for `max(d, period)` ns and `max(1, period / d)` waits
//! (rounded at random, so the sums stay unbiased): at most one walk of the stack per period of
//! waiting, whatever the number of waits. Waits of a period or more are all recorded.
//!
//! **Two views** ([`View`]): charged to the waiter (as async-profiler does: the chain is the
//! waiting thread's, the delay its wait), and charged to the holder (as Go's mutex profile:
//! the chain is the releasing thread's, the delay what its lock's waiters accrued while it held
//! it, [`holders`]). The holder's view covers the waits whose end libcpuprof.so sees: mutexes
//! and read-write locks (`pthread_mutex_unlock`, `pthread_rwlock_unlock`), semaphores (the
//! thread that posts, `sem_post`), and futexes (the thread whose `FUTEX_WAKE` ended the waits:
//! the unlocker of a Rust `Mutex`, the notifier of a `Condvar`).
//!
//! The chain is walked after the wait (only then is the delay known), by the heap profile's
//! walker (`heap::walker`: the CPU profile's unwind snapshot when one runs, else a snapshot of
//! its own, refreshed at each start and read), and entered in a site table of the heap
//! profile's kind (`heap::sites`), lock-free and allocation-free: the lock path follows the
//! signal handler's rules (no allocation, no lock, no system call but the clock reads).

pub mod holders;
mod mutex;
pub mod raw_writer;

pub use mutex::{Mutex, MutexGuard};

pub use crate::format::contention::View;
use crate::format::contention::{ContentionProfile, ContentionRecord};
use crate::heap::sites::{Sites, MAX_DEPTH};
use crate::heap::walker;
pub use crate::heap::StartError;
use crate::unwind::Registers;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::OnceLock;

/// The default sampling period: one recorded wait per millisecond waited, on average.
pub const DEFAULT_PERIOD_NS: u64 = 1_000_000;
/// Frames a walk keeps: the chain's and the few of ours above it.
const WALK_DEPTH: usize = MAX_DEPTH + 8;

/// Which table holds a view's chains.
fn index(view: View) -> usize {
    match view {
        View::Waiters => 0,
        View::Holders => 1,
    }
}

/// One site table per view.
static TABLES: [OnceLock<Sites>; 2] = [OnceLock::new(), OnceLock::new()];
/// The tables once mapped, for the lock path (a load, no `OnceLock` state machine).
static TABLE_PTRS: [AtomicPtr<Sites>; 2] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 2];
/// Whether a profile runs; read by the interposers before they try.
pub static RUNNING: AtomicBool = AtomicBool::new(false);
static PERIOD_NS: AtomicU64 = AtomicU64::new(DEFAULT_PERIOD_NS);
/// The random sequence of the sampling choices (splitmix64 over a shared counter).
static RANDOM: AtomicU64 = AtomicU64::new(0x853c_49e6_748f_ea9b);
/// When the profile started ([`now_ns`]).
static STARTED_NS: AtomicU64 = AtomicU64::new(0);
/// Samples recorded since then, in both views.
static RECORDED: AtomicU64 = AtomicU64::new(0);

/// Starts recording waits, about one per `period_ns` nanoseconds waited (at least 1: every
/// wait). A restart forgets the previous profile. Not for the lock path.
pub fn start(period_ns: u64) -> Result<(), StartError> {
    if RUNNING.load(Ordering::SeqCst) {
        return Err(StartError::Running("contention"));
    }
    for (cell, ptr) in TABLES.iter().zip(&TABLE_PTRS) {
        let table = match cell.get() {
            Some(t) => {
                t.clear();
                t
            }
            None => {
                let made = Sites::map().ok_or(StartError::NoMemory("contention"))?;
                cell.get_or_init(|| made)
            }
        };
        ptr.store(table as *const Sites as *mut Sites, Ordering::Release);
    }
    walker::prepare(WALK_DEPTH);
    STARTED_NS.store(now_ns(), Ordering::Relaxed);
    RECORDED.store(0, Ordering::Relaxed);
    PERIOD_NS.store(period_ns.max(1), Ordering::Relaxed);
    RUNNING.store(true, Ordering::SeqCst);
    Ok(())
}

/// In a forked child: the parent's waits are the parent's; the child's profile, if one runs,
/// starts empty at the fork. Async-signal-safe (the table's pages are given back).
pub fn forget_in_child() {
    for table in TABLES.iter().filter_map(OnceLock::get) {
        table.clear();
    }
    holders::forget_in_child();
    STARTED_NS.store(now_ns(), Ordering::Relaxed);
    RECORDED.store(0, Ordering::Relaxed);
}

/// The table of `view`, once a profile has started. Async-signal-safe: one load.
fn table(view: View) -> Option<&'static Sites> {
    // SAFETY: set once from a `'static` OnceLock value, never freed.
    unsafe { TABLE_PTRS[index(view)].load(Ordering::Acquire).as_ref() }
}

/// Samples recorded since the profile started, in both views: whether anything came in since
/// a moment, in a load. Async-signal-safe.
pub fn recorded() -> u64 {
    RECORDED.load(Ordering::Relaxed)
}

/// Stops recording; the profile stays readable ([`profile`]) until the next start.
pub fn stop() {
    RUNNING.store(false, Ordering::SeqCst);
}

/// Whether a contention profile is running. One load.
#[inline(always)]
pub fn is_running() -> bool {
    RUNNING.load(Ordering::Relaxed)
}

/// The monotonic clock in nanoseconds (the vDSO: no system call). Async-signal-safe.
#[inline(always)]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: fills a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A uniform random number below 2^53, as a fraction of 1. Async-signal-safe.
fn uniform() -> f64 {
    let mut z = RANDOM.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// What a wait of `delay_ns` stands for if it is recorded, sampled at `period_ns`: `None` if
/// it is not (probability `1 - d/period`), else its delay and its count (`max(d, period)`
/// and `period / d` rounded at random, at least 1). `u` is uniform in [0, 1).
fn weigh(delay_ns: u64, period_ns: u64, u: f64, v: f64) -> Option<(u64, u64)> {
    if delay_ns == 0 {
        return None;
    }
    if delay_ns >= period_ns {
        return Some((delay_ns, 1));
    }
    let p = delay_ns as f64 / period_ns as f64;
    if u >= p {
        return None;
    }
    let waits = 1.0 / p;
    let count = waits as u64 + u64::from(v < waits.fract());
    Some((period_ns, count.max(1)))
}

/// A wait of `delay_ns` nanoseconds just ended at `regs` (the interposer's own registers,
/// the frames inside libcpuprof.so are left out by `heap::recorder`'s rule, and `skip` more).
/// Samples it by delay and, if chosen, walks and records its chain. Async-signal-safe: no
/// allocation, no lock.
#[inline(never)]
#[cold]
pub fn waited(regs: Registers, delay_ns: u64, skip: usize) {
    if !is_running() || is_ours() {
        return;
    }
    record(View::Waiters, regs, delay_ns, skip + 1);
}

/// Whether the calling thread is cpuprof's, or a program thread inside cpuprof: its waits and
/// releases are not the program's.
fn is_ours() -> bool {
    crate::in_program::thread::is_own_thread() || crate::in_program::thread::is_own_work()
}

/// A wait for the lock at `lock` starts now (`now_ns`, the start of its timing): tracked for
/// the holder's view, to be ended by [`holders::depart`]. Async-signal-safe.
#[inline]
pub fn arrive(lock: usize, now_ns: u64) -> Option<holders::Waiting> {
    if is_ours() {
        return None;
    }
    holders::arrive(lock, now_ns)
}

/// The calling thread is about to release the lock at `lock`: what its waiters accrued while
/// it held it, in nanoseconds, for [`charge_holder`] after the release (0: nothing to charge).
/// Taken before the release, or a waiter woken by it could leave first and take its wait
/// along. Call it only when [`holders::anyone_waiting`]. Async-signal-safe.
#[inline]
pub fn releasing(lock: usize) -> u64 {
    let delay_ns = holders::released(lock, now_ns);
    if delay_ns == 0 || !is_running() || is_ours() {
        return 0;
    }
    delay_ns
}

/// Charges `delay_ns` (from [`releasing`]) to the releasing thread's chain at `regs` (the
/// interposer's registers, `skip` frames more left out, as in [`waited`]), sampled by delay as
/// waits are. Async-signal-safe: no allocation, no lock.
#[inline(never)]
#[cold]
pub fn charge_holder(regs: Registers, delay_ns: u64, skip: usize) {
    if delay_ns == 0 || !is_running() {
        return;
    }
    record(View::Holders, regs, delay_ns, skip + 1);
}

/// Samples a delay of `view` by its size and, if chosen, walks and records the chain at `regs`
/// (less the frames inside libcpuprof.so and `skip` more).
#[inline(always)]
fn record(view: View, regs: Registers, delay_ns: u64, skip: usize) {
    let Some((delay, count)) = weigh(delay_ns, PERIOD_NS.load(Ordering::Relaxed), uniform(), uniform()) else {
        return;
    };
    let Some(table) = table(view) else {
        return;
    };
    let mut frames = [0u64; WALK_DEPTH];
    let n = walker::walk(regs, &mut frames);
    let skip = skip.min(n);
    let own = frames[skip..n]
        .iter()
        .take_while(|&&pc| crate::heap::recorder::is_own_code(pc))
        .count();
    let chain = &frames[skip + own..n];
    if let Some(site) = table.entry(chain, 0) {
        table.add(site, count, delay);
        RECORDED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The profile of `view` so far: one line per call chain (chains recorded twice merged),
/// longest delay first, with the maps text `maps_text`. Not for the lock path.
pub fn profile(view: View, maps_text: Vec<u8>) -> ContentionProfile {
    let mut lines: HashMap<Vec<u64>, (u64, u64)> = HashMap::new();
    let mut discarded = 0;
    if let Some(table) = TABLES[index(view)].get() {
        table.for_each(|chain, _, c| {
            let line = lines.entry(chain.to_vec()).or_default();
            line.0 = line.0.saturating_add(c.alloc_bytes);
            line.1 = line.1.saturating_add(c.alloc_objects);
        });
        discarded = table.dropped();
    }
    let mut records: Vec<ContentionRecord> = lines
        .into_iter()
        .map(|(stack, (delay_ns, count))| ContentionRecord { delay_ns, count, stack })
        .collect();
    records.sort_by(|a, b| (b.delay_ns, &a.stack).cmp(&(a.delay_ns, &b.stack)));
    let duration_ms = now_ns().saturating_sub(STARTED_NS.load(Ordering::Relaxed)) / 1_000_000;
    ContentionProfile {
        view,
        duration_ms,
        discarded,
        records,
        maps_text,
    }
}

/// The profile of `view` so far with the process's maps (and the build-ids of its code), as
/// files and the endpoints give it.
pub fn current(view: View) -> ContentionProfile {
    let _own = crate::in_program::thread::own_work();
    let maps = crate::in_program::procfs::read_self_maps();
    let mut mappings = crate::writer::mappings::SeenMappings::default();
    mappings.read_build_ids(&maps);
    walker::refresh_if_stale(WALK_DEPTH);
    profile(view, mappings.complete(&maps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_waits_are_all_kept_and_short_ones_sampled_without_bias() {
        assert_eq!(weigh(2_000_000, 1_000_000, 0.99, 0.5), Some((2_000_000, 1)));
        assert_eq!(weigh(0, 1_000_000, 0.0, 0.0), None);
        // A wait of a quarter period: kept one time in four, standing for four waits.
        assert_eq!(weigh(250_000, 1_000_000, 0.3, 0.5), None);
        assert_eq!(weigh(250_000, 1_000_000, 0.2, 0.5), Some((1_000_000, 4)));
        // Sums over many waits of 30 us come back to the truth.
        let (mut delay, mut count) = (0u64, 0u64);
        for _ in 0..200_000 {
            if let Some((d, c)) = weigh(30_000, 1_000_000, uniform(), uniform()) {
                delay += d;
                count += c;
            }
        }
        let (true_delay, true_count) = (200_000.0 * 30_000.0, 200_000.0);
        assert!((delay as f64 / true_delay - 1.0).abs() < 0.05, "{delay}");
        assert!((count as f64 / true_count - 1.0).abs() < 0.05, "{count}");
    }
}
