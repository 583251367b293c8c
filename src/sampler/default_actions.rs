//! Ends by a signal's default action, with the profile completed first.
//!
//! Most programs never handle `SIGTERM`: systemd, Kubernetes, `timeout`, Chromium's browser
//! (for its renderers) and Python's `multiprocessing` stop them with it, and its default
//! action ends the process with no `atexit`, no `_exit`, nothing cpuprof could see. The same
//! for `SIGINT`, `SIGHUP`, `SIGPIPE`, ... and for crashes (`SIGSEGV`, `SIGABRT`, ...). So while a
//! profile runs, every ending signal the program leaves at `SIG_DFL` gets a handler of
//! cpuprof's that completes the profile ([`hold`]'s `before_end`, bounded in time), puts the
//! default action back and lets the signal take it: the exit status, the core dump and the
//! parent's `wait` status are what they would have been.
//!
//! The program never sees the difference: `sigaction` (and `signal`, interposed by
//! libcpuprof.so, see [`super::signals::application_sigaction`]) reports `SIG_DFL` for a held
//! signal, a handler (or `SIG_IGN`) the program installs replaces cpuprof's, and setting
//! `SIG_DFL` again holds it again. `exec` resets handled signals to their default action, as it
//! would have; a forked child inherits the handler and completes its own profile, if it has one.
//!
//! After the completion the handler re-raises the signal at its own thread (blocked until the
//! handler returns, so the default action happens at the interrupted instruction), except for a
//! fault the kernel raised (`SIGSEGV`, `SIGBUS`, `SIGFPE`, `SIGILL` with a positive `si_code`):
//! returning re-executes the faulting instruction, which raises it again with its own siginfo.

use super::signals::{real_sigaction, SigInfoHandler};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The signals whose default action ends the process (terminate or dump core) and that
/// programs commonly leave at their default. Real-time signals are left alone (runtimes use
/// them, and one is the profiling signal).
pub const ENDING_SIGNALS: [c_int; 18] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGUSR1,
    libc::SIGSEGV,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGVTALRM,
    libc::SIGSYS,
];

/// Signals (bit `s - 1`) whose default action cpuprof holds.
static HELD: AtomicU64 = AtomicU64::new(0);

/// The profiles that complete their file before the process ends by a signal: each holds
/// the ending signals while it runs, and they stay held while either does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completer {
    /// The CPU profile (`session`).
    Cpu = 0,
    /// The contention profile written to a file (libcpuprof.so's `CPUPROFILE_CONTENTION`).
    Contention = 1,
}

/// What completes each profile before the process ends (a `fn()`), by [`Completer`]; 0 while
/// that profile does not run. Run in this order: the CPU profile first.
static BEFORE_END: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Whether any profile holds the ending signals.
fn is_holding() -> bool {
    BEFORE_END.iter().any(|f| f.load(Ordering::SeqCst) != 0)
}
/// 0, then 1 while a handler completes the profile, 2 once it has: a second ending signal on
/// another thread waits for the first completion (bounded) before it ends the process.
static COMPLETION: AtomicU32 = AtomicU32::new(0);
/// How long a second ending signal waits for the completion under way.
const COMPLETION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

fn bit(signal: c_int) -> u64 {
    1 << (signal - 1)
}

/// Whether `signal` is one whose default action cpuprof can hold.
pub fn covers(signal: c_int) -> bool {
    ENDING_SIGNALS.contains(&signal)
}

/// Holds the default action of every ending signal the program leaves at `SIG_DFL`, except
/// `skip` (signals cpuprof samples with): `before_end` runs before the process ends by one,
/// for as long as `who` runs. Not for signal context.
pub fn hold(who: Completer, before_end: fn(), skip: &[c_int]) {
    COMPLETION.store(0, Ordering::SeqCst);
    BEFORE_END[who as usize].store(before_end as usize, Ordering::SeqCst);
    for signal in ENDING_SIGNALS {
        if !skip.contains(&signal) && super::signals::is_unhandled(signal) {
            hold_one(signal);
        }
    }
}

/// `who` stopped: nothing of its runs before the process ends, and once no profile holds
/// them, every held signal takes its default action directly again. Not for signal context.
pub fn release(who: Completer) {
    BEFORE_END[who as usize].store(0, Ordering::SeqCst);
    if is_holding() {
        return;
    }
    for signal in ENDING_SIGNALS {
        if HELD.fetch_and(!bit(signal), Ordering::SeqCst) & bit(signal) != 0 && is_ours(signal) {
            set_default(signal);
        }
    }
}

/// In a forked child: the handlers stay (the child completes its own CPU profile, if it
/// starts one; until then, a held signal acts as it would have), and a contention profile,
/// which goes on in the child with a file of its own, keeps its completion.
pub fn forget_in_child() {
    BEFORE_END[Completer::Cpu as usize].store(0, Ordering::SeqCst);
}

/// Starts holding `signal`'s default action if a profile runs; the caller has checked that
/// the program has it at `SIG_DFL`, or is asking for it. Returns whether it is held.
/// Async-signal-safe.
pub fn hold_one(signal: c_int) -> bool {
    if !is_holding() || !covers(signal) {
        return false;
    }
    // SAFETY: plain sigaction calls with initialised structures.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_ending_signal as SigInfoHandler as usize;
        action.sa_flags = libc::SA_SIGINFO;
        // Nothing interrupts the completion.
        libc::sigfillset(&mut action.sa_mask);
        if real_sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return false;
        }
    }
    HELD.fetch_or(bit(signal), Ordering::SeqCst);
    true
}

/// The program installs its own disposition for `signal`: cpuprof no longer holds it.
/// Async-signal-safe.
pub fn drop_one(signal: c_int) {
    if (1..65).contains(&signal) {
        HELD.fetch_and(!bit(signal), Ordering::SeqCst);
    }
}

/// Whether cpuprof holds `signal`'s default action now (its handler is installed).
/// Async-signal-safe.
pub fn is_held(signal: c_int) -> bool {
    (1..65).contains(&signal) && HELD.load(Ordering::SeqCst) & bit(signal) != 0 && is_ours(signal)
}

fn is_ours(signal: c_int) -> bool {
    // SAFETY: queries the current disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        real_sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == on_ending_signal as SigInfoHandler as usize
    }
}

fn set_default(signal: c_int) {
    // SAFETY: a zeroed sigaction is SIG_DFL with no flags and an empty mask.
    unsafe {
        let action: libc::sigaction = std::mem::zeroed();
        real_sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// The disposition a program reads back for a held signal: `SIG_DFL`, no flags, empty mask.
pub fn default_disposition() -> libc::sigaction {
    // SAFETY: a zeroed sigaction is exactly that.
    unsafe { std::mem::zeroed() }
}

unsafe extern "C" fn on_ending_signal(signal: c_int, info: *mut libc::siginfo_t, _uc: *mut c_void) {
    // SAFETY: errno is this thread's; restored for a fault that returns to its instruction.
    let errno = unsafe { *libc::__errno_location() };
    HELD.fetch_and(!bit(signal), Ordering::SeqCst);
    set_default(signal);
    if is_holding() {
        if COMPLETION
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            for before_end in &BEFORE_END {
                let before_end = before_end.load(Ordering::SeqCst);
                if before_end != 0 {
                    // SAFETY: stored by `hold` from a `fn()`.
                    let before_end = unsafe { std::mem::transmute::<usize, fn()>(before_end) };
                    before_end();
                }
            }
            COMPLETION.store(2, Ordering::SeqCst);
            crate::in_program::futex::wake_all(&COMPLETION);
        } else {
            let deadline = crate::in_program::futex::monotonic_now() + COMPLETION_WAIT;
            while COMPLETION.load(Ordering::SeqCst) == 1 {
                let now = crate::in_program::futex::monotonic_now();
                if now >= deadline {
                    break;
                }
                crate::in_program::futex::wait(&COMPLETION, 1, deadline - now);
            }
        }
    }
    // SAFETY: `info` is the kernel's siginfo for this signal.
    let code = unsafe { info.as_ref() }.map_or(0, |i| i.si_code);
    let refaults = code > 0 && matches!(signal, libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL);
    if !refaults {
        // Blocked until this handler returns (its mask holds every signal): the default action
        // then happens at the interrupted instruction.
        // SAFETY: tgkill of the calling thread with a valid signal.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), signal) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}
