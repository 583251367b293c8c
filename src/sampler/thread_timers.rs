//! One sampling timer per thread, for every thread, so each thread is sampled by its own CPU
//! time: no under-counting of busy threads when several run at once, and each expiry the
//! kernel could not deliver is reported and counted.
//!
//! Two kinds:
//! * POSIX CPU timers (the default): `timer_create` on the thread's CPU clock with
//!   `SIGEV_THREAD_ID`. They need no descriptor, their signal is preallocated (it cannot fall back
//!   to another signal when the real-time queue is full), `timer_create` is allowed by the usual
//!   sandboxes, and they count kernel time, charged to the code that entered the kernel (the
//!   signal is taken on the system call's return). They fire from the scheduler tick (250 Hz
//!   here): above that frequency a signal carries `si_overrun` missed expirations, which the
//!   handler adds to the sample's weight, and a thread that exits before the tick after an
//!   expiry settles what it was owed (`thread_accounts`).
//! * perf `cpu-clock` events (`perf_event`, `CPUPROFILE_TIMER=perf`): hrtimer-driven,
//!   for rates above the tick, at one descriptor each within a bounded budget. A thread that
//!   cannot have one (budget spent, a seccomp filter that might kill `perf_event_open`) gets a
//!   POSIX timer instead, and the handler tells the two apart by the signal's code.
//!
//! Threads are armed when profiling starts (all of `/proc/self/task`), when they start
//! ([`on_thread_start`], called by the `pthread_create` interposer of libcpuprof.so and by
//! `ProfilerRegisterThread`), and by the writer thread's poll ([`sync_with_tasks`]) for threads
//! nothing announced. A thread's timer is deleted when it exits (a pthread key destructor set by
//! `on_thread_start`) or when the poll finds it gone, so timers never accumulate. A thread no
//! timer could be armed for is counted and reported at stop.
//!
//! The poll is the safety net for threads that bypass the interposer (raw `clone`, a program
//! using only the Rust crate, threads that exit without running key destructors), and it must
//! stay cheap in a server with thousands of idle threads: listing `/proc/self/task` costs
//! ~0.95 ms with 1,000 threads, which every writer tick made 2.5 % of a core. So each tick
//! compares the kernel's thread count (one `fstat`, [`crate::in_program::procfs::self_thread_count`])
//! with the threads the registry accounts for, and lists only when they differ; threads
//! started and ended through the interposer keep the two equal by themselves. A thread that
//! ends without telling us while another starts the same way keeps the count equal too (a
//! pool of raw or non-interposed threads replacing each other), so the poll also lists on a
//! schedule: at every tick until `LISTING_INTERVAL` has passed since a listing last found
//! threads nothing announced (such a process is polled as closely as before), then at gaps
//! doubling from `FIRST_QUIET_GAP` to `LISTING_INTERVAL` (longer only when listing is
//! slow, see `LISTING_SHARE`), which bounds how long a thread can go unsampled, or a gone
//! thread keep its timer, in a process whose threads had all been announced.

use super::{perf_event, signals, thread_accounts};
use crate::sync::Mutex;
use crate::unwind::thread_pointer;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The kind of per-thread timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadTimerKind {
    Posix,
    Perf,
}

enum Armed {
    Posix(libc::timer_t),
    Perf(c_int),
}

// SAFETY: timer_t is an opaque kernel id; it is only passed to timer_delete.
unsafe impl Send for Armed {}

/// How often the writer checks that the program has not closed our perf descriptors.
const IDENTITY_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The first gap between scheduled listings of `/proc/self/task` once they have found no
/// thread nothing announced for [`LISTING_INTERVAL`]; it doubles after each quiet listing.
const FIRST_QUIET_GAP: Duration = Duration::from_millis(25);
/// The longest the poll goes without listing while the thread count says nothing changed: how
/// long a thread started by raw `clone` while another ended unannounced can go unsampled in a
/// quiet process. Also how long the poll lists at every tick after a listing found such
/// threads: a process that makes them at all is likely to make more, and may replace them one
/// for one (the relays of `tests/c/raw_clone.c`: 78 % of their CPU time sampled with the
/// doubling gaps right after each find, 90 % as before this schedule, with this).
const LISTING_INTERVAL: Duration = Duration::from_secs(1);
/// Scheduled listings in a quiet process take at most this share of the writer's time
/// (1 / 1000: 0.1 % of a core): with tens of thousands of threads one listing takes tens of
/// milliseconds, and the longest gap grows with it, up to [`MAX_LISTING_INTERVAL`].
const LISTING_SHARE: u32 = 1000;
const MAX_LISTING_INTERVAL: Duration = Duration::from_secs(10);

struct Timers {
    /// The kind asked for; threads that cannot have a perf event get a POSIX timer.
    preferred: ThreadTimerKind,
    signal: c_int,
    period_ns: u64,
    armed: HashMap<libc::pid_t, Armed>,
    /// How many of `armed` are perf events (held against the descriptor budget).
    perf_armed: usize,
    /// cpuprof's own threads, never armed.
    excluded: Vec<libc::pid_t>,
    /// The process profiling. A forked child inherits this registry but not the session's
    /// timers or writer: it must not arm its threads.
    pid: u32,
    /// Live threads no timer could be armed for (not tried again).
    unarmed: HashSet<libc::pid_t>,
    /// Threads no timer could be armed for, over the whole profile.
    unsampled: usize,
    /// Whether the program was told why some threads get POSIX timers instead of perf events.
    perf_refusal_said: bool,
    /// Perf descriptors the program closed or reused (their threads were re-armed).
    perf_fds_taken: usize,
    /// Threads given POSIX timers because the program lowered `RLIMIT_NOFILE` under the perf
    /// descriptors' budget, and the lowest limit said.
    limit_fallbacks: usize,
    lowered_limit: Option<u64>,
    /// The live threads of `limit_fallbacks` (a thread of cpuprof's found among them is taken
    /// out of the count: `leave_calling_thread_unsampled`).
    fell_back: HashSet<libc::pid_t>,
    last_identity_check: Instant,
    /// Threads of the last listing that are neither in `armed` nor in `unarmed` (cpuprof's
    /// own, and any that ended before they could be armed): with those two, what the thread
    /// count is compared with.
    untracked: usize,
    /// When the poll lists `/proc/self/task` even if the thread count has not moved, the gap
    /// that led there, and when a listing last found threads nothing announced.
    next_listing: Instant,
    listing_gap: Duration,
    last_found: Instant,
    /// Set while the writer lists `/proc/self/task` without the lock: threads that start or
    /// end meanwhile are put in `changed_while_listing`, and the listing, already out of
    /// date about them, neither arms nor disarms them (it would delete the timer of a thread
    /// that armed itself after the directory was read, and arm one whose destructor has run).
    listing: bool,
    changed_while_listing: Vec<libc::pid_t>,
}

/// What stopping the timers leaves to do and to report.
pub struct Stopped {
    /// Perf event descriptors to close once no handler can be using them.
    pub perf_fds: Vec<c_int>,
    /// Threads that were never sampled because no timer could be armed for them.
    pub unsampled_threads: usize,
    /// Threads given POSIX timers instead of perf events because the program lowered its
    /// `RLIMIT_NOFILE` (to `lowered_limit`) below the perf descriptors' numbers.
    pub limit_fallbacks: usize,
    pub lowered_limit: Option<u64>,
}

/// The registry, if per-thread timers run in this process (not in a forked child).
fn running(timers: &mut Option<Timers>) -> Option<&mut Timers> {
    timers.as_mut().filter(|t| t.pid == std::process::id())
}

/// The per-thread timers of the running session, if it uses them.
static TIMERS: Mutex<Option<Timers>> = Mutex::new(None);

/// The registry's lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &TIMERS
}

/// In a forked child: the parent's registry is not the child's. POSIX timers are not inherited
/// across fork (their ids mean nothing here); perf event descriptors are, and are closed (while
/// they are still ours). Thread accounts and runnable debts are the parent's threads'.
pub fn forget_in_child() {
    if let Some(timers) = TIMERS.lock().take() {
        for (_, armed) in timers.armed {
            if let Armed::Perf(fd) = armed {
                perf_event::close(fd);
            }
        }
    }
    thread_accounts::clear();
    super::runnable_debts::clear();
}

/// Checks that `kind` can be used here by arming and disarming the calling thread once.
pub fn probe(kind: ThreadTimerKind, signal: c_int, period_ns: u64) -> io::Result<()> {
    match kind {
        ThreadTimerKind::Posix => {
            let (id, _) = arm_posix(gettid(), signal, period_ns)?;
            // SAFETY: the timer just created.
            unsafe { libc::timer_delete(id) };
        }
        ThreadTimerKind::Perf => {
            if perf_event::set_budget() == 0 {
                return Err(io::Error::other(
                    "no descriptor numbers to spare above FD_SETSIZE under this RLIMIT_NOFILE soft limit",
                ));
            }
            perf_allowed_here()?;
            let fd = perf_event::open(gettid(), signal, period_ns, None)?;
            perf_event::close(fd);
        }
    }
    Ok(())
}

/// Starts per-thread timers: every current thread of the process is armed, except `excluded`
/// (cpuprof's own writer thread).
pub fn start(kind: ThreadTimerKind, signal: c_int, period_ns: u64, excluded: Vec<libc::pid_t>) -> io::Result<()> {
    let mut timers = Timers {
        preferred: kind,
        signal,
        period_ns,
        armed: HashMap::new(),
        perf_armed: 0,
        excluded,
        pid: std::process::id(),
        unarmed: HashSet::new(),
        unsampled: 0,
        perf_refusal_said: false,
        perf_fds_taken: 0,
        limit_fallbacks: 0,
        lowered_limit: None,
        fell_back: HashSet::new(),
        last_identity_check: Instant::now(),
        untracked: 0,
        next_listing: Instant::now(),
        listing_gap: Duration::ZERO,
        last_found: Instant::now(),
        listing: false,
        changed_while_listing: Vec::new(),
    };
    if kind == ThreadTimerKind::Perf {
        perf_event::set_budget();
    }
    let listed = Instant::now();
    let mut tids = crate::in_program::procfs::self_tids().unwrap_or_default();
    tids.sort_unstable();
    for &tid in &tids {
        timers.arm_thread(tid, None);
    }
    if timers.armed.is_empty() && !tids.is_empty() {
        return Err(io::Error::other("no thread could be given a timer"));
    }
    // As if the listing had found unannounced threads: threads started around `start` by
    // code that does not announce them are then found at the next ticks, in the first second.
    timers.listed(&tids, listed, true);
    *TIMERS.lock() = Some(timers);
    Ok(())
}

/// Deletes every timer. Signals already queued may still arrive; the handler ignores them
/// once the sampler state is unpublished, which the session does before closing perf fds
/// (see `close`), so a late handler never re-arms an fd number the application may reuse.
pub fn stop() -> Stopped {
    let Some(timers) = TIMERS.lock().take() else {
        return Stopped {
            perf_fds: Vec::new(),
            unsampled_threads: 0,
            limit_fallbacks: 0,
            lowered_limit: None,
        };
    };
    let mut perf_fds = Vec::new();
    for (_, armed) in timers.armed {
        match armed {
            Armed::Perf(fd) => {
                perf_event::disable(fd);
                perf_fds.push(fd);
            }
            posix => disarm(posix),
        }
    }
    // After the timers are gone: a tick landing in this loop would charge the program for it
    // (one signal weighs up to 16 samples at 4000 Hz).
    thread_accounts::clear();
    Stopped {
        perf_fds,
        unsampled_threads: timers.unsampled,
        limit_fallbacks: timers.limit_fallbacks,
        lowered_limit: timers.lowered_limit,
    }
}

/// Closes perf event fds returned by `stop`, once no handler can be using them (those the
/// program has closed and reused meanwhile are left alone).
pub fn close(perf_fds: Vec<c_int>) {
    for fd in perf_fds {
        perf_event::close(fd);
    }
}

/// Arms the calling thread if per-thread timers are running, and makes sure its timer is
/// deleted when it exits. Called at the start of every thread created through
/// `pthread_create` under libcpuprof.so (with the thread's start routine, to which CPU time the
/// timer owes at exit is charged), and by `ProfilerRegisterThread`.
pub fn on_thread_start(start: Option<&thread_accounts::StartChain>) {
    let tid = gettid();
    // A workspace for this thread's handler before its timer can fire.
    super::handler::workspaces_for_threads();
    if let Some(t) = running(&mut TIMERS.lock()) {
        t.arm_thread(tid, start);
        t.note_change(tid);
    }
    // SAFETY: a non-null value makes the key's destructor run when this thread exits.
    unsafe { libc::pthread_setspecific(exit_key(), 1 as *const c_void) };
}

/// For a thread of cpuprof's that starts while profiling runs (a writer that waited for the
/// program's first thread): the timer the `pthread_create` interposer armed for it, as for any
/// thread, is deleted, it is never armed again, and a profiling signal already pending for it
/// (it blocks every signal) is taken off its queue, so it is never counted as a thread that
/// keeps the signal blocked.
pub fn leave_calling_thread_unsampled() {
    let tid = gettid();
    let signal = {
        let mut timers = TIMERS.lock();
        let Some(t) = running(&mut timers) else { return };
        if let Some(armed) = t.remove_armed(tid) {
            disarm(armed);
        }
        // Armed as any new thread is, it is not one of the program's: out of the counts too.
        if t.fell_back.remove(&tid) {
            t.limit_fallbacks -= 1;
        }
        if t.unarmed.remove(&tid) {
            t.unsampled -= 1;
        }
        t.excluded.push(tid);
        t.note_change(tid);
        t.signal
    };
    // The kernel's sigset is 64 bits, not glibc's 1024-bit `sigset_t`.
    const KERNEL_SIGSET_BYTES: libc::c_long = 8;
    // SAFETY: rt_sigtimedwait with a zero timeout on local sets; the signal is blocked here.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        while libc::syscall(
            libc::SYS_rt_sigtimedwait,
            &set as *const libc::sigset_t,
            std::ptr::null_mut::<libc::siginfo_t>(),
            &zero as *const libc::timespec,
            KERNEL_SIGSET_BYTES,
        ) == libc::c_long::from(signal)
        {}
    }
}

/// Arms threads that appeared and disarms threads that are gone; re-arms threads whose perf
/// descriptor the program took. Run by the writer thread every tick; lists `/proc/self/task`
/// only when the thread count differs from what the registry accounts for, or the listing
/// interval has passed (see the module's documentation).
pub fn sync_with_tasks() {
    // Read before the registry: a thread that starts or ends after this read changes the
    // count again, so the next tick sees it, whatever this one decides.
    let count = crate::in_program::procfs::self_thread_count();
    let now = Instant::now();
    {
        let mut timers = TIMERS.lock();
        let Some(t) = running(&mut timers) else { return };
        if now.duration_since(t.last_identity_check) >= IDENTITY_CHECK_INTERVAL {
            t.last_identity_check = now;
            // Their threads leave `armed`: the count then differs and they are armed again below.
            t.forget_taken_perf_fds();
        }
        // No count (the directory cannot be opened: out of descriptors) means list, as
        // before the count existed; the listing then fails too and every timer is kept.
        if count == Some(t.accounted_for()) && now < t.next_listing {
            return;
        }
        t.listing = true;
        t.changed_while_listing.clear();
    }
    // Without the lock: threads starting meanwhile must not wait ~1 ms (1,000 threads) for it.
    let tids = crate::in_program::procfs::self_tids();
    let mut timers = TIMERS.lock();
    let Some(t) = running(&mut timers) else { return };
    t.listing = false;
    // Unreadable: keep every timer until the next poll, which tries again (the count cannot
    // match until a listing has succeeded).
    let Some(mut tids) = tids else {
        t.untracked = usize::MAX;
        return;
    };
    tids.sort_unstable();
    let mut changed = std::mem::take(&mut t.changed_while_listing);
    changed.sort_unstable();
    let settled = |tid: &libc::pid_t| changed.binary_search(tid).is_err();
    let gone: Vec<libc::pid_t> = t
        .armed
        .keys()
        .filter(|tid| tids.binary_search(tid).is_err() && settled(tid))
        .copied()
        .collect();
    let mut found = !gone.is_empty();
    for tid in gone {
        if let Some(armed) = t.remove_armed(tid) {
            disarm(armed);
        }
    }
    t.unarmed.retain(|tid| tids.binary_search(tid).is_ok());
    t.fell_back.retain(|tid| tids.binary_search(tid).is_ok());
    let mut new = Vec::new();
    for &tid in &tids {
        let known = t.armed.contains_key(&tid) || t.unarmed.contains(&tid) || t.excluded.contains(&tid);
        if settled(&tid) && !known {
            found = true;
            t.arm_thread(tid, None);
            new.push(tid);
        }
    }
    t.listed(&tids, now, found);
    drop(timers);
    // Threads nothing announced (started without libcpuprof.so's pthread_create) have no exit
    // hook to record their names: they are read as they are found.
    if crate::in_program::thread_names::wanted() {
        for tid in new {
            crate::in_program::thread_names::read(tid);
        }
    }
}

impl Timers {
    /// How many threads the registry accounts for: compared with the kernel's thread count.
    fn accounted_for(&self) -> usize {
        self.armed
            .len()
            .saturating_add(self.unarmed.len())
            .saturating_add(self.untracked)
    }

    /// Records a listing of `tids` (sorted), begun at `began`, once the registry has been
    /// brought up to date with it; `found`: whether it found threads nothing announced, begun
    /// or gone. Schedules the next listing that is due whatever the count says.
    fn listed(&mut self, tids: &[libc::pid_t], began: Instant, found: bool) {
        self.untracked = tids
            .iter()
            .filter(|tid| !self.armed.contains_key(tid) && !self.unarmed.contains(tid))
            .count();
        let now = Instant::now();
        if found {
            self.last_found = now;
        }
        let longest = began
            .elapsed()
            .saturating_mul(LISTING_SHARE)
            .clamp(LISTING_INTERVAL, MAX_LISTING_INTERVAL);
        self.listing_gap = if now.duration_since(self.last_found) < LISTING_INTERVAL {
            Duration::ZERO
        } else {
            self.listing_gap.saturating_mul(2).clamp(FIRST_QUIET_GAP, longest)
        };
        self.next_listing = now + self.listing_gap;
    }

    /// Thread `tid` started or ended by itself: remembered while a listing is under way.
    fn note_change(&mut self, tid: libc::pid_t) {
        if self.listing {
            self.changed_while_listing.push(tid);
        }
    }

    fn insert_armed(&mut self, tid: libc::pid_t, armed: Armed) {
        if matches!(armed, Armed::Perf(_)) {
            self.perf_armed += 1;
        }
        if let Some(Armed::Perf(_)) = self.armed.insert(tid, armed) {
            self.perf_armed -= 1;
        }
    }

    fn remove_armed(&mut self, tid: libc::pid_t) -> Option<Armed> {
        let armed = self.armed.remove(&tid);
        if let Some(Armed::Perf(_)) = armed {
            self.perf_armed -= 1;
        }
        armed
    }

    /// Arms thread `tid` unless it is armed or ours. `start` (its start routine and that
    /// routine's callers): the caller is `tid` itself, starting, and opens the account that
    /// settles its POSIX timer at exit.
    fn arm_thread(&mut self, tid: libc::pid_t, start: Option<&thread_accounts::StartChain>) {
        if let (Some(chain), Some(Armed::Posix(id))) = (start, self.armed.get(&tid)) {
            // Armed by the writer's poll, which saw the thread before it got here: that timer
            // has no account, and what it owed at exit would be lost (a quarter of the samples
            // of 512 short threads on a loaded machine). The account opens on its lattice
            // from its next expiry on (a signal pending meanwhile is credited to it: at worst
            // a period is missed, never counted twice).
            // SAFETY: itimerspec is plain integers; timer_gettime reads our own timer into it.
            let mut spec: libc::itimerspec = unsafe { std::mem::zeroed() };
            if unsafe { libc::timer_gettime(*id, &mut spec) } == 0 {
                let left = spec.it_value.tv_sec as u64 * 1_000_000_000 + spec.it_value.tv_nsec as u64;
                thread_accounts::open(thread_pointer(), thread_accounts::thread_cpu_ns() + left, chain);
            }
            return;
        }
        if let (Some(chain), Some(Armed::Perf(_))) = (start, self.armed.get(&tid)) {
            // Armed by the writer's poll too: without an account, the part of a period its
            // event counted and no signal weighed was lost at exit (`on_thread_exit`): 512
            // threads 4 ms long beside two busy loops sampled 0.74-0.93 of their CPU time.
            thread_accounts::open(thread_pointer(), u64::MAX, chain);
            return;
        }
        if self.armed.contains_key(&tid) || self.excluded.contains(&tid) {
            return;
        }
        if self.preferred == ThreadTimerKind::Perf {
            // A thread arming itself at its start has its whole life accounted for, from CPU
            // time 0: what it spent before the event was armed (its start, the arming's own
            // system calls) is in its samples too, or in what it leaves at exit (5 % of the
            // time of 512 threads 4 ms long was missing otherwise).
            match self.arm_perf(tid, start.is_some().then_some(0)) {
                Ok(fd) => {
                    if let Some(chain) = start {
                        // An account that never expires: it keeps the chain that the part of a
                        // period left at exit is charged to (`on_thread_exit`).
                        thread_accounts::open(thread_pointer(), u64::MAX, chain);
                    }
                    self.insert_armed(tid, Armed::Perf(fd));
                    return;
                }
                // The thread exited since it was listed.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return,
                // F_DUPFD into the budget fails (EINVAL, or EMFILE) once the program has lowered
                // its limit under it: say so, by the limit, each time it goes lower.
                Err(_) if !perf_event::counts_events() && perf_event::lowered_limit().is_some() => {
                    let lowered = perf_event::lowered_limit().unwrap();
                    self.limit_fallbacks += 1;
                    self.fell_back.insert(tid);
                    if self.lowered_limit.is_none_or(|said| lowered.limit < said) {
                        self.lowered_limit = Some(lowered.limit);
                        crate::say!(
                            "cpuprof: no perf event for thread {tid}: {}; threads from now on get POSIX CPU timers",
                            lowered.explain()
                        );
                    }
                }
                Err(e) if !self.perf_refusal_said => {
                    self.perf_refusal_said = true;
                    if perf_event::counts_events() {
                        crate::say!("cpuprof: no perf event for thread {tid} ({e}); such threads are not sampled");
                    } else {
                        crate::say!("cpuprof: no perf event for thread {tid} ({e}); such threads get POSIX CPU timers");
                    }
                }
                Err(_) => {}
            }
            if perf_event::counts_events() {
                // A CPU timer would mix CPU time into a profile of events: the thread goes
                // unsampled, counted and reported at stop.
                if self.unarmed.insert(tid) {
                    self.unsampled += 1;
                }
                return;
            }
        }
        let cpu_before = thread_accounts::thread_cpu_ns();
        match arm_posix(tid, self.signal, self.period_ns) {
            Ok((id, first)) => {
                if let Some(chain) = start {
                    thread_accounts::open(thread_pointer(), cpu_before + first, chain);
                }
                self.insert_armed(tid, Armed::Posix(id));
            }
            // The thread may have exited since it was listed (EINVAL: no such clock).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ESRCH)) => {}
            Err(_) => {
                if self.unarmed.insert(tid) {
                    self.unsampled += 1;
                }
            }
        }
    }

    /// A perf event for `tid`, whose samples account for its CPU time from `accounted_from`
    /// (`None`: from now).
    fn arm_perf(&self, tid: libc::pid_t, accounted_from: Option<u64>) -> io::Result<c_int> {
        if self.perf_armed >= perf_event::budget() {
            return Err(io::Error::other("descriptor budget spent"));
        }
        if let Some(lowered) = perf_event::lowered_limit().filter(|l| l.none_left) {
            // No number to put an event at: not worth a perf_event_open.
            return Err(io::Error::other(lowered.explain()));
        }
        perf_allowed_here()?;
        perf_event::open(tid, self.signal, self.period_ns, accounted_from)
    }

    /// Drops perf descriptors that no longer hold our events (the program closed them, maybe
    /// reusing the numbers), without touching them; their threads are armed again.
    fn forget_taken_perf_fds(&mut self) {
        let taken: Vec<libc::pid_t> = self
            .armed
            .iter()
            .filter(|(_, a)| matches!(a, Armed::Perf(fd) if !perf_event::is_ours(*fd)))
            .map(|(&tid, _)| tid)
            .collect();
        if !taken.is_empty() && self.perf_fds_taken == 0 {
            crate::say!(
                "cpuprof: the program closed {} of cpuprof's perf event descriptors; they are left to it and \
                 the threads are given new timers",
                taken.len()
            );
        }
        self.perf_fds_taken += taken.len();
        if !taken.is_empty() {
            crate::in_program::fd::let_the_program_reopen_first();
        }
        for tid in taken {
            self.remove_armed(tid);
        }
    }
}

/// The calling thread's timer, stopped but not deleted for an `exec` (see
/// `session::process_end`), and what to restore if the exec fails.
pub enum PausedThreadTimer {
    Posix(libc::pid_t, libc::timer_t, libc::itimerspec),
    Perf(libc::pid_t, c_int),
}

/// The signal of the running per-thread timers, if they run in this process.
pub fn running_signal(limit: Duration) -> Option<c_int> {
    running(&mut *TIMERS.try_lock_for(limit)?).map(|t| t.signal)
}

/// Stops the calling thread's timer without deleting it. Waits at most `limit` for the
/// registry (the caller may be a signal handler that interrupted its holder).
pub fn pause_calling_thread(limit: Duration) -> Option<PausedThreadTimer> {
    let tid = gettid();
    let mut timers = TIMERS.try_lock_for(limit)?;
    match running(&mut timers)?.armed.get(&tid)? {
        Armed::Posix(id) => {
            let off: libc::itimerspec = unsafe { std::mem::zeroed() };
            // SAFETY: zeroed is a valid itimerspec; `old` is written by timer_settime.
            let mut old: libc::itimerspec = unsafe { std::mem::zeroed() };
            // SAFETY: our own timer, disarmed; its setting is kept to re-arm it.
            (unsafe { libc::timer_settime(*id, 0, &off, &mut old) } == 0)
                .then_some(PausedThreadTimer::Posix(tid, *id, old))
        }
        Armed::Perf(fd) => {
            perf_event::disable(*fd);
            Some(PausedThreadTimer::Perf(tid, *fd))
        }
    }
}

/// Re-arms a timer `pause_calling_thread` stopped, if the registry still holds it (profiling
/// may have stopped meanwhile, and the id or descriptor may then belong to the program).
pub fn resume(paused: PausedThreadTimer, limit: Duration) {
    let Some(mut timers) = TIMERS.try_lock_for(limit) else {
        return;
    };
    let Some(t) = running(&mut timers) else { return };
    match paused {
        PausedThreadTimer::Posix(tid, id, setting) => {
            if matches!(t.armed.get(&tid), Some(Armed::Posix(armed)) if *armed == id) {
                // SAFETY: our own timer, still registered.
                unsafe { libc::timer_settime(id, 0, &setting, std::ptr::null_mut()) };
            }
        }
        PausedThreadTimer::Perf(tid, fd) => {
            if matches!(t.armed.get(&tid), Some(Armed::Perf(armed)) if *armed == fd) {
                perf_event::enable(fd);
            }
        }
    }
}

/// Refuses `perf_event_open` on a thread under a seccomp filter: sandboxes commonly kill the
/// process on it (systemd's `SystemCallFilter=` leaves it out of `@system-service`).
pub(crate) fn perf_allowed_here() -> io::Result<()> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let mode = status.lines().find_map(|l| l.strip_prefix("Seccomp:")).map(str::trim);
    match mode {
        Some("0") => Ok(()),
        Some(_) => Err(io::Error::other("the thread runs under a seccomp filter")),
        // No field: a kernel without seccomp, which cannot filter system calls.
        None if status.contains("Pid:") => Ok(()),
        None => Err(io::Error::other("cannot read /proc/thread-self/status")),
    }
}

/// Deletes the calling thread's timer at thread exit (pthread key destructor). The profiling
/// signal is blocked first: no handler then runs between settling the thread's account and its
/// end, nor between closing its perf fd and its end (it could otherwise re-arm an fd number
/// another thread has just reused). What its POSIX timer owed is charged to its start routine.
extern "C" fn on_thread_exit(_value: *mut c_void) {
    let tid = gettid();
    super::handler::thread_ended();
    if crate::in_program::thread_names::wanted() {
        // Its samples may still wait in the table: the name is read while it can be.
        crate::in_program::thread_names::remember_own(tid);
    }
    if let Some(t) = running(&mut TIMERS.lock()) {
        t.note_change(tid);
        t.fell_back.remove(&tid);
        if let Some(armed) = t.remove_armed(tid) {
            signals::block_in_current_thread(t.signal);
            let owed = thread_accounts::settle(thread_pointer(), thread_accounts::thread_cpu_ns(), t.period_ns);
            match (&armed, owed) {
                (Armed::Posix(_), Some((periods @ 1.., chain, delivery))) => {
                    super::handler::record_outside_handler(chain.pcs(), periods, Some(delivery));
                }
                // What the event counted and no signal weighed: whole periods, and the part of
                // one as a sample with the probability it stands for, so that many short
                // threads are not undercounted by about half a period each (11 % of 512
                // threads' samples at 1000 Hz).
                (Armed::Perf(fd), Some((_, chain, _))) => {
                    let period = t.period_ns.max(1);
                    let left = perf_event::unweighed(*fd).unwrap_or(0);
                    let periods = left / period + u64::from(random_below(period) < left % period);
                    if periods > 0 {
                        super::handler::record_outside_handler(chain.pcs(), periods, None);
                    }
                }
                _ => {}
            }
            disarm(armed);
        }
    }
}

fn exit_key() -> libc::pthread_key_t {
    static INIT: Once = Once::new();
    static mut KEY: libc::pthread_key_t = 0;
    // SAFETY: KEY is written once, inside call_once, before any read.
    unsafe {
        INIT.call_once(|| {
            libc::pthread_key_create(&raw mut KEY, Some(on_thread_exit));
        });
        KEY
    }
}

fn disarm(armed: Armed) {
    match armed {
        // SAFETY: deleting our own timer.
        Armed::Posix(id) => unsafe {
            libc::timer_delete(id);
        },
        Armed::Perf(fd) => {
            perf_event::disable(fd);
            perf_event::close(fd);
        }
    }
}

/// Creates and starts a POSIX CPU timer for `tid`; returns it and its first expiry, in ns of
/// the thread's CPU time from now.
fn arm_posix(tid: libc::pid_t, signal: c_int, period_ns: u64) -> io::Result<(libc::timer_t, u64)> {
    // SAFETY: plain timer_create / timer_settime with initialised structures.
    unsafe {
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = signal;
        event.sigev_notify_thread_id = tid;
        let mut id: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(thread_cpu_clock(tid), &mut event, &mut id) != 0 {
            return Err(io::Error::last_os_error());
        }
        let first = jittered_first(period_ns);
        let spec = libc::itimerspec {
            it_interval: timespec(period_ns),
            it_value: timespec(first),
        };
        if libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) != 0 {
            let e = io::Error::last_os_error();
            libc::timer_delete(id);
            return Err(e);
        }
        Ok((id, first))
    }
}

/// The CPU-time clock of thread `tid` (what `pthread_getcpuclockid` computes from a pthread_t):
/// `(~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`.
pub(super) fn thread_cpu_clock(tid: libc::pid_t) -> libc::clockid_t {
    ((!tid) << 3) | 4 | 2
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// A thread timer's first expiry: random within one period, so threads shorter than a period
/// are sampled in proportion to their length rather than never. Async-signal-safe.
pub(super) fn jittered_first(period_ns: u64) -> u64 {
    1 + random_below(period_ns)
}

/// A random number below `n`. Async-signal-safe: splitmix64 over a shared atomic counter
/// seeded from the clock at first use (quality enough to decorrelate sampling from workloads).
pub(super) fn random_below(n: u64) -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    const GAMMA: u64 = 0x9e3779b97f4a7c15;
    let mut z = STATE.fetch_add(GAMMA, Ordering::Relaxed).wrapping_add(GAMMA);
    if z == GAMMA {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes into `ts`; async-signal-safe (vDSO).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        z ^= (ts.tv_nsec as u64) << 17 ^ ts.tv_sec as u64 ^ u64::from(gettid() as u32) << 40;
        STATE.fetch_add(z, Ordering::Relaxed);
    }
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    (z ^ (z >> 31)) % n.max(1)
}

/// A sampling interval drawn uniformly from [period/2, 3*period/2): the mean is the period, and
/// no periodic workload can stay in step with the samples (a perf event expires after exactly
/// its period of CPU time, so a loop whose iteration takes about a period would otherwise
/// be sampled at the same point each time and its functions' shares come out wrong).
pub(super) fn jittered(period_ns: u64) -> u64 {
    period_ns / 2 + random_below(period_ns)
}

pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_clock_matches_glibc() {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: queries the calling thread's clock id.
        unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
        assert_eq!(thread_cpu_clock(gettid()), clock);
    }
}
