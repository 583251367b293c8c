//! Choosing the timer and the signal that drive sampling, with fallbacks that say why.

use super::options::{Options, TimerChoice};
use crate::error::Error;
use crate::sampler::events::Event;
use crate::sampler::signals;
use crate::sampler::thread_timers::{self, ThreadTimerKind};
use crate::sampler::{on_profiling_signal, timer, Clock, SampleSource};
use std::ffi::c_int;

/// Installs the handler and picks the sample source. Nothing is armed yet.
pub fn choose(options: &Options) -> Result<(SampleSource, c_int), Error> {
    let process_timer = |clock: Clock| {
        signals::install(clock.signal(), on_profiling_signal).map_err(Error::Signal)?;
        Ok((SampleSource::ProcessTimer(clock), clock.signal()))
    };
    if let Some(why) = &options.event_refused {
        return Err(Error::Event(why.clone()));
    }
    crate::sampler::perf_event::count_events(options.event.as_ref());
    if let Some(event) = &options.event {
        return choose_for_event(options, event);
    }
    if options.clock == Clock::Real || options.timer == TimerChoice::Itimer {
        return process_timer(options.clock);
    }
    let period_ns = options.thread_period();
    // POSIX CPU timers unless perf events are asked for by name: they need no descriptors, have
    // no SIGIO fallback, pass the usual seccomp filters and charge kernel time to its caller
    // (docs/DESIGN.md, "Timers").
    let kinds: &[ThreadTimerKind] = match options.timer {
        TimerChoice::Perf => &[ThreadTimerKind::Perf, ThreadTimerKind::Posix],
        _ => &[ThreadTimerKind::Posix],
    };
    // Signals at or above this one were refused by timer_create.
    let mut below = libc::SIGRTMAX() + 1;
    'signals: loop {
        let signal = match options.timer_signal {
            Some(signal) => signals::install(signal, on_profiling_signal)
                .map(|()| signal)
                .map_err(Error::Signal)?,
            None => free_realtime_signal(below)?,
        };
        for &kind in kinds {
            match thread_timers::probe(kind, signal, period_ns) {
                Ok(()) => return Ok((SampleSource::ThreadTimers(kind), signal)),
                // An emulator may not map every real-time signal (qemu-user refuses 64): a
                // signal of our own choosing is traded for the next free one down.
                Err(e)
                    if kind == ThreadTimerKind::Posix
                        && options.timer_signal.is_none()
                        && signal != libc::SIGPROF
                        && e.raw_os_error() == Some(libc::EINVAL) =>
                {
                    crate::say!(
                        "cpuprof: timer_create refuses signal {signal} ({}); trying a lower one",
                        signals::signal_name(signal)
                    );
                    below = signal;
                    continue 'signals;
                }
                Err(e) => crate::say!("cpuprof: {} unavailable ({e}); falling back", describe(kind)),
            }
        }
        break;
    }
    crate::say!("cpuprof: using a process-wide CPU timer (at most one sample per kernel tick)");
    process_timer(Clock::ProcessCpu)
}

/// An event profile: perf events on every thread, with no fallback (a CPU timer would count
/// something else); a start that cannot have them fails with the reason.
fn choose_for_event(options: &Options, event: &Event) -> Result<(SampleSource, c_int), Error> {
    let refuse = |why: String| Err(Error::Event(format!("event {}: {why}", event.name)));
    if options.clock == Clock::Real || options.timer == TimerChoice::Itimer {
        return refuse("an event profile counts events per thread, not time: no CPUPROFILE_REALTIME or itimer".into());
    }
    let signal = match options.timer_signal {
        Some(signal) => signals::install(signal, on_profiling_signal)
            .map(|()| signal)
            .map_err(Error::Signal)?,
        None => free_realtime_signal(libc::SIGRTMAX() + 1)?,
    };
    match thread_timers::probe(ThreadTimerKind::Perf, signal, event.period) {
        Ok(()) => {
            if let Some((base, budget)) = crate::sampler::perf_event::budget_below_fd_setsize() {
                crate::say!(
                    "cpuprof: event {}: the RLIMIT_NOFILE soft limit leaves no descriptor number above FD_SETSIZE; \
                     the events take {budget} numbers below it ({base}-{}), the last the program would be given, \
                     and threads beyond {budget} at once are not sampled (raise the limit with ulimit -n to avoid both)",
                    event.name,
                    base + budget as c_int - 1
                );
            }
            Ok((SampleSource::ThreadTimers(ThreadTimerKind::Perf), signal))
        }
        Err(e) => refuse(explain_event_refusal(event, &e)),
    }
}

/// Why `perf_event_open` refused `event`, in words a user can act on.
fn explain_event_refusal(event: &Event, e: &std::io::Error) -> String {
    let no_counters = matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV));
    if event.is_hardware() && no_counters {
        format!(
            "this machine does not count it (perf_event_open: {e}): it has no hardware performance counters for it, as most \
             virtual machines (perf stat -e {} says <not supported>); software events (page-faults, \
             context-switches, cpu-migrations) still work",
            event.name
        )
    } else if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        format!("perf_event_open is not allowed here ({e}): see /proc/sys/kernel/perf_event_paranoid")
    } else {
        format!("perf_event_open refused it: {e}")
    }
}

/// Arms the chosen source. `excluded`: threads never to sample (cpuprof's own).
pub fn start(source: SampleSource, signal: c_int, options: &Options, excluded: Vec<libc::pid_t>) -> Result<(), Error> {
    match source {
        SampleSource::ProcessTimer(clock) => timer::start(clock, options.period_us()),
        SampleSource::ThreadTimers(kind) => thread_timers::start(kind, signal, options.thread_period(), excluded),
    }
    .map_err(Error::Timer)
}

/// Disarms the source. Returns the perf event fds to close once no handler can use them, and
/// the count of threads that were never sampled.
pub fn stop(source: SampleSource) -> thread_timers::Stopped {
    match source {
        SampleSource::ProcessTimer(_) => {
            timer::stop();
            thread_timers::Stopped {
                perf_fds: Vec::new(),
                unsampled_threads: 0,
                limit_fallbacks: 0,
                lowered_limit: None,
            }
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

/// The highest real-time signal nobody handles (applications tend to use the low ones), for
/// per-thread timers. Not SIGPROF: an application may install its own SIGPROF handler at any
/// time (its own profiler, an itimer) and would then receive our signals; with a real-time
/// signal of our own, its SIGPROF, handler and mask are never affected.
/// Only signals below `below` are taken.
fn free_realtime_signal(below: c_int) -> Result<c_int, Error> {
    for signal in (libc::SIGRTMIN()..below.min(libc::SIGRTMAX() + 1)).rev() {
        // A signal an earlier profile of this process took is ours still (handlers are never
        // reset): taken again rather than passed over, or each new profile would take the
        // next lower one.
        let free = signals::is_unhandled(signal) || signals::is_installed(signal, on_profiling_signal);
        if free && signals::install(signal, on_profiling_signal).is_ok() {
            return Ok(signal);
        }
    }
    signals::install(libc::SIGPROF, on_profiling_signal)
        .map(|()| libc::SIGPROF)
        .map_err(Error::Signal)
}

/// Whether the application has replaced our handler for `signal` since sampling started.
pub fn taken_over(signal: c_int) -> bool {
    !signals::is_installed(signal, on_profiling_signal)
}

/// Stops sampling because the application took the signal over: our handler no longer runs,
/// so the timers are disarmed now (perf fds closed once no handler of ours is in flight).
pub fn stop_after_takeover(source: SampleSource, signal: c_int) {
    crate::say!(
        "cpuprof: the application installed its own handler for signal {signal} ({}); profiling stops here, and \
         the profile keeps the samples taken so far. To profile this program, give cpuprof a signal it leaves \
         alone (CPUPROFILE_TIMER_SIGNAL=N), or use the program's own profiler (Go: runtime/pprof)",
        signals::signal_name(signal)
    );
    let stopped = stop(source);
    if crate::sampler::wait_for_handlers() {
        thread_timers::close(stopped.perf_fds);
    }
}
