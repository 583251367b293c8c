//! Installing signal handlers without taking a signal away from the application, and keeping
//! our signals out of the application's handlers that run on its alternate signal stack.
//!
//! A thread running its own `SA_ONSTACK` handler is on its sigaltstack, and the kernel puts
//! any further signal frame there too, whatever that signal's flags; if the rest of the
//! altstack cannot hold the frame (AT_MINSIGSTKSZ, 3.4 KiB here, plus our handler), the kernel
//! kills the process. So our signals are added to the mask of every application handler
//! installed with `SA_ONSTACK`: the kernel then holds them until that handler returns (the
//! sample is taken late, at the interrupted code, not lost). Handlers installed before our
//! signal are updated when it is installed; later ones by `application_sigaction`, which
//! libcpuprof.so interposes as `sigaction`. The added bits are hidden from what `sigaction`
//! reports back. Handlers with `SA_NODEFER` are left alone: they may leave by `longjmp`,
//! which would keep our signal blocked on that thread for good.

use super::default_actions;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The handler function type for `SA_SIGINFO` handlers.
pub type SigInfoHandler = unsafe extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// Why a handler could not be installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalError {
    /// The application already handles this signal; cpuprof leaves it alone.
    InUse {
        /// The signal's number.
        signal: c_int,
    },
    /// Not a signal a profiler can use (out of range, or one the kernel reserves).
    Invalid {
        /// The signal's number.
        signal: c_int,
    },
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::InUse { signal } => write!(
                f,
                "signal {} ({}) already has a handler installed by the application; cpuprof will not replace it",
                signal,
                signal_name(*signal)
            ),
            SignalError::Invalid { signal } => write!(f, "signal {signal} cannot be used for profiling"),
        }
    }
}

/// Handler currently installed by us for each signal number (0 = none).
static OURS: [AtomicUsize; 65] = [const { AtomicUsize::new(0) }; 65];

/// For each signal, which of our signals (bit `s - 1`) we added to its handler's mask.
static SHIELDED: [AtomicU64; 65] = [const { AtomicU64::new(0) }; 65];

/// Serialises changes to the application's handlers (ours and `application_sigaction`'s).
static CHANGING: AtomicBool = AtomicBool::new(false);

type SigactionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;

/// libc's `sigaction`, past libcpuprof.so's interposed one; resolved once, before any
/// signal handler can need it (`dlsym` may take the loader lock).
fn real_sigaction_fn() -> SigactionFn {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut addr = REAL.load(Ordering::Acquire);
    if addr == 0 {
        // SAFETY: dlsym with a constant NUL-terminated name; RTLD_NEXT skips this object.
        addr = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        if addr == 0 {
            addr = libc::sigaction as *const () as usize;
        }
        REAL.store(addr, Ordering::Release);
    }
    // SAFETY: `addr` is a `sigaction` with this signature.
    unsafe { std::mem::transmute::<usize, SigactionFn>(addr) }
}

/// # Safety
/// As `sigaction(2)`.
pub(crate) unsafe fn real_sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    real_sigaction_fn()(signal, act, old)
}

/// Holds `CHANGING` with every signal blocked on this thread, so no handler of this thread
/// can call `sigaction` and wait for itself.
struct Changing(libc::sigset_t);

impl Changing {
    fn enter() -> Changing {
        // SAFETY: plain signal-mask calls on this thread's own sets.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
            while CHANGING
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                libc::sched_yield();
            }
            Changing(previous)
        }
    }
}

impl Drop for Changing {
    fn drop(&mut self) {
        CHANGING.store(false, Ordering::Release);
        // SAFETY: restores the mask saved by `enter`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// In a forked child (a `pthread_atfork` child handler): a parent thread that was changing a
/// handler at the fork does not exist here, so its hold on `CHANGING` must not outlive it.
pub fn release_in_child() {
    CHANGING.store(false, Ordering::Release);
    OWNER_PID.store(own_pid(), Ordering::Release);
}

/// The process whose handlers these are: the one that installed them, or the forked child
/// that inherited them (`release_in_child`). A `vfork` child (or a `posix_spawn` one) shares
/// this memory with its parent without being it: its `sigaction` calls (which commonly reset
/// every handled signal before `exec`, as CPython's and posix_spawn's children do) must change
/// its own dispositions only, never what cpuprof records for the parent, nor start anything.
static OWNER_PID: AtomicU32 = AtomicU32::new(0);

fn own_pid() -> u32 {
    // SAFETY: getpid has no preconditions (not cached by glibc: right in a vfork child).
    unsafe { libc::getpid() as u32 }
}

/// Whether the calling process shares cpuprof's memory without owning it (a vfork child).
/// Async-signal-safe.
pub fn in_borrowed_memory() -> bool {
    let owner = OWNER_PID.load(Ordering::Acquire);
    owner != 0 && owner != own_pid()
}

/// Our signals whose handler is still ours, as bits `s - 1`.
fn our_signals() -> u64 {
    let mut bits = 0;
    for (s, ours) in OURS.iter().enumerate().skip(1) {
        let ours = ours.load(Ordering::Acquire);
        // SAFETY: queries the current disposition.
        let current = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            (ours != 0 && real_sigaction(s as c_int, std::ptr::null(), &mut old) == 0).then_some(old.sa_sigaction)
        };
        if current.is_some_and(|c| c == ours) {
            bits |= 1 << (s - 1);
        }
    }
    bits
}

/// Adds the signals in `bits` (other than `signal` itself) to `action`'s mask if it is an
/// application handler that runs on the alternate stack; returns the bits it added.
fn shield(signal: c_int, action: &mut libc::sigaction, bits: u64) -> u64 {
    let flags = action.sa_flags;
    if flags & libc::SA_ONSTACK == 0
        || flags & libc::SA_NODEFER != 0
        || action.sa_sigaction == libc::SIG_DFL
        || action.sa_sigaction == libc::SIG_IGN
    {
        return 0;
    }
    let mut added = 0;
    for s in 1..65 {
        // SAFETY: `s` is a valid signal number and the set is ours to change.
        if bits & (1 << (s - 1)) != 0 && s != signal && unsafe { libc::sigismember(&action.sa_mask, s) } == 0 {
            unsafe { libc::sigaddset(&mut action.sa_mask, s) };
            added |= 1 << (s - 1);
        }
    }
    added
}

/// Removes from `action`'s mask the bits we added to `signal`'s handler.
fn unshield(signal: usize, action: &mut libc::sigaction) {
    let added = SHIELDED[signal].load(Ordering::Relaxed);
    for s in 1..65 {
        if added & (1 << (s - 1)) != 0 {
            // SAFETY: `s` is a valid signal number and the set is the caller's copy.
            unsafe { libc::sigdelset(&mut action.sa_mask, s) };
        }
    }
}

/// Adds `signal` (just installed as ours) to the mask of every existing `SA_ONSTACK`
/// application handler.
fn shield_existing_handlers(signal: c_int) {
    let _changing = Changing::enter();
    for s in 1..65usize {
        // SAFETY: reads and rewrites the disposition of `s` with an updated copy of itself;
        // `CHANGING` keeps `application_sigaction` from changing it in between.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            if OURS[s].load(Ordering::Acquire) != 0 || real_sigaction(s as c_int, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            let added = shield(s as c_int, &mut action, 1 << (signal - 1));
            if added != 0 && real_sigaction(s as c_int, &action, std::ptr::null_mut()) == 0 {
                SHIELDED[s].fetch_or(added, Ordering::Relaxed);
            }
        }
    }
}

/// `sigaction` for the application (libcpuprof.so interposes it): as libc's, except that
/// an `SA_ONSTACK` handler gets our signals added to its mask, and the bits we added are
/// not reported back. Async-signal-safe, like `sigaction`.
///
/// # Safety
/// As `sigaction(2)`.
pub unsafe fn application_sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let Some(index) = usize::try_from(signal).ok().filter(|i| (1..65).contains(i)) else {
        return real_sigaction(signal, act, old);
    };
    if in_borrowed_memory() {
        // A vfork child: its own dispositions, as libc's sigaction would set them.
        return real_sigaction(signal, act, old);
    }
    let held = default_actions::is_held(signal);
    let Some(act) = act.as_ref() else {
        let r = real_sigaction(signal, std::ptr::null(), old);
        if let (0, Some(old)) = (r, old.as_mut()) {
            unshield(index, old);
            if held {
                *old = default_actions::default_disposition();
            }
        }
        return r;
    };
    if default_actions::covers(signal) {
        if act.sa_sigaction == libc::SIG_DFL {
            // The default action, which cpuprof holds (or takes back) to complete the profile
            // before it happens.
            let mut previous: libc::sigaction = std::mem::zeroed();
            if real_sigaction(signal, std::ptr::null(), &mut previous) != 0 {
                return -1;
            }
            if default_actions::hold_one(signal) {
                if let Some(old) = old.as_mut() {
                    *old = if held {
                        default_actions::default_disposition()
                    } else {
                        unshield(index, &mut previous);
                        previous
                    };
                }
                return 0;
            }
        } else {
            default_actions::drop_one(signal);
        }
    }
    let mut action = *act;
    let _changing = Changing::enter();
    let added = shield(signal, &mut action, our_signals());
    let ours = OURS[index].load(Ordering::Acquire);
    let r = real_sigaction(signal, &action, old);
    if r == 0 {
        let replaced_ours = old.as_ref().map_or(ours != 0, |o| o.sa_sigaction == ours && ours != 0);
        if let Some(old) = old.as_mut() {
            unshield(index, old);
            if held {
                *old = default_actions::default_disposition();
            }
        }
        SHIELDED[index].store(added, Ordering::Relaxed);
        if replaced_ours && action.sa_sigaction != ours {
            let hook = TAKEOVER_HOOK.load(Ordering::Acquire);
            if hook != 0 {
                // SAFETY: stored by `on_takeover` from a `fn(c_int)`.
                unsafe { std::mem::transmute::<usize, fn(c_int)>(hook)(signal) };
            }
        }
    }
    r
}

/// Called when the program installs its own disposition over one of cpuprof's handlers.
static TAKEOVER_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Has `hook` called, with the signal, when the program replaces one of cpuprof's handlers
/// through the interposed `sigaction` (the session then stops sampling: see
/// `session::timing::taken_over`). Called in the program's thread, inside its `sigaction`.
pub fn on_takeover(hook: fn(c_int)) {
    TAKEOVER_HOOK.store(hook as usize, Ordering::Release);
}

/// `signal(3)` for the application (libcpuprof.so interposes it: glibc's calls its internal
/// `sigaction`, which the interposed one never sees): BSD semantics, as glibc's, through
/// [`application_sigaction`]. Returns the previous handler, or `SIG_ERR`.
///
/// # Safety
/// As `signal(3)`.
pub unsafe fn application_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let mut action: libc::sigaction = std::mem::zeroed();
    let mut old: libc::sigaction = std::mem::zeroed();
    action.sa_sigaction = handler;
    if libc::sigemptyset(&mut action.sa_mask) != 0 || libc::sigaddset(&mut action.sa_mask, signal) != 0 {
        *libc::__errno_location() = libc::EINVAL;
        return libc::SIG_ERR;
    }
    action.sa_flags = libc::SA_RESTART;
    if application_sigaction(signal, &action, &mut old) != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// Installs `handler` for `signal` unless the application has its own handler there.
/// Once installed, a handler is never reset to `SIG_DFL`: a signal still in flight after
/// profiling stops would otherwise kill the process.
pub fn install(signal: c_int, handler: SigInfoHandler) -> Result<(), SignalError> {
    let index = usize::try_from(signal)
        .ok()
        .filter(|&i| (1..65).contains(&i))
        .ok_or(SignalError::Invalid { signal })?;
    if OURS[index].load(Ordering::Acquire) == handler as usize {
        return Ok(());
    }
    // SAFETY: plain sigaction calls with properly initialised structures.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if real_sigaction(signal, std::ptr::null(), &mut old) != 0 {
            return Err(SignalError::Invalid { signal });
        }
        let current = old.sa_sigaction;
        let ours = OURS[index].load(Ordering::Acquire);
        if current != libc::SIG_DFL && current != libc::SIG_IGN && current != ours {
            return Err(SignalError::InUse { signal });
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        // No SA_ONSTACK: the handler runs on the interrupted stack (on the program's
        // sigaltstack only if the thread is already running there). Threads' altstacks may be
        // smaller than any signal frame (a 2,048-byte MINSIGSTKSZ one cannot hold the kernel's
        // 3.4 KiB frame here, AT_MINSIGSTKSZ), which would kill the thread at its first sample;
        // thread stacks are what the program itself runs on, and the handler needs ~3.5 KiB
        // below the interrupted SP (docs/UNWINDING.md, tests/c/headroom.c).
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        action.sa_mask = handler_mask();
        if real_sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(SignalError::Invalid { signal });
        }
    }
    OURS[index].store(handler as usize, Ordering::Release);
    OWNER_PID.store(own_pid(), Ordering::Release);
    shield_existing_handlers(signal);
    if handler as usize == crate::sampler::handler::on_profiling_signal as SigInfoHandler as usize {
        take_out_of_open_signalfds(signal);
    }
    Ok(())
}

/// Signals the kernel raises for a fault of the running code: never held while our handlers
/// run, so that a fault stays a fault (a blocked one kills the process at once).
const SYNCHRONOUS: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// glibc's internal signals, SIGCANCEL (32: thread cancellation) and SIGSETXID (33: `setuid`
/// and friends in every thread), as bits `s - 1` of the kernel's signal set.
const GLIBC_INTERNAL: u64 = 1 << (32 - 1) | 1 << (33 - 1);

/// The signal mask our handlers run with: every asynchronous signal, glibc's internal ones
/// included. No other handler can then run on top of ours, so nothing can leave our handler
/// half-way: asynchronous cancellation (glibc unwinds the thread from its SIGCANCEL handler,
/// through every frame below it, and a Rust `extern "C"` frame aborts the process when unwound),
/// a program's handler that calls `pthread_exit`, throws or `siglongjmp`s (which would leave
/// `IN_FLIGHT` raised for good). What arrives meanwhile waits the few microseconds until our
/// handler returns. glibc's `sigfillset` and `sigaddset` leave out its internal signals, so their
/// bits are set directly; its `sigaction` passes the mask to the kernel as it is (tested).
fn handler_mask() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is valid; the set is ours to change.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut mask);
        for s in SYNCHRONOUS {
            libc::sigdelset(&mut mask, s);
        }
        // Signals 1..64 are the first 64 bits of glibc's sigset_t, as of the kernel's.
        *(&mut mask as *mut libc::sigset_t as *mut u64) |= GLIBC_INTERNAL;
        mask
    }
}

/// Takes `signal` out of the mask of every signalfd the process has open. Those created from
/// now on are handled by `signalfd` itself (libcpuprof.so interposes it, see
/// `without_profiling_signals`); one created before profiling chose its signal (a program that
/// calls `ProfilerStart` late, `CPUPROFILESIGNAL`) would otherwise hand it to the program. Not
/// for signal context. A signalfd created by another thread in the instant between this scan
/// and its `signalfd` call seeing the handler can still hold the signal.
fn take_out_of_open_signalfds(signal: c_int) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let bit = 1u64 << (signal - 1);
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<c_int>().ok()) else {
            continue;
        };
        if !std::fs::read_link(entry.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[signalfd]") {
            continue;
        }
        // `sigmask:` is the set the program gave, in hex (fs/signalfd.c).
        let mask = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("sigmask:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            });
        let Some(mask) = mask.filter(|m| m & bit != 0) else {
            continue;
        };
        // SAFETY: a zeroed sigset_t with its first 64 bits set; `signalfd` on an existing
        // signalfd only replaces its mask (EINVAL if the number no longer is one).
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            *(&mut set as *mut libc::sigset_t as *mut u64) = mask & !bit;
            libc::signalfd(fd, &set, 0);
        }
    }
}

/// Whether `handler` is the current handler of `signal`.
pub fn is_installed(signal: c_int, handler: SigInfoHandler) -> bool {
    // SAFETY: queries the current disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        real_sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == handler as usize
    }
}

/// Whether `signal` has the default disposition (no handler, not ignored).
pub fn is_unhandled(signal: c_int) -> bool {
    // SAFETY: queries the current disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        real_sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

/// The signal mask a program passes to a wait that takes one (`ppoll`, `pselect`,
/// `epoll_pwait`, `sigsuspend`), with the profiling signals added while their handler is ours:
/// `copy` if any was added, else `mask` itself. A thread that blocks the profiling signal
/// while it runs keeps its timer's signal pending; a wait whose mask unblocks it would take it
/// at once and return `EINTR` (sigsuspend: return) with no signal of the program's. The thread
/// is off the CPU during the wait, so no sample is lost; the signal is taken when the thread
/// unblocks it otherwise.
///
/// # Safety
/// `mask` is null or points to a valid `sigset_t`.
pub unsafe fn keep_profiling_signals_blocked(
    mask: *const libc::sigset_t,
    copy: &mut libc::sigset_t,
) -> *const libc::sigset_t {
    if mask.is_null() {
        return mask;
    }
    let profiling = crate::sampler::handler::on_profiling_signal as SigInfoHandler as usize;
    let mut added = false;
    for (s, ours) in OURS.iter().enumerate().skip(1) {
        if ours.load(Ordering::Acquire) != profiling {
            continue;
        }
        // SAFETY: queries the current disposition; `mask` is valid (the caller's contract) and
        // `copy` ours.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if real_sigaction(s as c_int, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != profiling
                || libc::sigismember(mask, s as c_int) == 1
            {
                continue;
            }
            if !added {
                *copy = *mask;
                added = true;
            }
            libc::sigaddset(copy, s as c_int);
        }
    }
    if added {
        copy
    } else {
        mask
    }
}

/// The set of signals a program waits for with `sigwait`, `sigwaitinfo` or `sigtimedwait`, or
/// reads from a `signalfd`, without the profiling signals while their handler is ours: `copy`
/// if any was removed, else `set` itself. A thread that blocks the profiling signal keeps its
/// timer's signal pending, and a wait for every signal (or a signalfd of every signal, as
/// daemons that block them all make) would hand it to the program as one of its own. Under the
/// process-wide timer the profiling signal is SIGPROF: it is left out too, as cpuprof's.
///
/// # Safety
/// `set` is null or points to a valid `sigset_t`.
pub unsafe fn without_profiling_signals(
    set: *const libc::sigset_t,
    copy: &mut libc::sigset_t,
) -> *const libc::sigset_t {
    if set.is_null() {
        return set;
    }
    let profiling = crate::sampler::handler::on_profiling_signal as SigInfoHandler as usize;
    let mut removed = false;
    for (s, ours) in OURS.iter().enumerate().skip(1) {
        if ours.load(Ordering::Acquire) != profiling {
            continue;
        }
        // SAFETY: queries the current disposition; `set` is valid (the caller's contract) and
        // `copy` ours.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if real_sigaction(s as c_int, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != profiling
                || libc::sigismember(set, s as c_int) != 1
            {
                continue;
            }
            if !removed {
                *copy = *set;
                removed = true;
            }
            libc::sigdelset(copy, s as c_int);
        }
    }
    if removed {
        copy
    } else {
        set
    }
}

/// Blocks `signal` in the calling thread (for cpuprof's own threads, which are not sampled).
pub fn block_in_current_thread(signal: c_int) {
    // SAFETY: plain sigmask manipulation of the calling thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

pub fn signal_name(signal: c_int) -> String {
    match signal {
        libc::SIGPROF => "SIGPROF".into(),
        libc::SIGALRM => "SIGALRM".into(),
        libc::SIGVTALRM => "SIGVTALRM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        s if s >= libc::SIGRTMIN() && s <= libc::SIGRTMAX() => format!("SIGRTMIN+{}", s - libc::SIGRTMIN()),
        s => format!("signal {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn ours(_: c_int, _: *mut libc::siginfo_t, _: *mut c_void) {}
    extern "C" fn theirs(_: c_int) {}

    fn action(flags: c_int) -> libc::sigaction {
        // SAFETY: a zeroed sigaction is a valid value to fill in.
        let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
        a.sa_sigaction = theirs as *const () as usize;
        a.sa_flags = flags;
        a
    }

    /// The real mask of `signal`'s handler, and the one the application reads back.
    fn masks(signal: c_int, probe: c_int) -> (bool, bool) {
        let mut real = action(0);
        let mut seen = action(0);
        // SAFETY: queries of the current disposition into our structs.
        unsafe {
            assert_eq!(real_sigaction(signal, std::ptr::null(), &mut real), 0);
            assert_eq!(application_sigaction(signal, std::ptr::null(), &mut seen), 0);
            (
                libc::sigismember(&real.sa_mask, probe) == 1,
                libc::sigismember(&seen.sa_mask, probe) == 1,
            )
        }
    }

    /// The kernel's `struct sigaction` for x86_64 and aarch64 (both define `SA_RESTORER`).
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }

    #[test]
    fn our_handlers_hold_every_asynchronous_signal_and_glibcs_internal_ones() {
        // Low: sessions in this test binary take real-time signals from the top.
        let signal = libc::SIGRTMIN() + 2;
        install(signal, ours).unwrap();
        let mut kernel = KernelSigaction {
            handler: 0,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        // SAFETY: reads the disposition as the kernel holds it, past glibc: its sigaction must
        // not have dropped the bits of its internal signals on the way in.
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                std::ptr::null::<KernelSigaction>(),
                &mut kernel as *mut KernelSigaction,
                8usize,
            )
        };
        assert_eq!(r, 0);
        assert_eq!(kernel.handler, ours as SigInfoHandler as usize);
        let held = |s: c_int| kernel.mask & (1 << (s - 1)) != 0;
        assert!(held(32), "SIGCANCEL: {:#x}", kernel.mask);
        assert!(held(33), "SIGSETXID: {:#x}", kernel.mask);
        for s in [
            libc::SIGPROF,
            libc::SIGALRM,
            libc::SIGUSR1,
            libc::SIGTERM,
            libc::SIGRTMIN(),
            signal,
        ] {
            assert!(held(s), "signal {s}: {:#x}", kernel.mask);
        }
        for s in SYNCHRONOUS {
            assert!(!held(s), "a fault stays a fault: signal {s}: {:#x}", kernel.mask);
        }
    }

    /// The mask of signalfd `fd` as `/proc/self/fdinfo` shows it.
    fn signalfd_mask(fd: c_int) -> u64 {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        let hex = info.lines().find_map(|l| l.strip_prefix("sigmask:")).unwrap();
        u64::from_str_radix(hex.trim(), 16).unwrap()
    }

    #[test]
    fn signalfds_never_hold_the_profiling_signal() {
        // Low: sessions in this test binary take real-time signals from the top.
        let profiling = libc::SIGRTMIN() + 3;
        // The bit fdinfo shows for signal `s`, asked of the kernel: under qemu-user (the
        // aarch64 tests) the guest's real-time signals are host signals of other numbers.
        let bit = |s: c_int| {
            // SAFETY: a signalfd of one signal, read and closed here.
            unsafe {
                let mut one: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, s);
                let fd = libc::signalfd(-1, &one, libc::SFD_CLOEXEC);
                assert!(fd >= 0);
                let shown = signalfd_mask(fd);
                libc::close(fd);
                shown
            }
        };
        // SAFETY: signalfds of signals nothing in this test binary sends, closed at the end.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, profiling);
            libc::sigaddset(&mut set, libc::SIGTTIN);
            let before = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
            assert!(before >= 0);
            assert_eq!(signalfd_mask(before), bit(profiling) | bit(libc::SIGTTIN));
            install(profiling, crate::sampler::handler::on_profiling_signal).unwrap();
            // Signalfds made before are rewritten from their fdinfo masks, which an emulator
            // that renumbers real-time signals shows in its host's numbers: checked on real
            // kernels only.
            if bit(profiling) == 1 << (profiling - 1) {
                assert_eq!(
                    signalfd_mask(before),
                    bit(libc::SIGTTIN),
                    "a signalfd made before the profiling signal was chosen"
                );
            } else {
                eprintln!("real-time signals are renumbered (qemu-user): existing signalfds not checked");
            }
            // Made later: the mask goes through `without_profiling_signals` (libcpuprof.so's
            // signalfd), for a new signalfd and for a new mask of an existing one.
            let mut copy: libc::sigset_t = std::mem::zeroed();
            let mask = without_profiling_signals(&set, &mut copy);
            let after = libc::signalfd(-1, mask, libc::SFD_CLOEXEC);
            assert_eq!(signalfd_mask(after), bit(libc::SIGTTIN));
            assert_eq!(libc::signalfd(before, mask, 0), before);
            assert_eq!(signalfd_mask(before), bit(libc::SIGTTIN));
            assert_eq!(libc::sigismember(&set, profiling), 1, "the program's set is left alone");
            libc::close(before);
            libc::close(after);
        }
    }

    #[test]
    fn onstack_handlers_of_the_application_hold_our_signal_back_unseen() {
        // SIGURG, SIGWINCH and SIGPWR belong to no other lib test; ours is a real-time signal.
        let (before, after, nodefer, ours_signal) = (libc::SIGURG, libc::SIGWINCH, libc::SIGPWR, libc::SIGRTMAX() - 3);
        // SAFETY: installs handlers for signals nothing in this test binary sends.
        unsafe {
            assert_eq!(
                application_sigaction(before, &action(libc::SA_ONSTACK), std::ptr::null_mut()),
                0
            );
            install(ours_signal, ours).unwrap();
            assert_eq!(masks(before, ours_signal), (true, false), "existing SA_ONSTACK handler");
            assert_eq!(
                application_sigaction(after, &action(libc::SA_ONSTACK), std::ptr::null_mut()),
                0
            );
            assert_eq!(
                masks(after, ours_signal),
                (true, false),
                "SA_ONSTACK handler installed later"
            );
            let flags = libc::SA_ONSTACK | libc::SA_NODEFER;
            assert_eq!(application_sigaction(nodefer, &action(flags), std::ptr::null_mut()), 0);
            assert_eq!(
                masks(nodefer, ours_signal),
                (false, false),
                "SA_NODEFER handlers may longjmp out"
            );
            let mut old = action(0);
            assert_eq!(application_sigaction(after, &action(0), &mut old), 0);
            assert_eq!(
                libc::sigismember(&old.sa_mask, ours_signal),
                0,
                "old action as the program set it"
            );
            assert_eq!(
                masks(after, ours_signal),
                (false, false),
                "a handler without SA_ONSTACK"
            );
            for s in [before, after, nodefer] {
                libc::signal(s, libc::SIG_DFL);
            }
        }
    }
}
