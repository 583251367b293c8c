//! perf `cpu-clock` events as per-thread sampling timers (`CPUPROFILE_TIMER=perf`).
//!
//! A software `cpu-clock` event per thread is hrtimer-driven, so it samples at the asked rate
//! above the kernel tick and counts threads shorter than a tick; it delivers a signal to its
//! thread on each overflow (`F_SETOWN_EX` + `F_SETSIG` + `O_ASYNC`). The event disables itself
//! after one overflow; the handler re-enables it with `PERF_EVENT_IOC_REFRESH`. It signals in
//! user mode only (see [`open`]), so the kernel drops expirations that fall in kernel time; the
//! handler reads the thread's CPU clock, which includes kernel time, and weights the sample with
//! the periods that passed ([`rearm_and_weigh`]), with a jittered next interval.
//!
//! The weight comes from the thread's CPU clock, not from the event's own count: `cpu-clock`
//! runs on the scheduler clock while the thread is on a CPU, so in a virtual machine it also
//! counts the time the host gave the virtual CPU to someone else (steal time), which the
//! thread's CPU clock leaves out (`CONFIG_PARAVIRT_TIME_ACCOUNTING`). On a busy CI host the
//! event's count made 1.5 s of CPU time 1.70 s. A signal that arrives before a whole period of
//! CPU time has passed (steal made the event overflow early) weighs 0 and is not recorded.
//!
//! Each event costs a descriptor inside someone else's process, so they are kept out of its way:
//! * **Budget.** Events live only at numbers above `FD_SETSIZE` (so no `select()` user sees its
//!   own descriptors pushed past 1024), just below cpuprof's other descriptors near the top of
//!   the `RLIMIT_NOFILE` soft limit (at most 8192), where the lowest-free-number rule reaches
//!   last, and there are at most a quarter of the numbers between `FD_SETSIZE` and there (and at
//!   most [`MAX_BUDGET`]). Under `ulimit -n 1024` the budget is zero: the registry gives threads
//!   POSIX CPU timers instead ([`super::thread_timers`]).
//! * **Identity.** The program may close our descriptor (`close_range`, a daemon closing every
//!   fd) and reuse its number. Every use — the handler's `ioctl`s, `close` — first asks
//!   the descriptor for its event id (`PERF_EVENT_IOC_ID`, which fails on anything that is not a
//!   perf event) and compares it with the id recorded at open. A descriptor that is no longer
//!   ours is never read, re-armed or closed.
//!
//! Residual hazards, documented in docs/HOSTILE.md: `perf_event_open` briefly holds the lowest
//! free number before the event moves up; a full real-time signal queue makes the kernel send
//! `SIGIO` instead of our signal. This is why perf events are not the default timer.
//!
//! The same events count something other than CPU time in an event profile
//! ([`count_events`], `CPUPROFILE_EVENT`): a hardware or software event of
//! [`super::events`], each signal then weighed by the events the descriptor counted since the
//! last one instead of by the thread's CPU clock.

use super::events::Event;
use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Most perf descriptors held at once (threads beyond it get POSIX CPU timers).
pub const MAX_BUDGET: usize = 1024;
/// `FD_SETSIZE` of glibc: descriptors below it are the ones `select()` can watch.
const FD_SETSIZE: u64 = 1024;

/// First descriptor number of the budget, and its size.
static BASE: AtomicI32 = AtomicI32::new(-1);
static BUDGET: AtomicUsize = AtomicUsize::new(0);
/// For each slot (descriptor - BASE): the event id, 0 when free.
static IDS: [AtomicU64; MAX_BUDGET] = [const { AtomicU64::new(0) }; MAX_BUDGET];
/// For each slot: the thread CPU time (nanoseconds, kernel time included) that the samples
/// taken through it so far account for; the thread's CPU time when the event was opened, at
/// first. In an event profile: the events of its count that they account for, from 0.
static ACCOUNTED: [AtomicU64; MAX_BUDGET] = [const { AtomicU64::new(0) }; MAX_BUDGET];
/// The sampling period: nanoseconds of CPU time, or events in an event profile.
static PERIOD: AtomicU64 = AtomicU64::new(0);
/// An event profile's event (`perf_event_attr` type and config); [`COUNTS_EVENTS`] false: the
/// `cpu-clock` timer.
static COUNTS_EVENTS: AtomicBool = AtomicBool::new(false);
static EVENT_KIND: AtomicU32 = AtomicU32::new(PERF_TYPE_SOFTWARE);
static EVENT_CONFIG: AtomicU64 = AtomicU64::new(PERF_COUNT_SW_CPU_CLOCK);

/// Makes the events opened from now on count `event` (an event profile) or, with `None`, CPU
/// time (the `cpu-clock` timer). Set before any is opened, by the session's start.
pub fn count_events(event: Option<&Event>) {
    let (kind, config) = match event {
        Some(e) => (e.kind, e.config),
        None => (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK),
    };
    EVENT_KIND.store(kind, Ordering::Relaxed);
    EVENT_CONFIG.store(config, Ordering::Relaxed);
    COUNTS_EVENTS.store(event.is_some(), Ordering::Release);
}

/// Whether the events count an event profile's event rather than CPU time.
pub fn counts_events() -> bool {
    COUNTS_EVENTS.load(Ordering::Acquire)
}

/// The count of the event `fd` (read(2) of a perf descriptor with no read format: one u64).
/// Async-signal-safe.
fn event_count(fd: c_int) -> Option<u64> {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a local u64.
    let n = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
    (n == 8).then_some(count)
}

/// What the samples of the event `fd` account for now: its count in an event profile, else the
/// calling thread's CPU time. Async-signal-safe.
fn progress(fd: c_int) -> u64 {
    if counts_events() {
        event_count(fd).unwrap_or(0)
    } else {
        super::thread_accounts::thread_cpu_ns()
    }
}
/// The `RLIMIT_NOFILE` soft limit when the budget was set.
static LIMIT_AT_BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the descriptor budget below cpuprof's own descriptors ([`crate::in_program::fd::high_floor`],
/// under the `RLIMIT_NOFILE` soft limit and at most 8192, so the kernel's descriptor table, which
/// `fork` copies, stays small); returns its size.
pub fn set_budget() -> usize {
    let top = crate::in_program::fd::high_floor();
    let (base, budget) = match budget_below(top) {
        // An event profile has no timer to fall back on: rather than none, a few numbers just
        // below cpuprof's own, the last the program would be given (`events_below`).
        (_, 0) if counts_events() => events_below(top),
        normal => normal,
    };
    BASE.store(base, Ordering::Relaxed);
    BUDGET.store(budget, Ordering::Relaxed);
    LIMIT_AT_BUDGET.store(soft_nofile().unwrap_or(u64::MAX), Ordering::Relaxed);
    budget
}

/// The `RLIMIT_NOFILE` soft limit now.
fn soft_nofile() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a local struct.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// The program lowered its `RLIMIT_NOFILE` soft limit since the budget was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoweredLimit {
    /// The soft limit now.
    pub limit: u64,
    /// No number of the budget is below it: no perf event can be placed any more.
    pub none_left: bool,
}

impl LoweredLimit {
    /// Why a thread gets a POSIX CPU timer instead of a perf event.
    pub fn explain(&self) -> String {
        if self.none_left && self.limit <= FD_SETSIZE {
            format!(
                "the program lowered RLIMIT_NOFILE to {}: no descriptor numbers above FD_SETSIZE left",
                self.limit
            )
        } else if self.none_left {
            format!(
                "the program lowered RLIMIT_NOFILE to {}: no descriptor numbers left where perf events go (from {} up)",
                self.limit,
                BASE.load(Ordering::Relaxed)
            )
        } else {
            format!(
                "the program lowered RLIMIT_NOFILE to {}: the descriptor numbers left above FD_SETSIZE below it are taken",
                self.limit
            )
        }
    }
}

/// Whether the program lowered its `RLIMIT_NOFILE` soft limit into or below the budget since
/// it was set (`F_DUPFD` to a number at or above the limit fails with `EINVAL`, so events can
/// only go below it).
pub fn lowered_limit() -> Option<LoweredLimit> {
    let limit = soft_nofile()?;
    let budget_end = BASE.load(Ordering::Relaxed).max(0) as u64 + BUDGET.load(Ordering::Relaxed) as u64;
    (limit < LIMIT_AT_BUDGET.load(Ordering::Relaxed) && limit < budget_end).then(|| LoweredLimit {
        limit,
        none_left: limit <= BASE.load(Ordering::Relaxed).max(0) as u64,
    })
}

/// `(first number, count)` of the descriptors perf events may use below `top`: a quarter of the
/// numbers between `FD_SETSIZE` and `top`, at most [`MAX_BUDGET`].
fn budget_below(top: c_int) -> (c_int, usize) {
    let top = top.max(0);
    let budget = ((top as u64).saturating_sub(FD_SETSIZE) / 4).min(MAX_BUDGET as u64);
    (top - budget as c_int, budget as usize)
}

/// An event profile's budget when no number above `FD_SETSIZE` is left under `top` (the soft
/// limit of 1024 that most shells give): a sixteenth of the numbers below `top`, at most 64, at
/// its top. The program meets its limit that many descriptors sooner, which is said at start.
fn events_below(top: c_int) -> (c_int, usize) {
    let budget = (top.max(0) as usize / 16).min(64);
    (top - budget as c_int, budget)
}

/// Whether the budget lies below `FD_SETSIZE` (an event profile under a soft limit of about
/// 1024), and its numbers.
pub fn budget_below_fd_setsize() -> Option<(c_int, usize)> {
    let (base, budget) = (BASE.load(Ordering::Relaxed), BUDGET.load(Ordering::Relaxed));
    (budget > 0 && (base as u64) < FD_SETSIZE).then_some((base, budget))
}

/// How many perf descriptors may be held at once.
pub fn budget() -> usize {
    BUDGET.load(Ordering::Relaxed)
}

/// The budget slot of `fd`, if the number lies in the budget.
fn slot(fd: c_int) -> Option<usize> {
    let index = usize::try_from(fd.checked_sub(BASE.load(Ordering::Relaxed))?).ok()?;
    (index < BUDGET.load(Ordering::Relaxed)).then_some(index)
}

/// The event id of `fd`, if it is a perf event. Async-signal-safe.
fn event_id(fd: c_int) -> Option<u64> {
    let mut id: u64 = 0;
    // SAFETY: PERF_EVENT_IOC_ID writes a u64; on any other kind of file it fails (ENOTTY).
    (unsafe { libc::ioctl(fd, PERF_EVENT_IOC_ID, &mut id as *mut u64) } == 0).then_some(id)
}

/// Whether `fd` still is the event we opened there. Async-signal-safe.
pub fn is_ours(fd: c_int) -> bool {
    slot(fd).is_some_and(|s| {
        let id = IDS[s].load(Ordering::Acquire);
        id != 0 && event_id(fd) == Some(id)
    })
}

/// Opens an event for thread `tid` that signals it with `signal` every `period` of its
/// CPU time (nanoseconds) or, in an event profile, of the events it counts, at a descriptor in
/// the budget; its samples account for the thread's CPU time from `accounted_from` (`None`:
/// from now; an event's count always starts at 0).
pub fn open(tid: libc::pid_t, signal: c_int, period: u64, accounted_from: Option<u64>) -> io::Result<c_int> {
    let counts_events = counts_events();
    let attr = PerfEventAttr {
        kind: EVENT_KIND.load(Ordering::Relaxed),
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: EVENT_CONFIG.load(Ordering::Relaxed),
        // The first interval is random within one period, so threads shorter than a period
        // are sampled in proportion to their length; later ones are jittered by the handler.
        sample_period: 1 + super::thread_timers::random_below(period),
        // User mode only: an overflow while the thread is in the kernel would queue a signal
        // that an `execve` in progress carries into the new program, which dies of it (and
        // one sent to a thread going to sleep wakes it: EINTR, see `super::events`). In user
        // mode the signal is delivered at once, on the interrupt's return. Kernel time is
        // still in the samples: the thread's CPU clock includes it (see `rearm_and_weigh`).
        flags: ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        wakeup_events: 1,
        ..Default::default()
    };
    let base = BASE.load(Ordering::Relaxed);
    if BUDGET.load(Ordering::Relaxed) == 0 {
        return Err(io::Error::other("no descriptor budget"));
    }
    // SAFETY: perf_event_open with a valid attribute; fcntl/ioctl on the fds it returns.
    unsafe {
        let low = libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            tid,
            -1,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        ) as c_int;
        if low < 0 {
            return Err(io::Error::last_os_error());
        }
        // Move it up into the budget at once, freeing the low number it was given.
        let fd = libc::fcntl(low, libc::F_DUPFD_CLOEXEC, base);
        let moved = io::Error::last_os_error();
        libc::close(low);
        let Some(s) = (fd >= 0).then(|| slot(fd)).flatten() else {
            if fd >= 0 {
                libc::close(fd);
            }
            return Err(if fd < 0 {
                moved
            } else {
                io::Error::other("descriptor budget full")
            });
        };
        let Some(id) = event_id(fd) else {
            libc::close(fd);
            return Err(io::Error::other("not a perf event"));
        };
        // Samples account for the thread's CPU time from `accounted_from`, or from now on;
        // recorded before the event is enabled below.
        let from = if counts_events {
            Some(0)
        } else {
            accounted_from.or_else(|| thread_cpu_ns_of(tid))
        };
        let Some(from) = from else {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        };
        ACCOUNTED[s].store(from, Ordering::Relaxed);
        IDS[s].store(id, Ordering::Release);
        PERIOD.store(period, Ordering::Relaxed);
        let owner = [F_OWNER_TID, tid];
        let setup = libc::fcntl(fd, F_SETOWN_EX, owner.as_ptr()) == 0
            && libc::fcntl(fd, F_SETSIG, signal) == 0
            && libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_ASYNC) == 0
            && libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) == 0;
        if !setup {
            let e = io::Error::last_os_error();
            IDS[s].store(0, Ordering::Release);
            libc::close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

/// The nanoseconds of the calling thread's CPU time (the events, in an event profile) that
/// the signals of its event `fd` have not weighed yet (`rearm_and_weigh`), if `fd` is still
/// ours: what a thread leaves at exit.
pub fn unweighed(fd: c_int) -> Option<u64> {
    let s = slot(fd).filter(|_| is_ours(fd))?;
    Some(progress(fd).saturating_sub(ACCOUNTED[s].load(Ordering::Relaxed)))
}

/// The CPU time of thread `tid` of this process, in nanoseconds (its per-thread CPU clock,
/// `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)` in the kernel's encoding).
fn thread_cpu_ns_of(tid: libc::pid_t) -> Option<u64> {
    const CPUCLOCK_PERTHREAD_SCHED: libc::clockid_t = 4 | 2;
    let clock = (!tid << 3) | CPUCLOCK_PERTHREAD_SCHED;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: fills a local timespec.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then(|| {
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    })
}

/// Stops `fd`'s event from signalling, if `fd` is still ours.
pub fn disable(fd: c_int) {
    if is_ours(fd) {
        // SAFETY: our own perf event fd.
        unsafe { libc::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0) };
    }
}

/// Lets `fd`'s event signal again after [`disable`] (its next overflow), if `fd` is still ours.
pub fn enable(fd: c_int) {
    if is_ours(fd) {
        // SAFETY: our own perf event fd.
        unsafe { libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) };
    }
}

/// Closes `fd` if it is still our event; returns false (and leaves it alone) if the program
/// closed it and the number now holds something else.
pub fn close(fd: c_int) -> bool {
    let ours = is_ours(fd);
    if ours {
        if let Some(s) = slot(fd) {
            IDS[s].store(0, Ordering::Release);
        }
        // SAFETY: our own perf event fd, identified just now.
        unsafe { libc::close(fd) };
    }
    ours
}

/// Re-enables the perf event `fd` that just sent a signal, with a fresh jittered interval,
/// and returns how many sampling periods of its thread's CPU time the sample stands for:
/// the CPU time since the samples so far, kernel time included, in periods (with the
/// remainder carried to the next sample, so intervals of any length add up exactly), 0 for a
/// signal that came before half a period was left to account for. In an event profile the
/// same of the events the descriptor counted. A descriptor that is not ours (`si_fd` of a
/// signal that was in flight when the program closed our event and reused the number) is not
/// touched: the sample counts once.
///
/// # Safety
/// Async-signal-safe; `fd` comes from the siginfo of a perf signal.
pub(super) unsafe fn rearm_and_weigh(fd: c_int) -> u64 {
    let Some(s) = slot(fd).filter(|_| is_ours(fd)) else {
        return 1;
    };
    let now = progress(fd);
    let period = PERIOD.load(Ordering::Relaxed);
    // The event disabled itself at its overflow, so the new interval takes effect on REFRESH
    // without touching a running timer.
    let next = super::thread_timers::jittered(period.max(2));
    libc::ioctl(fd, PERF_EVENT_IOC_PERIOD, &next as *const u64);
    libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1);
    if period == 0 {
        return 1;
    }
    // Rounded, remainder carried: the clock read lags the expiry by the signal's delivery,
    // and under steal time the event overflows before a period of CPU time has passed (then
    // the signal weighs 0, and the carried remainder makes a later one weigh 1).
    let accounted = &ACCOUNTED[s];
    let last = accounted.load(Ordering::Relaxed);
    let periods = (now.saturating_sub(last) + period / 2) / period;
    accounted.store(last + periods * period, Ordering::Relaxed);
    periods
}

// perf_event_open(2) constants and the attribute layout (PERF_ATTR_SIZE_VER5), which the libc
// crate does not provide for glibc.
pub(crate) const PERF_TYPE_SOFTWARE: u32 = 1;
pub(crate) const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub(crate) const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const ATTR_DISABLED: u64 = 1 << 0;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
pub(crate) const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const PERF_EVENT_IOC_REFRESH: libc::c_ulong = 0x2402;
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
const F_SETSIG: c_int = 10;
const F_SETOWN_EX: c_int = 15;
const F_OWNER_TID: c_int = 0;

#[repr(C)]
#[derive(Default)]
pub(crate) struct PerfEventAttr {
    pub kind: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_layout_is_perf_attr_size_ver5() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 112);
    }

    #[test]
    fn the_budget_stays_above_fd_setsize_below_cpuprofs_own_descriptors() {
        // Under `ulimit -n 1024` cpuprof's own descriptors start at 960: no perf descriptors.
        assert_eq!(budget_below(960), (960, 0));
        assert_eq!(budget_below(0), (0, 0));
        assert_eq!(budget_below(2048 - 64), (1984 - 240, 240));
        assert_eq!(budget_below(8192 - 64), (8128 - 1024, 1024));
    }

    #[test]
    fn an_event_profile_takes_a_few_numbers_below_a_low_limit() {
        assert_eq!(events_below(960), (900, 60));
        assert_eq!(events_below(8), (8, 0));
    }

    #[test]
    fn a_lowered_limit_is_named_by_its_value() {
        let low = LoweredLimit {
            limit: 256,
            none_left: true,
        };
        assert_eq!(
            low.explain(),
            "the program lowered RLIMIT_NOFILE to 256: no descriptor numbers above FD_SETSIZE left"
        );
        let above = LoweredLimit {
            limit: 1500,
            none_left: true,
        };
        assert!(above
            .explain()
            .contains("RLIMIT_NOFILE to 1500: no descriptor numbers left where perf events go"));
        let taken = LoweredLimit {
            limit: 6000,
            none_left: false,
        };
        assert!(taken.explain().contains("are taken"));
    }

    #[test]
    fn a_descriptor_that_is_not_a_perf_event_is_never_ours() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsRawFd;
        assert!(!is_ours(file.as_raw_fd()));
        assert_eq!(event_id(file.as_raw_fd()), None);
        assert!(!close(file.as_raw_fd()), "not closed");
    }
}
