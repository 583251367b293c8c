//! Process-wide interval timers that drive sampling.

use std::ffi::c_int;
use std::io;

/// Which clock drives the samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// CPU time of the process (`ITIMER_PROF`, `SIGPROF`): the default.
    ProcessCpu,
    /// Wall-clock time (`ITIMER_REAL`, `SIGALRM`): `CPUPROFILE_REALTIME`.
    Real,
}

impl Clock {
    pub fn signal(self) -> c_int {
        match self {
            Clock::ProcessCpu => libc::SIGPROF,
            Clock::Real => libc::SIGALRM,
        }
    }

    fn which(self) -> libc::c_int {
        match self {
            Clock::ProcessCpu => libc::ITIMER_PROF,
            Clock::Real => libc::ITIMER_REAL,
        }
    }
}

/// Arms the timer to fire every `period_us` microseconds (0 disarms it).
pub fn set_interval(clock: Clock, period_us: u64) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: (period_us / 1_000_000) as libc::time_t,
        tv_usec: (period_us % 1_000_000) as libc::suseconds_t,
    };
    let value = libc::itimerval {
        it_interval: tv,
        it_value: tv,
    };
    // SAFETY: setitimer with a valid itimerval.
    if unsafe { libc::setitimer(clock.which(), &value, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
