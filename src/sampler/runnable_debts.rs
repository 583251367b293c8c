//! Time a thread spent runnable (ready, waiting for a CPU) that a wall-clock profile owes it,
//! to be charged to the stack its handler samples next.
//!
//! The wall sampler learns a thread's runnable time exactly, from the kernel's run delay in
//! `/proc/self/task/TID/schedstat`, but only after the fact and without the thread's registers:
//! a thread that was preempted while computing is back on a CPU by then, where only its own
//! signal handler can walk its stack. So the sampler leaves the periods owed here, by thread
//! id, and the thread's next profiling signal records them at the stack it interrupts (where
//! the thread was preempted, give or take the one period of CPU time since).
//!
//! One writer of the keys (the wall sampler thread), handlers reading them: a slot's key is
//! set before its debt is added and its debt cleared before the key is, so a handler finds
//! either its own thread's debt or nothing.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 4096;
const PROBE_LIMIT: usize = 32;
/// A slot whose thread is gone: look-ups continue past it, and it may be taken again.
const TOMBSTONE: u32 = u32::MAX;

struct Debt {
    tid: AtomicU32,
    periods: AtomicU64,
}

static DEBTS: [Debt; SLOTS] = [const {
    Debt {
        tid: AtomicU32::new(0),
        periods: AtomicU64::new(0),
    }
}; SLOTS];

fn slots_of(tid: u32) -> impl Iterator<Item = &'static Debt> {
    let start = (u64::from(tid).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize;
    (0..PROBE_LIMIT).map(move |i| &DEBTS[(start + i) % SLOTS])
}

fn find(tid: u32) -> Option<&'static Debt> {
    slots_of(tid)
        .take_while(|d| d.tid.load(Ordering::Acquire) != 0)
        .find(|d| d.tid.load(Ordering::Acquire) == tid)
}

/// Adds `periods` to thread `tid`'s debt. Wall sampler thread only. False when the table has
/// no room near the thread's slot (the periods are then the caller's to report).
pub fn owe(tid: u32, periods: u64) -> bool {
    if let Some(debt) = find(tid) {
        debt.periods.fetch_add(periods, Ordering::AcqRel);
        return true;
    }
    let free = slots_of(tid).find(|d| matches!(d.tid.load(Ordering::Acquire), 0 | TOMBSTONE));
    match free {
        Some(debt) => {
            debt.periods.store(periods, Ordering::Release);
            debt.tid.store(tid, Ordering::Release);
            true
        }
        None => false,
    }
}

/// Takes the calling thread's debt (`tid`: its id). Async-signal-safe.
pub fn take(tid: u32) -> u64 {
    find(tid).map_or(0, |debt| debt.periods.swap(0, Ordering::AcqRel))
}

/// Forgets thread `tid`, which has exited (its id may be reused); returns the periods it
/// still owed, which no handler of it will record. Wall sampler thread only.
pub fn forget(tid: u32) -> u64 {
    match find(tid) {
        Some(debt) => {
            let left = debt.periods.swap(0, Ordering::AcqRel);
            debt.tid.store(TOMBSTONE, Ordering::Release);
            left
        }
        None => 0,
    }
}

/// In a forked child: the debts are the parent's threads'. Not for signal context.
pub fn clear() {
    for debt in &DEBTS {
        debt.periods.store(0, Ordering::Release);
        debt.tid.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debts_are_taken_once_by_their_thread_and_forgotten_with_it() {
        // Thread ids far from any real ones, all in one probe sequence's neighbourhood.
        let tids: Vec<u32> = (0..40).map(|i| 3_000_000_000 + i).collect();
        for &tid in &tids {
            assert!(owe(tid, 2));
            assert!(owe(tid, 3));
        }
        assert_eq!(take(tids[7]), 5);
        assert_eq!(take(tids[7]), 0);
        assert_eq!(forget(tids[8]), 5);
        assert_eq!(take(tids[8]), 0);
        // A reused id starts with no debt, and the tombstone is passed over.
        assert!(owe(tids[8], 1));
        assert_eq!(take(tids[9]), 5);
        assert_eq!(take(tids[8]), 1);
        assert_eq!(take(7), 0);
        for &tid in &tids {
            forget(tid);
        }
    }
}
