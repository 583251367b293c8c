//! Installing signal handlers without taking a signal away from the application.

use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The handler function type for `SA_SIGINFO` handlers.
pub type SigInfoHandler = unsafe extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// Why a handler could not be installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalError {
    /// The application already handles this signal; cpuprof leaves it alone.
    InUse {
        signal: c_int,
    },
    Invalid {
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
        if libc::sigaction(signal, std::ptr::null(), &mut old) != 0 {
            return Err(SignalError::Invalid { signal });
        }
        let current = old.sa_sigaction;
        let ours = OURS[index].load(Ordering::Acquire);
        if current != libc::SIG_DFL && current != libc::SIG_IGN && current != ours {
            return Err(SignalError::InUse { signal });
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
            return Err(SignalError::Invalid { signal });
        }
    }
    OURS[index].store(handler as usize, Ordering::Release);
    Ok(())
}

/// Whether `handler` is the current handler of `signal`.
pub fn is_installed(signal: c_int, handler: SigInfoHandler) -> bool {
    // SAFETY: queries the current disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == handler as usize
    }
}

/// Whether `signal` has the default disposition (no handler, not ignored).
pub fn is_unhandled(signal: c_int) -> bool {
    // SAFETY: queries the current disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
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
