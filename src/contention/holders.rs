//! The holder's view of contention (Go's mutex profile): the time threads waited for a lock,
//! charged to the threads that held it, at their release.
//!
//! Per lock with waiters, one slot keeps how many threads wait on it and since when the slot
//! last changed; an unlock takes what the waiters have accrued since the last release
//! (waiters x time, the integral of the number of waiters) and is charged it. So a lock held
//! by three threads in turn while one thread waits charges each its own part of the wait.
//!
//! The slot is one 64-bit word changed by compare-and-swap: the lock's tag (12 bits of a
//! second hash of its address, so two locks sharing a slot are told apart), its waiters (10
//! bits) and the time it last changed (42 bits of 64 ns: intervals up to 78 hours). Beside it,
//! what arrivals folded in since the last release. A lock probes 4 slots from its home; a
//! wait that finds none free, or a lock with 1023 waiters, is not tracked (counted in
//! [`untracked`]). An arrival folds the accrual so far and adds itself; a departure (the
//! waiter got the lock) only leaves: the time from the release to its return, the hand-off,
//! is no holder's. Lock-free and allocation-free, for the lock path.
//!
//! A release inside libc (the mutex `pthread_cond_wait` gives up, glibc's own locks) is not
//! seen: the waits it ends are charged to no one. A thread cancelled inside a wait (`sem_wait`
//! is a cancellation point) leaves it as glibc unwinds it, through the interposer's frame,
//! whose guard departs. Only a thread leaving a wait by `longjmp` out of a signal handler that
//! interrupted it would stay counted as a waiter of its lock.

use std::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 1024;
const PROBES: usize = 4;
const TIME_BITS: u32 = 42;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// Nanoseconds per unit of a slot's time: 64.
const UNIT_SHIFT: u32 = 6;
const WAITER_BITS: u32 = 10;
const MAX_WAITERS: u64 = (1 << WAITER_BITS) - 1;
const TAG_SHIFT: u32 = TIME_BITS + WAITER_BITS;

/// The waiters of a lock, packed: `tag | waiters | since`.
static STATE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Nanoseconds of waiting folded in by arrivals since the lock's last release.
static PENDING: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Waiters tracked now, over all locks: an unlock with none does nothing more.
static WAITING: AtomicU64 = AtomicU64::new(0);
/// Waits not tracked: their lock found no free slot, or had 1023 waiters already.
static UNTRACKED: AtomicU64 = AtomicU64::new(0);

/// A tracked wait: the slot it counts in, for [`depart`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting(usize);

impl Waiting {
    /// The slot, to pass through C (`from_slot` takes it back).
    pub fn slot(self) -> usize {
        self.0
    }

    /// The wait whose [`slot`](Self::slot) is `slot`, if it is one.
    pub fn from_slot(slot: usize) -> Option<Waiting> {
        (slot < SLOTS).then_some(Waiting(slot))
    }
}

fn waiters(word: u64) -> u64 {
    (word >> TIME_BITS) & MAX_WAITERS
}

fn tag(word: u64) -> u64 {
    word >> TAG_SHIFT
}

fn pack(tag: u64, waiters: u64, since: u64) -> u64 {
    tag << TAG_SHIFT | waiters << TIME_BITS | since
}

/// `now_ns` in a slot's units.
fn units(now_ns: u64) -> u64 {
    (now_ns >> UNIT_SHIFT) & TIME_MASK
}

/// Units from `since` to `now`, on the slot's wrapping clock; 0 if `now` is the earlier: a
/// thread's clock read can be older than the time another thread stored in the slot after it
/// (between the read and the compare-and-swap), and must not wrap into 78 hours.
fn elapsed(since: u64, now: u64) -> u64 {
    let elapsed = now.wrapping_sub(since) & TIME_MASK;
    if elapsed >> (TIME_BITS - 1) != 0 {
        0
    } else {
        elapsed
    }
}

/// The later of the slot's time in `word` and `now` (units).
fn later(word: u64, now: u64) -> u64 {
    if elapsed(word & TIME_MASK, now) == 0 {
        word & TIME_MASK
    } else {
        now
    }
}

/// What the waiters of `word` accrued by `now` (units), in nanoseconds.
fn accrued(word: u64, now: u64) -> u64 {
    (elapsed(word & TIME_MASK, now) << UNIT_SHIFT).saturating_mul(waiters(word))
}

/// The home slot and tag of the lock at `lock` (two hashes of the address, which is never
/// read).
fn place(lock: usize) -> (usize, u64) {
    let h = (lock as u64 >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 54) as usize, (h >> 42) & 0xfff)
}

fn slot(home: usize, i: usize) -> usize {
    (home + i) % SLOTS
}

/// A thread starts waiting for `lock` at `now_ns`: counted among its waiters, the accrual of
/// those already there folded in. `None`: not tracked. Async-signal-safe.
pub fn arrive(lock: usize, now_ns: u64) -> Option<Waiting> {
    let (home, tag) = place(lock);
    let now = units(now_ns);
    // Bounded: under a storm of arrivals and releases on the same slots, give up rather than
    // spin on the lock path.
    for _ in 0..64 {
        let mut free = None;
        let mut lost_race = false;
        for i in 0..PROBES {
            let s = slot(home, i);
            let word = STATE[s].load(Ordering::Acquire);
            let n = waiters(word);
            if n > 0 && self::tag(word) == tag {
                if n == MAX_WAITERS {
                    UNTRACKED.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                if STATE[s]
                    .compare_exchange(
                        word,
                        pack(tag, n + 1, later(word, now)),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    PENDING[s].fetch_add(accrued(word, now), Ordering::Relaxed);
                    WAITING.fetch_add(1, Ordering::Relaxed);
                    return Some(Waiting(s));
                }
                lost_race = true;
                break;
            }
            if n == 0 && free.is_none() {
                free = Some((s, word));
            }
        }
        if lost_race {
            continue;
        }
        let Some((s, word)) = free else {
            UNTRACKED.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if STATE[s]
            .compare_exchange(word, pack(tag, 1, now), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            WAITING.fetch_add(1, Ordering::Relaxed);
            return Some(Waiting(s));
        }
    }
    UNTRACKED.fetch_add(1, Ordering::Relaxed);
    None
}

/// The wait `waiting` ended (the thread has the lock, or gave up). Async-signal-safe.
pub fn depart(waiting: Waiting) {
    let s = waiting.0;
    let mut word = STATE[s].load(Ordering::Acquire);
    loop {
        let n = waiters(word);
        if n == 0 {
            // Forgotten meanwhile (a forked child's slots are cleared).
            return;
        }
        let left = pack(tag(word), n - 1, word & TIME_MASK);
        match STATE[s].compare_exchange_weak(word, left, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(now) => word = now,
        }
    }
    WAITING.fetch_sub(1, Ordering::Relaxed);
    if waiters(word) == 1 {
        // The last waiter: what arrivals folded in since the release is hand-off time, no
        // holder's, and must not reach the next lock to use the slot.
        PENDING[s].store(0, Ordering::Relaxed);
    }
}

/// Whether any wait is tracked: an unlock with none has nothing to charge. One load.
#[inline(always)]
pub fn anyone_waiting() -> bool {
    WAITING.load(Ordering::Relaxed) != 0
}

/// `lock` is released now (`clock()`, read only if the lock has tracked waiters: most releases
/// have none): the nanoseconds its waiters accrued since its previous release, now charged to
/// the releaser (0 if it has no tracked waiters). Async-signal-safe.
pub fn released(lock: usize, clock: impl Fn() -> u64) -> u64 {
    let (home, tag) = place(lock);
    let mut now = None;
    let mut charged = 0u64;
    for i in 0..PROBES {
        let s = slot(home, i);
        let mut word = STATE[s].load(Ordering::Acquire);
        while waiters(word) > 0 && self::tag(word) == tag {
            let now = *now.get_or_insert_with(|| units(clock()));
            let reset = pack(tag, waiters(word), later(word, now));
            match STATE[s].compare_exchange_weak(word, reset, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let folded = PENDING[s].swap(0, Ordering::Relaxed);
                    charged = charged.saturating_add(accrued(word, now)).saturating_add(folded);
                    break;
                }
                Err(current) => word = current,
            }
        }
    }
    charged
}

/// Waits not tracked since the process started (no free slot, or too many waiters on one
/// lock).
pub fn untracked() -> u64 {
    UNTRACKED.load(Ordering::Relaxed)
}

/// In a forked child: the parent's other threads, and so their waits, are not there.
/// Async-signal-safe.
pub fn forget_in_child() {
    for (state, pending) in STATE.iter().zip(&PENDING) {
        state.store(0, Ordering::Relaxed);
        pending.store(0, Ordering::Relaxed);
    }
    WAITING.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The slots are process-wide: each test uses locks of its own, at addresses no other
    // test's share a slot with.

    const MS: u64 = 1_000_000;

    #[test]
    fn one_waiter_charges_each_holder_its_part() {
        let lock = 0x1000_0000;
        let t0 = 1_000 * MS;
        let w = arrive(lock, t0).expect("tracked");
        // Two holders in turn release while the thread waits: 3 ms, then 2 ms.
        let first = released(lock, || t0 + 3 * MS);
        let second = released(lock, || t0 + 5 * MS);
        depart(w);
        assert!(first.abs_diff(3 * MS) < 128, "{first}");
        assert!(second.abs_diff(2 * MS) < 128, "{second}");
        // Nobody waits now: the next release charges nothing.
        assert_eq!(released(lock, || t0 + 9 * MS), 0);
    }

    #[test]
    fn waiters_arriving_at_different_times_add_up() {
        let lock = 0x2000_0000;
        let t0 = 2_000 * MS;
        let a = arrive(lock, t0).unwrap();
        let b = arrive(lock, t0 + 4 * MS).unwrap();
        // a waited 10 ms, b 6: 16 ms charged to the holder releasing at t0 + 10 ms.
        let charged = released(lock, || t0 + 10 * MS);
        depart(a);
        assert!(charged.abs_diff(16 * MS) < 256, "{charged}");
        // b waits on through the next holder: 1 ms more.
        let next = released(lock, || t0 + 11 * MS);
        depart(b);
        assert!(next.abs_diff(MS) < 128, "{next}");
    }

    #[test]
    fn a_release_of_another_lock_charges_nothing() {
        let (lock, other) = (0x3000_0000, 0x3000_0040);
        let t0 = 3_000 * MS;
        let w = arrive(lock, t0).unwrap();
        assert_eq!(released(other, || t0 + MS), 0);
        assert!(released(lock, || t0 + 2 * MS) > 0);
        depart(w);
    }

    #[test]
    fn the_hand_off_after_the_last_release_reaches_no_one() {
        let lock = 0x4000_0000;
        let t0 = 4_000 * MS;
        let a = arrive(lock, t0).unwrap();
        let charged = released(lock, || t0 + MS);
        // A second waiter arrives after the release and before a's return; both leave.
        let b = arrive(lock, t0 + 2 * MS).unwrap();
        depart(a);
        depart(b);
        assert!(charged.abs_diff(MS) < 128);
        // The slot is free again: a new waiter's lock starts from nothing.
        let c = arrive(lock, t0 + 10 * MS).unwrap();
        let later = released(lock, || t0 + 11 * MS);
        depart(c);
        assert!(later.abs_diff(MS) < 128, "{later}");
    }

    #[test]
    fn slots_full_around_a_home_leave_a_wait_untracked_and_counted() {
        // Locks whose home is the same slot, told apart by their tags: found by trying.
        let (home, _) = place(0x5000_0000);
        let mut same_home = (0x5000_0000usize..)
            .step_by(8)
            .filter(|&l| place(l).0 == home)
            .take(PROBES + 1);
        let held: Vec<Waiting> = same_home
            .by_ref()
            .take(PROBES)
            .map(|l| arrive(l, 5_000 * MS).unwrap())
            .collect();
        let before = untracked();
        assert_eq!(arrive(same_home.next().unwrap(), 5_000 * MS), None);
        assert_eq!(untracked(), before + 1);
        held.into_iter().for_each(depart);
    }

    #[test]
    fn a_clock_read_older_than_the_slot_charges_nothing_more() {
        let lock = 0x7000_0000;
        let t0 = 7_000 * MS;
        let a = arrive(lock, t0).unwrap();
        // Another thread released at t0 + 5 ms; this one read its clock at t0 + 4 ms, before
        // that release reached the slot.
        let first = released(lock, || t0 + 5 * MS);
        let late = released(lock, || t0 + 4 * MS);
        let b = arrive(lock, t0 + 4 * MS).unwrap();
        // The slot's time stays t0 + 5 ms: a, then a and b, accrue from there.
        let next = released(lock, || t0 + 6 * MS);
        depart(a);
        depart(b);
        assert!(first.abs_diff(5 * MS) < 128, "{first}");
        assert_eq!(late, 0);
        assert!(next.abs_diff(2 * MS) < 128, "{next}");
    }

    #[test]
    fn time_wraps_without_losing_intervals() {
        let lock = 0x6000_0000;
        // Just before the slot's clock wraps (2^48 ns, 78 hours).
        let t0 = (1u64 << (TIME_BITS + UNIT_SHIFT)) - MS;
        let w = arrive(lock, t0).unwrap();
        let charged = released(lock, || t0 + 3 * MS);
        depart(w);
        assert!(charged.abs_diff(3 * MS) < 128, "{charged}");
    }
}
