//! Choosing the timer and the signal that drive sampling, with fallbacks that say why.

use super::options::{Options, TimerChoice};
use crate::error::Error;
use crate::sampler::signals::{self, signal_name, SignalError};
use crate::sampler::thread_timers::{self, ThreadTimerKind};
use crate::sampler::{on_profiling_signal, timer, Clock, SampleSource};
use std::ffi::c_int;

/// Installs the handler and picks the sample source. Nothing is armed yet.
pub fn choose(options: &Options) -> Result<(SampleSource, c_int), Error> {
    let process_timer = |clock: Clock| {
        signals::install(clock.signal(), on_profiling_signal).map_err(Error::Signal)?;
        Ok((SampleSource::ProcessTimer(clock), clock.signal()))
    };
    if options.clock == Clock::Real || options.timer == TimerChoice::Itimer {
        return process_timer(options.clock);
    }
    let signal = match options.timer_signal {
        Some(signal) => signals::install(signal, on_profiling_signal)
            .map(|()| signal)
            .map_err(Error::Signal)?,
        None => sigprof_or_free_realtime_signal()?,
    };
    let period_ns = 1_000_000_000 / u64::from(options.frequency.max(1));
    let kinds: &[ThreadTimerKind] = match options.timer {
        TimerChoice::Thread => &[ThreadTimerKind::Posix],
        _ => &[ThreadTimerKind::Perf, ThreadTimerKind::Posix],
    };
    for &kind in kinds {
        match thread_timers::probe(kind, signal, period_ns) {
            Ok(()) => return Ok((SampleSource::ThreadTimers(kind), signal)),
            Err(e) => eprintln!("cpuprof: {} unavailable ({e}); falling back", describe(kind)),
        }
    }
    eprintln!("cpuprof: using a process-wide CPU timer (at most one sample per kernel tick)");
    process_timer(Clock::ProcessCpu)
}

/// Arms the chosen source. `excluded`: threads never to sample (cpuprof's own).
pub fn start(source: SampleSource, signal: c_int, options: &Options, excluded: Vec<libc::pid_t>) -> Result<(), Error> {
    match source {
        SampleSource::ProcessTimer(clock) => timer::start(clock, options.period_us()),
        SampleSource::ThreadTimers(kind) => {
            let period_ns = 1_000_000_000 / u64::from(options.frequency.max(1));
            thread_timers::start(kind, signal, period_ns, excluded)
        }
    }
    .map_err(Error::Timer)
}

/// Disarms the source. Returns perf event fds to close once no handler can use them.
pub fn stop(source: SampleSource) -> Vec<c_int> {
    match source {
        SampleSource::ProcessTimer(_) => {
            timer::stop();
            Vec::new()
        }
        SampleSource::ThreadTimers(_) => thread_timers::stop(),
    }
}

fn describe(kind: ThreadTimerKind) -> &'static str {
    match kind {
        ThreadTimerKind::Perf => "perf_event cpu-clock timers",
        ThreadTimerKind::Posix => "per-thread POSIX CPU timers",
    }
}

/// SIGPROF, or, when the application has its own SIGPROF handler, the highest real-time
/// signal nobody handles (applications tend to use the low ones). The application's handler
/// is never touched.
fn sigprof_or_free_realtime_signal() -> Result<c_int, Error> {
    match signals::install(libc::SIGPROF, on_profiling_signal) {
        Ok(()) => return Ok(libc::SIGPROF),
        Err(SignalError::InUse { .. }) => {}
        Err(e) => return Err(Error::Signal(e)),
    }
    for signal in (libc::SIGRTMIN()..=libc::SIGRTMAX()).rev() {
        if signals::is_unhandled(signal) && signals::install(signal, on_profiling_signal).is_ok() {
            eprintln!(
                "cpuprof: SIGPROF belongs to the application; sampling with {}",
                signal_name(signal)
            );
            return Ok(signal);
        }
    }
    Err(Error::Signal(SignalError::InUse { signal: libc::SIGPROF }))
}
