//! The process-wide timer that drives sampling in gperftools' way (`CPUPROFILE_TIMER=itimer`
//! and `CPUPROFILE_REALTIME`): one timer for the whole process, its signal delivered to
//! whichever thread is running.
//!
//! It is a POSIX timer (`timer_create` with `SIGEV_SIGNAL`) rather than `setitimer`, which
//! has the same semantics but survives `execve`: the new program, which has not installed
//! a handler, would then be killed by the next expiry ("Profiling timer expired"). POSIX timers
//! are deleted by `execve`.

use crate::sync::Mutex;
use std::ffi::c_int;
use std::io;

/// Which clock drives the samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// CPU time of the process, `SIGPROF`: the default.
    ProcessCpu,
    /// Wall-clock time, `SIGALRM`: `CPUPROFILE_REALTIME`.
    Real,
}

impl Clock {
    pub fn signal(self) -> c_int {
        match self {
            Clock::ProcessCpu => libc::SIGPROF,
            Clock::Real => libc::SIGALRM,
        }
    }

    fn clock_id(self) -> libc::clockid_t {
        match self {
            Clock::ProcessCpu => libc::CLOCK_PROCESS_CPUTIME_ID,
            Clock::Real => libc::CLOCK_MONOTONIC,
        }
    }
}

struct Armed(libc::timer_t, Clock);
// SAFETY: timer_t is an opaque kernel id, only passed to timer_delete.
unsafe impl Send for Armed {}

static TIMER: Mutex<Option<Armed>> = Mutex::new(None);

/// Arms the process timer to fire every `period_us` microseconds.
pub fn start(clock: Clock, period_us: u64) -> io::Result<()> {
    // SAFETY: timer_create / timer_settime with initialised structures.
    unsafe {
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_SIGNAL;
        event.sigev_signo = clock.signal();
        let mut id: libc::timer_t = std::ptr::null_mut();
        if libc::timer_create(clock.clock_id(), &mut event, &mut id) != 0 {
            return Err(io::Error::last_os_error());
        }
        let period = libc::timespec {
            tv_sec: (period_us / 1_000_000) as libc::time_t,
            tv_nsec: ((period_us % 1_000_000) * 1000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        if libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) != 0 {
            let e = io::Error::last_os_error();
            libc::timer_delete(id);
            return Err(e);
        }
        if let Some(Armed(old, _)) = TIMER.lock().replace(Armed(id, clock)) {
            libc::timer_delete(old);
        }
    }
    Ok(())
}

/// The timer's lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &TIMER
}

/// In a forked child: POSIX timers are not inherited, so the parent's id means nothing here.
pub fn forget_in_child() {
    TIMER.lock().take();
}

/// Deletes the process timer.
pub fn stop() {
    if let Some(Armed(id, _)) = TIMER.lock().take() {
        // SAFETY: our own timer.
        unsafe { libc::timer_delete(id) };
    }
}

/// The process timer, stopped but not deleted for an `exec` (see `session::process_end`),
/// and its setting, to re-arm it if the exec fails.
pub struct PausedTimer(libc::timer_t, libc::itimerspec);

// SAFETY: timer_t is an opaque kernel id.
unsafe impl Send for PausedTimer {}

/// Stops the process timer if it runs; returns its signal and what `resume` needs. Waits at
/// most `limit` for the lock (the caller may be a signal handler).
pub fn pause(limit: std::time::Duration) -> Option<(c_int, PausedTimer)> {
    let timer = TIMER.try_lock_for(limit)?;
    let Armed(id, clock) = timer.as_ref()?;
    // SAFETY: zeroed is a valid itimerspec; `old` is written by timer_settime on our timer.
    unsafe {
        let off: libc::itimerspec = std::mem::zeroed();
        let mut old: libc::itimerspec = std::mem::zeroed();
        (libc::timer_settime(*id, 0, &off, &mut old) == 0).then(|| (clock.signal(), PausedTimer(*id, old)))
    }
}

/// Re-arms the timer `pause` stopped, if it still runs (profiling may have stopped meanwhile,
/// and the id may then be the program's).
pub fn resume(paused: PausedTimer, limit: std::time::Duration) {
    let Some(timer) = TIMER.try_lock_for(limit) else {
        return;
    };
    if matches!(timer.as_ref(), Some(Armed(id, _)) if *id == paused.0) {
        // SAFETY: our own timer, still armed by the session.
        unsafe { libc::timer_settime(paused.0, 0, &paused.1, std::ptr::null_mut()) };
    }
}
