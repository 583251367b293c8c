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

struct Armed(libc::timer_t);
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
        if let Some(Armed(old)) = TIMER.lock().replace(Armed(id)) {
            libc::timer_delete(old);
        }
    }
    Ok(())
}

/// Deletes the process timer.
pub fn stop() {
    if let Some(Armed(id)) = TIMER.lock().take() {
        // SAFETY: our own timer.
        unsafe { libc::timer_delete(id) };
    }
}
