//! What each thread's POSIX CPU timer owes it, so that a thread which exits between two kernel
//! ticks is still counted.
//!
//! A POSIX CPU timer's expiry is noticed only on the scheduler tick (every 4 ms here), so a
//! thread that exits before the tick after its expiry never gets the signal: the same work split
//! over 1,000 threads of ~3 ms each was sampled at 31 % of its CPU time. But the expiries of an
//! interval timer fall on a lattice of the thread's CPU time (the first expiry, then one every
//! period), and each delivered signal covers every lattice point up to its delivery
//! (`1 + si_overrun`). So an exiting thread knows exactly what it is owed: the lattice points up
//! to its CPU time, less what its signals delivered. The handler credits each delivery here
//! ([`credit`]); the exiting thread settles the rest ([`settle`]) as one sample of its start
//! routine, above the frames that called it (its own stack has already unwound by then, so the
//! thread's starting code records them when it opens the account: without them such samples
//! would end at the start routine and never reach the thread's root, `clone3`, which for 1,000
//! short threads was 82 % of all samples).
//!
//! The table is keyed by thread pointer (read without a system call in the handler). Accounts
//! are opened and settled only by the thread itself, under the per-thread timer registry's lock,
//! so slots change one at a time; handlers only look up their own thread's slot.

use std::sync::atomic::{AtomicU64, Ordering};

const SLOTS: usize = 4096;
/// Frames kept of what called a thread's start routine (glibc's `start_thread` and `clone3`,
/// and the interposer's own frame, with room to spare).
pub const ROOT_FRAMES: usize = 6;
const PROBE_LIMIT: usize = 32;
/// Key of a settled slot: look-ups continue past it.
const TOMBSTONE: u64 = 1;

struct Account {
    key: AtomicU64,
    /// The thread's CPU time, in ns, at which its timer first expires.
    first_expiry_ns: AtomicU64,
    /// Periods delivered by signals so far.
    delivered: AtomicU64,
    /// The settling sample's call chain: the start routine, then its callers; 0-terminated.
    chain: [AtomicU64; 1 + ROOT_FRAMES],
}

/// The call chain an exiting thread's owed periods are charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartChain {
    pcs: [u64; 1 + ROOT_FRAMES],
    len: usize,
}

impl StartChain {
    /// `start_routine` called from `callers` (innermost first; those beyond [`ROOT_FRAMES`]
    /// are dropped).
    pub fn new(start_routine: u64, callers: &[u64]) -> StartChain {
        let mut pcs = [0; 1 + ROOT_FRAMES];
        pcs[0] = start_routine;
        let kept = callers.len().min(ROOT_FRAMES);
        pcs[1..1 + kept].copy_from_slice(&callers[..kept]);
        StartChain { pcs, len: 1 + kept }
    }

    pub fn pcs(&self) -> &[u64] {
        &self.pcs[..self.len]
    }
}

/// Where periods delivered to a thread fall on its timer's lattice: the first expiry, and the
/// periods delivered before and after them. Consecutive deliveries to a thread tile its CPU
/// time end to end, however late each signal was handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub first_expiry_ns: u64,
    pub before: u64,
    pub after: u64,
}

impl Delivery {
    /// The stretch of the thread's CPU time these periods stand for, as positions on its
    /// lattice (`first + periods x period_ns`): what a wall profile beside a CPU profile thins.
    pub fn cpu_span(&self, period_ns: u64) -> (u64, u64) {
        let at = |periods: u64| self.first_expiry_ns.saturating_add(periods.saturating_mul(period_ns));
        (at(self.before), at(self.after))
    }
}

/// A table of accounts. The process has one ([`ACCOUNTS`], behind the free functions below);
/// unit tests build their own, so that sessions started by other tests in the same binary
/// (whose stop [`clear`]s the process's table) never touch theirs.
struct Table {
    accounts: [Account; SLOTS],
}

static ACCOUNTS: Table = Table::new();

impl Table {
    const fn new() -> Table {
        Table {
            accounts: [const {
                Account {
                    key: AtomicU64::new(0),
                    first_expiry_ns: AtomicU64::new(0),
                    delivered: AtomicU64::new(0),
                    chain: [const { AtomicU64::new(0) }; 1 + ROOT_FRAMES],
                }
            }; SLOTS],
        }
    }

    fn slots_of(&self, tp: u64) -> impl Iterator<Item = &Account> {
        // Thread pointers are page-aligned-ish: mix the bits before taking the slot.
        let start = (tp.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize;
        (0..PROBE_LIMIT).map(move |i| &self.accounts[(start + i) % SLOTS])
    }

    fn find(&self, tp: u64) -> Option<&Account> {
        self.slots_of(tp)
            .take_while(|a| a.key.load(Ordering::Acquire) != 0)
            .find(|a| a.key.load(Ordering::Acquire) == tp)
    }

    fn open(&self, tp: u64, first_expiry_ns: u64, chain: &StartChain) -> bool {
        if tp <= TOMBSTONE {
            return false;
        }
        let account = self.find(tp).or_else(|| {
            self.slots_of(tp)
                .find(|a| matches!(a.key.load(Ordering::Relaxed), 0 | TOMBSTONE))
        });
        let Some(account) = account else {
            return false;
        };
        // Publish the values before the key, so a handler never credits a half-opened account.
        account.key.store(TOMBSTONE, Ordering::Release);
        account.first_expiry_ns.store(first_expiry_ns, Ordering::Relaxed);
        account.delivered.store(0, Ordering::Relaxed);
        for (slot, &pc) in account.chain.iter().zip(chain.pcs.iter()) {
            slot.store(pc, Ordering::Relaxed);
        }
        account.key.store(tp, Ordering::Release);
        true
    }

    fn credit(&self, tp: u64, periods: u64) -> Option<Delivery> {
        let account = self.find(tp)?;
        let before = account.delivered.fetch_add(periods, Ordering::Relaxed);
        Some(Delivery {
            first_expiry_ns: account.first_expiry_ns.load(Ordering::Relaxed),
            before,
            after: before.saturating_add(periods),
        })
    }

    fn settle(&self, tp: u64, cpu_ns: u64, period_ns: u64) -> Option<(u64, StartChain, Delivery)> {
        let account = self.find(tp)?;
        let first = account.first_expiry_ns.load(Ordering::Relaxed);
        let expired = match cpu_ns.checked_sub(first) {
            Some(past) => 1 + past / period_ns.max(1),
            None => 0,
        };
        let delivered = account.delivered.load(Ordering::Relaxed);
        let owed = expired.saturating_sub(delivered);
        let mut pcs = [0; 1 + ROOT_FRAMES];
        for (pc, slot) in pcs.iter_mut().zip(account.chain.iter()) {
            *pc = slot.load(Ordering::Relaxed);
        }
        let len = pcs.iter().position(|&pc| pc == 0).unwrap_or(pcs.len());
        account.key.store(TOMBSTONE, Ordering::Release);
        let delivery = Delivery {
            first_expiry_ns: first,
            before: delivered,
            after: delivered + owed,
        };
        Some((owed, StartChain { pcs, len }, delivery))
    }

    fn clear(&self) {
        // Stores only where a key was set, so the table's untouched pages stay untouched.
        for account in self.accounts.iter().filter(|a| a.key.load(Ordering::Relaxed) != 0) {
            account.key.store(0, Ordering::Release);
        }
    }
}

/// Opens the account of the calling thread `tp`, whose timer first expires when its CPU time
/// reaches `first_expiry_ns`, charging what it owes at exit to `chain`. Returns false when the
/// table is full around `tp` (the thread is then sampled by its signals only). Callers hold
/// the timer registry's lock.
pub fn open(tp: u64, first_expiry_ns: u64, chain: &StartChain) -> bool {
    ACCOUNTS.open(tp, first_expiry_ns, chain)
}

/// Credits `periods` delivered by a signal to thread `tp`'s account, if it has one, and says
/// where they fall on its lattice. Async-signal-safe.
pub fn credit(tp: u64, periods: u64) -> Option<Delivery> {
    ACCOUNTS.credit(tp, periods)
}

/// Closes the calling thread's account when it exits, at CPU time `cpu_ns`: returns the
/// periods its timer owed but never delivered, the call chain to charge them to, and where
/// they fall on its lattice. The caller has blocked the profiling signal, so nothing is
/// credited meanwhile.
pub fn settle(tp: u64, cpu_ns: u64, period_ns: u64) -> Option<(u64, StartChain, Delivery)> {
    ACCOUNTS.settle(tp, cpu_ns, period_ns)
}

/// Forgets every account (at stop: the next session's timers start new lattices).
/// Callers hold the timer registry's lock, after the sampler state was unpublished.
pub fn clear() {
    ACCOUNTS.clear()
}

/// The calling thread's CPU time in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of the test's own (4096 slots of 72 bytes: on the heap).
    fn table() -> Box<Table> {
        Box::new(Table::new())
    }

    #[test]
    fn owed_periods_are_the_lattice_points_not_delivered() {
        let t = table();
        let tp = 0x7f00_dead_b000;
        let chain = StartChain::new(0x401000, &[0x7f00_0001, 0x7f00_0002]);
        assert!(t.open(tp, 3_000, &chain));
        // Expiries at 3 us, 13 us, 23 us, ...; CPU time 25 us: three expired.
        let delivered = t.credit(tp, 1).unwrap();
        assert_eq!(delivered.cpu_span(10_000), (3_000, 13_000));
        let (owed, settled, rest) = t.settle(tp, 25_000, 10_000).unwrap();
        assert_eq!((owed, settled.pcs()), (2, &[0x401000, 0x7f00_0001, 0x7f00_0002][..]));
        assert_eq!(rest.cpu_span(10_000), (13_000, 33_000), "the settled periods follow on");
        assert_eq!(t.settle(tp, 25_000, 10_000), None, "settled once");
        // Exiting before the first expiry owes nothing.
        assert!(t.open(tp, 9_000, &StartChain::new(0x401000, &[])));
        assert_eq!(
            t.settle(tp, 8_000, 10_000).map(|(owed, c, _)| (owed, c.pcs().to_vec())),
            Some((0, vec![0x401000]))
        );
        // Deliveries beyond the lattice (a signal racing the exit) never make the debt negative.
        assert!(t.open(tp, 1, &StartChain::new(7, &[])));
        t.credit(tp, 5);
        assert_eq!(t.settle(tp, 10, 10_000).map(|(owed, ..)| owed), Some(0));
    }

    #[test]
    fn a_long_chain_keeps_its_innermost_callers() {
        let callers: Vec<u64> = (1..=20).collect();
        let chain = StartChain::new(100, &callers);
        assert_eq!(chain.pcs().len(), 1 + ROOT_FRAMES);
        assert_eq!(chain.pcs()[..3], [100, 1, 2]);
    }

    #[test]
    fn many_threads_keep_separate_accounts() {
        let t = table();
        let tps: Vec<u64> = (1..=40).map(|i| 0x7e00_0000_0000 + i * 0x80_0000).collect();
        for &tp in &tps {
            assert!(t.open(tp, 0, &StartChain::new(tp, &[])));
        }
        for (i, &tp) in tps.iter().enumerate() {
            t.credit(tp, i as u64);
        }
        for (i, &tp) in tps.iter().enumerate() {
            // Expired at CPU time 45 with period 10: 5 periods, less what was credited.
            let (owed, chain, _) = t.settle(tp, 45, 10).unwrap();
            assert_eq!((owed, chain.pcs()), (5u64.saturating_sub(i as u64), &[tp][..]));
        }
    }
}
