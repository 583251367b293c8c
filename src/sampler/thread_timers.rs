//! One sampling timer per thread, for every thread, so each thread is sampled by its own CPU
//! time: no under-counting of busy threads when several run at once, and each expiry the
//! kernel could not deliver is reported (`si_overrun`) and counted.
//!
//! Two kinds:
//! * POSIX CPU timers: `timer_create` on the thread's CPU clock with `SIGEV_THREAD_ID`.
//!   Fired from the scheduler tick (250 Hz here), so above that frequency a signal carries
//!   `si_overrun` missed expirations, which the handler adds to the sample's weight.
//! * perf events: a software `cpu-clock` event per thread, hrtimer-driven, delivering a
//!   signal to its thread on each overflow (`F_SETOWN_EX` + `F_SETSIG` + `O_ASYNC`). The event
//!   disables itself after one overflow; the handler re-enables it with
//!   `PERF_EVENT_IOC_REFRESH`. The event signals in user mode only (see [`arm_perf`]), so the
//!   kernel drops expirations that fall in kernel time; the handler reads the event's count,
//!   which includes kernel time, and weights the sample with the periods that passed
//!   ([`rearm_perf_and_weigh`]), with a jittered next interval. Those calls (a `read` and two
//!   `ioctl`s) are the timer's own system calls.
//!
//! Threads are armed when profiling starts (all of `/proc/self/task`), when they start
//! ([`on_thread_start`], called by the `pthread_create` interposer of libcpuprof.so and by
//! `ProfilerRegisterThread`), and by the writer thread's poll of `/proc/self/task` for threads
//! nothing announced. A thread's timer is deleted when it exits (a pthread key destructor set by
//! `on_thread_start`) or when the poll finds it gone, so timers never accumulate.

use crate::sync::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

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

struct Timers {
    kind: ThreadTimerKind,
    signal: c_int,
    period_ns: u64,
    armed: HashMap<libc::pid_t, Armed>,
    /// cpuprof's own threads, never armed.
    excluded: Vec<libc::pid_t>,
    /// The process profiling. A forked child inherits this registry but not the session's
    /// timers or writer: it must not arm its threads.
    pid: u32,
}

/// The registry, if per-thread timers run in this process (not in a forked child).
fn running(timers: &mut Option<Timers>) -> Option<&mut Timers> {
    timers.as_mut().filter(|t| t.pid == std::process::id())
}

/// The per-thread timers of the running session, if it uses them.
static TIMERS: Mutex<Option<Timers>> = Mutex::new(None);

/// Checks that `kind` can be used here by arming and disarming the calling thread once.
pub fn probe(kind: ThreadTimerKind, signal: c_int, period_ns: u64) -> io::Result<()> {
    let armed = arm(kind, gettid(), signal, period_ns)?;
    disarm(armed, None);
    Ok(())
}

/// Starts per-thread timers: every current thread of the process is armed, except `excluded`
/// (cpuprof's own writer thread).
pub fn start(kind: ThreadTimerKind, signal: c_int, period_ns: u64, excluded: Vec<libc::pid_t>) -> io::Result<()> {
    let mut timers = Timers {
        kind,
        signal,
        period_ns,
        armed: HashMap::new(),
        excluded,
        pid: std::process::id(),
    };
    arm_missing(&mut timers, &crate::sys::procfs::self_tids().unwrap_or_default())?;
    *TIMERS.lock() = Some(timers);
    Ok(())
}

/// Deletes every timer. Signals already queued may still arrive; the handler ignores them
/// once the sampler state is unpublished, which the session does before closing perf fds
/// (see `close`), so a late handler never re-arms an fd number the application may reuse.
pub fn stop() -> Vec<c_int> {
    let Some(timers) = TIMERS.lock().take() else {
        return Vec::new();
    };
    let mut perf_fds = Vec::new();
    for (_, armed) in timers.armed {
        match armed {
            Armed::Perf(fd) => {
                // SAFETY: our own perf event fd.
                unsafe { libc::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0) };
                perf_fds.push(fd);
            }
            posix => disarm(posix, None),
        }
    }
    perf_fds
}

/// Closes perf event fds returned by `stop`, once no handler can be using them.
pub fn close(perf_fds: Vec<c_int>) {
    for fd in perf_fds {
        // SAFETY: our own fds, no longer referenced.
        unsafe { libc::close(fd) };
    }
}

/// Arms the calling thread if per-thread timers are running, and makes sure its timer is
/// deleted when it exits. Called at the start of every thread created through
/// `pthread_create` under libcpuprof.so, and by `ProfilerRegisterThread`.
pub fn on_thread_start() {
    let tid = gettid();
    if let Some(t) = running(&mut TIMERS.lock()) {
        let _ = arm_missing(t, &[tid]);
    }
    // SAFETY: a non-null value makes the key's destructor run when this thread exits.
    unsafe { libc::pthread_setspecific(exit_key(), 1 as *const c_void) };
}

/// Arms threads that appeared and disarms threads that are gone. Run by the writer thread.
pub fn sync_with_tasks() {
    // Unreadable (out of descriptors): keep every timer until the next poll.
    let Some(tids) = crate::sys::procfs::self_tids() else {
        return;
    };
    if let Some(t) = running(&mut TIMERS.lock()) {
        let gone: Vec<libc::pid_t> = t.armed.keys().filter(|tid| !tids.contains(tid)).copied().collect();
        for tid in gone {
            if let Some(armed) = t.armed.remove(&tid) {
                disarm(armed, None);
            }
        }
        let _ = arm_missing(t, &tids);
    }
}

fn arm_missing(t: &mut Timers, tids: &[libc::pid_t]) -> io::Result<()> {
    let mut first_error = None;
    for &tid in tids {
        if t.armed.contains_key(&tid) || t.excluded.contains(&tid) {
            continue;
        }
        match arm(t.kind, tid, t.signal, t.period_ns) {
            Ok(armed) => {
                t.armed.insert(tid, armed);
            }
            // The thread may have exited since it was listed.
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    match first_error {
        Some(e) if t.armed.is_empty() => Err(e),
        _ => Ok(()),
    }
}

/// Deletes the calling thread's timer at thread exit (pthread key destructor).
extern "C" fn on_thread_exit(_value: *mut c_void) {
    let tid = gettid();
    if let Some(t) = running(&mut TIMERS.lock()) {
        if let Some(armed) = t.armed.remove(&tid) {
            disarm(armed, Some(t.signal));
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

fn arm(kind: ThreadTimerKind, tid: libc::pid_t, signal: c_int, period_ns: u64) -> io::Result<Armed> {
    match kind {
        ThreadTimerKind::Posix => arm_posix(tid, signal, period_ns).map(Armed::Posix),
        ThreadTimerKind::Perf => arm_perf(tid, signal, period_ns).map(Armed::Perf),
    }
}

/// `block`: the thread being disarmed is the caller, exiting; its profiling signal is blocked
/// first so that no handler runs between closing its perf fd and the thread's end (it could
/// otherwise re-arm an fd number another thread has just reused).
fn disarm(armed: Armed, block: Option<c_int>) {
    // SAFETY: deleting our own timer / closing our own fd.
    unsafe {
        match armed {
            Armed::Posix(id) => {
                libc::timer_delete(id);
            }
            Armed::Perf(fd) => {
                if let Some(signal) = block {
                    super::signals::block_in_current_thread(signal);
                }
                libc::ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
                libc::close(fd);
            }
        }
    }
}

fn arm_posix(tid: libc::pid_t, signal: c_int, period_ns: u64) -> io::Result<libc::timer_t> {
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
        // A random first expiry within one period, so threads shorter than a period are
        // sampled in proportion to their length rather than never.
        let first = 1 + random_below(period_ns);
        let spec = libc::itimerspec {
            it_interval: timespec(period_ns),
            it_value: timespec(first),
        };
        if libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) != 0 {
            let e = io::Error::last_os_error();
            libc::timer_delete(id);
            return Err(e);
        }
        Ok(id)
    }
}

/// The CPU-time clock of thread `tid` (what `pthread_getcpuclockid` computes from a pthread_t):
/// `(~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`.
fn thread_cpu_clock(tid: libc::pid_t) -> libc::clockid_t {
    ((!tid) << 3) | 4 | 2
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// A random number below `n`. Async-signal-safe: splitmix64 over a shared atomic counter
/// seeded from the clock at first use (quality enough to decorrelate sampling from workloads).
fn random_below(n: u64) -> u64 {
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
fn jittered(period_ns: u64) -> u64 {
    period_ns / 2 + random_below(period_ns)
}

// perf_event_open(2) constants and the attribute layout (PERF_ATTR_SIZE_VER5), which the libc
// crate does not provide for glibc.
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const ATTR_DISABLED: u64 = 1 << 0;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const PERF_EVENT_IOC_REFRESH: libc::c_ulong = 0x2402;
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const F_SETSIG: c_int = 10;
const F_SETOWN_EX: c_int = 15;
const F_OWNER_TID: c_int = 0;

#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

/// Perf fds below this have their count tracked for weighting; a sample through a higher fd
/// counts once (a process with thousands of files open and profiled threads loses only the
/// kernel-time periods of those threads).
const WEIGHED_FDS: usize = 4096;
/// For each perf fd, the event count (thread CPU nanoseconds, kernel time included) that the
/// samples taken through it so far account for.
static PERF_ACCOUNTED: [AtomicU64; WEIGHED_FDS] = [const { AtomicU64::new(0) }; WEIGHED_FDS];
/// The sampling period of the perf events, in nanoseconds.
static PERF_PERIOD_NS: AtomicU64 = AtomicU64::new(0);

/// Re-enables the perf event `fd` that just sent a signal, with a fresh jittered interval,
/// and returns how many sampling periods of its thread's CPU time the sample stands for:
/// the CPU time since the samples so far, kernel time included, in periods (with the
/// remainder carried to the next sample, so intervals of any length add up exactly).
///
/// # Safety
/// Async-signal-safe; `fd` comes from the siginfo of a perf signal (a stale or foreign fd only
/// makes `read` fail or return a meaningless count, which is bounded below by one sample).
pub(super) unsafe fn rearm_perf_and_weigh(fd: c_int) -> u64 {
    let mut count: u64 = 0;
    let counted = libc::read(fd, (&mut count as *mut u64).cast(), 8) == 8;
    let period = PERF_PERIOD_NS.load(Ordering::Relaxed);
    // The event disabled itself at its overflow, so the new interval takes effect on REFRESH
    // without touching a running timer.
    let next = jittered(period.max(2));
    libc::ioctl(fd, PERF_EVENT_IOC_PERIOD, &next as *const u64);
    libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1);
    let Some(accounted) = PERF_ACCOUNTED.get(fd as usize).filter(|_| counted && period > 0) else {
        return 1;
    };
    // Rounded: the count lags the expiry by the signal's delivery, and the event is off from
    // its overflow until the REFRESH above.
    let last = accounted.load(Ordering::Relaxed);
    let periods = (count.saturating_sub(last) + period / 2) / period;
    let weight = periods.max(1);
    accounted.store(last + weight * period, Ordering::Relaxed);
    weight
}

fn arm_perf(tid: libc::pid_t, signal: c_int, period_ns: u64) -> io::Result<c_int> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        // The first interval is random within one period, so threads shorter than a period
        // are sampled in proportion to their length; later ones are jittered by the handler.
        sample_period: 1 + random_below(period_ns),
        // User time only: an overflow while the thread is in the kernel would queue a signal
        // that an `execve` in progress carries into the new program, which dies of it. In
        // user mode the signal is delivered at once, on the interrupt's return.
        // Kernel time is still counted: the event's count includes it (see
        // `rearm_perf_and_weigh`).
        flags: ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        wakeup_events: 1,
        ..Default::default()
    };
    // SAFETY: perf_event_open with a valid attribute; fcntl/ioctl on the fd it returns.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            tid,
            -1,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        ) as c_int;
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(accounted) = PERF_ACCOUNTED.get(fd as usize) {
            // A new event counts from zero; set before it is enabled below.
            accounted.store(0, Ordering::Relaxed);
            PERF_PERIOD_NS.store(period_ns, Ordering::Relaxed);
        }
        let owner = [F_OWNER_TID, tid];
        let setup = libc::fcntl(fd, F_SETOWN_EX, owner.as_ptr()) == 0
            && libc::fcntl(fd, F_SETSIG, signal) == 0
            && libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_ASYNC) == 0
            && libc::ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) == 0;
        if !setup {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_layout_is_perf_attr_size_ver5() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 112);
    }

    #[test]
    fn thread_clock_matches_glibc() {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: queries the calling thread's clock id.
        unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
        assert_eq!(thread_cpu_clock(gettid()), clock);
    }
}
