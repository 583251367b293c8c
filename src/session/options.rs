//! Profiling options, and how the gperftools environment variables map onto them.

use crate::sampler::events::Event;
use crate::sampler::{Clock, ThreadFilter, UnwinderChoice};
use crate::table::TableConfig;
use crate::writer::epochs::EpochOptions;
use std::ffi::c_int;

/// Default sampling frequency, as in gperftools.
pub const DEFAULT_FREQUENCY: u32 = 100;
/// Highest frequency accepted; the same clamp as gperftools. (The process-wide timers used
/// here deliver at most one signal per kernel tick, 250 Hz on these machines.)
pub const MAX_FREQUENCY: u32 = 4000;
/// Highest wall-clock rate: each tick wakes the wall sampler thread (`wall`).
pub const MAX_WALL_FREQUENCY: u32 = 1000;
/// Longest call chain recorded by default, as in gperftools.
pub const DEFAULT_MAX_DEPTH: usize = 254;
/// Upper bound on the configurable depth.
pub const MAX_DEPTH_LIMIT: usize = 4096;

/// Which timer drives sampling (`CPUPROFILE_TIMER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerChoice {
    /// The safe default: a POSIX CPU timer per thread (no descriptors, kernel time charged to
    /// its caller), else `Itimer`.
    Auto,
    /// One process-wide CPU timer, as gperftools' `setitimer` (at most one signal per tick).
    Itimer,
    /// A POSIX CPU-time timer per thread, with overrun weighting.
    Thread,
    /// A perf `cpu-clock` event per thread (hrtimer-driven: full rate above the kernel tick),
    /// within a bounded descriptor budget; threads beyond it get POSIX CPU timers.
    Perf,
}

/// How a profile is taken.
#[derive(Clone, Debug)]
pub struct Options {
    pub frequency: u32,
    pub clock: Clock,
    pub timer: TimerChoice,
    /// Signal for per-thread timers; `None`: the highest real-time signal nobody handles.
    pub timer_signal: Option<c_int>,
    pub table: TableConfig,
    pub filter: Option<ThreadFilter>,
    pub unwinder: UnwinderChoice,
    /// Print the `PROFILE: ...` summary line on stderr at stop.
    pub report_on_stderr: bool,
    /// Epoch mode: the profile's path is a database directory (`writer::epochs`).
    pub epochs: Option<EpochOptions>,
    /// Wall-clock mode (`wall`): `frequency` is then samples per second of wall time
    /// of every thread, blocked ones included.
    pub wall: bool,
    /// A wall-clock profile taken beside this CPU profile, in the same run.
    pub wall_beside: Option<WallBeside>,
    /// Label every CPU sample with its thread (`CPUPROFILE_THREADS`), as wall-clock samples
    /// always are: the file then names the thread of each record, readers can split a profile
    /// by thread, and the call-chain table holds a chain once per thread that ran it.
    pub thread_labels: bool,
    /// Keep the profile in memory, at most this many bytes, instead of writing a file.
    pub in_memory: Option<usize>,
    /// Children forked from the process get profiles of their own, `<path>_<pid>`
    /// (`session::children`; `CPUPROFILE_FOLLOW_FORK=0` turns it off).
    pub follow_forks: bool,
    /// How often the file is made a complete profile of everything sampled so far
    /// (`CPUPROFILE_CHECKPOINT`, seconds; `None`: only when it ends). See `writer`.
    pub checkpoint: Option<std::time::Duration>,
    /// An event profile (`CPUPROFILE_EVENT`, `/pprof/pmuprofile`): samples every `period`
    /// occurrences of a hardware or software event instead of CPU time, by a perf event per
    /// thread.
    pub event: Option<Event>,
    /// Why the event asked for in the environment cannot be profiled (an unknown name, a bad
    /// period): the start then fails with it rather than profile CPU time instead.
    pub event_refused: Option<String>,
}

/// The default interval between checkpoints: what a process killed by SIGKILL loses at most.
pub const DEFAULT_CHECKPOINT: std::time::Duration = std::time::Duration::from_secs(2);

/// The default bound of a profile kept in memory: far above what the call-chain table's
/// evictions write in hours at the default rate, and still small beside a server's memory.
pub const DEFAULT_MEMORY_LIMIT: usize = 256 << 20;

/// Where a wall-clock profile taken beside a CPU profile goes, and its rate (samples per
/// second of wall time of every thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WallBeside {
    pub path: std::path::PathBuf,
    pub frequency: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            frequency: DEFAULT_FREQUENCY,
            clock: Clock::ProcessCpu,
            timer: TimerChoice::Auto,
            timer_signal: None,
            table: TableConfig {
                max_depth: DEFAULT_MAX_DEPTH,
                ..TableConfig::default()
            },
            filter: None,
            unwinder: UnwinderChoice::Auto,
            report_on_stderr: true,
            epochs: None,
            wall: false,
            wall_beside: None,
            thread_labels: false,
            in_memory: None,
            follow_forks: true,
            checkpoint: Some(DEFAULT_CHECKPOINT),
            event: None,
            event_refused: None,
        }
    }
}

impl Options {
    /// Options from `CPUPROFILE_FREQUENCY`, `CPUPROFILE_REALTIME` and `CPUPROFILE_UNWINDER`,
    /// read through `var`. Unknown unwinder names are reported and give the default.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Options {
        let mut o = Options::default();
        if let Some(hz) = var("CPUPROFILE_FREQUENCY") {
            o.frequency = parse_frequency(&hz);
        }
        if var("CPUPROFILE_REALTIME").is_some() {
            o.clock = Clock::Real;
        }
        if var("CPUPROFILE_PER_THREAD_TIMERS").is_some() {
            o.timer = TimerChoice::Thread;
        }
        if let Some(follow) = var("CPUPROFILE_FOLLOW_FORK") {
            o.follow_forks = !matches!(
                follow.trim().to_ascii_lowercase().as_str(),
                "0" | "no" | "off" | "false"
            );
        }
        if let Some(seconds) = var("CPUPROFILE_CHECKPOINT") {
            match parse_checkpoint(&seconds) {
                Some(every) => o.checkpoint = every,
                None => crate::say!(
                    "cpuprof: CPUPROFILE_CHECKPOINT={seconds:?} is not a number of seconds (0 or off: none); using {}",
                    DEFAULT_CHECKPOINT.as_secs()
                ),
            }
        }
        if let Some(sig) = var("CPUPROFILE_TIMER_SIGNAL") {
            match sig.trim().parse::<c_int>() {
                Ok(n) if (1..=64).contains(&n) => {
                    o.timer_signal = Some(n);
                    o.timer = TimerChoice::Thread;
                }
                _ => crate::say!("cpuprof: CPUPROFILE_TIMER_SIGNAL={sig:?} is not a signal number; ignored"),
            }
        }
        if var("CPUPROFILE_THREADS").is_some_and(|v| !matches!(v.trim(), "" | "0")) {
            o.thread_labels = true;
        }
        if let Some(name) = var("CPUPROFILE_TIMER") {
            match parse_timer(&name) {
                Some(t) => o.timer = t,
                None => crate::say!("cpuprof: CPUPROFILE_TIMER={name:?} is not auto, itimer, thread or perf; ignored"),
            }
        }
        if let Some(n) = var("CPUPROFILE_TABLE_ENTRIES") {
            match n.trim().parse::<usize>() {
                Ok(n) if (MIN_TABLE_ENTRIES..=MAX_TABLE_ENTRIES).contains(&n) => o.table = o.table.with_entries(n),
                _ => crate::say!(
                    "cpuprof: CPUPROFILE_TABLE_ENTRIES={n:?} is not a number from {MIN_TABLE_ENTRIES} to \
                     {MAX_TABLE_ENTRIES}; using {}",
                    o.table.buckets * o.table.ways
                ),
            }
        }
        if let Some(name) = var("CPUPROFILE_EVENT").filter(|n| !n.trim().is_empty()) {
            match crate::sampler::events::parse(&name, var("CPUPROFILE_EVENT_PERIOD").as_deref()) {
                Ok(event) => o.event = Some(event),
                Err(why) => o.event_refused = Some(format!("CPUPROFILE_EVENT={name}: {why}")),
            }
        }
        if let Some(name) = var("CPUPROFILE_UNWINDER") {
            match parse_unwinder(&name) {
                Some(u) => o.unwinder = u,
                None => crate::say!("cpuprof: CPUPROFILE_UNWINDER={name:?} is not auto, fp or dwarf; using auto"),
            }
        }
        o
    }

    /// The period a profile's header records: microseconds per sample, or in an event
    /// profile events per sample (`format::event`).
    pub fn period_us(&self) -> u64 {
        match &self.event {
            Some(event) => event.period,
            None => crate::format::period_us_for_frequency(self.frequency),
        }
    }

    /// The period of per-thread timers: nanoseconds of CPU time per sample, or in an event
    /// profile events per sample.
    pub fn thread_period(&self) -> u64 {
        match &self.event {
            Some(event) => event.period,
            None => 1_000_000_000 / u64::from(self.frequency.max(1)),
        }
    }
}

/// gperftools' rule: a positive integer, clamped to [`MAX_FREQUENCY`]; anything else is the
/// default.
pub fn parse_frequency(text: &str) -> u32 {
    match text.trim().parse::<u64>() {
        Ok(hz) if hz > 0 => hz.min(MAX_FREQUENCY as u64) as u32,
        _ => DEFAULT_FREQUENCY,
    }
}

/// `CPUPROFILE_CHECKPOINT`: seconds between checkpoints (fractions allowed, at least 0.1 s),
/// or `0`/`off` for none. `None` if it is neither.
pub fn parse_checkpoint(text: &str) -> Option<Option<std::time::Duration>> {
    match text.trim().to_ascii_lowercase().as_str() {
        "0" | "off" | "no" | "false" => Some(None),
        t => match t.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Some(Some(std::time::Duration::from_secs_f64(s.clamp(0.1, 86_400.0)))),
            _ => None,
        },
    }
}

pub fn parse_timer(name: &str) -> Option<TimerChoice> {
    match name.trim().to_ascii_lowercase().as_str() {
        "auto" | "" => Some(TimerChoice::Auto),
        "itimer" => Some(TimerChoice::Itimer),
        "thread" => Some(TimerChoice::Thread),
        "perf" => Some(TimerChoice::Perf),
        _ => None,
    }
}

/// `auto` and `dwarf` both walk DWARF CFI, following frame pointers only through code that
/// has no CFI (stopping there would just lose the frames); `fp` walks frame pointers only.
pub fn parse_unwinder(name: &str) -> Option<UnwinderChoice> {
    match name.trim().to_ascii_lowercase().as_str() {
        "auto" | "dwarf" | "" => Some(UnwinderChoice::Auto),
        "fp" => Some(UnwinderChoice::FramePointer),
        _ => None,
    }
}

/// Bounds of the call-chain table's size, in entries (`CPUPROFILE_TABLE_ENTRIES`).
pub const MIN_TABLE_ENTRIES: usize = 64;
pub const MAX_TABLE_ENTRIES: usize = 1 << 20;

/// Clamps a requested depth to what the table supports.
pub fn clamp_depth(depth: usize) -> usize {
    depth.clamp(1, MAX_DEPTH_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn checkpoints_are_seconds_or_off() {
        use std::time::Duration;
        assert_eq!(Options::default().checkpoint, Some(DEFAULT_CHECKPOINT));
        assert_eq!(parse_checkpoint("5"), Some(Some(Duration::from_secs(5))));
        assert_eq!(parse_checkpoint("0.5"), Some(Some(Duration::from_millis(500))));
        assert_eq!(parse_checkpoint("0.001"), Some(Some(Duration::from_millis(100))));
        assert_eq!(parse_checkpoint("off"), Some(None));
        assert_eq!(parse_checkpoint("0"), Some(None));
        assert_eq!(parse_checkpoint("soon"), None);
        let o = Options::from_env(env(&[("CPUPROFILE_CHECKPOINT", "off")]));
        assert_eq!(o.checkpoint, None);
    }

    #[test]
    fn frequency_follows_gperftools_rules() {
        assert_eq!(parse_frequency("250"), 250);
        assert_eq!(parse_frequency("100000"), MAX_FREQUENCY);
        for bad in ["", "0", "-5", "fast", "1e3"] {
            assert_eq!(parse_frequency(bad), DEFAULT_FREQUENCY, "{bad:?}");
        }
        let o = Options::from_env(env(&[("CPUPROFILE_FREQUENCY", "1000")]));
        assert_eq!((o.frequency, o.period_us(), o.clock), (1000, 1000, Clock::ProcessCpu));
    }

    #[test]
    fn timer_variables() {
        assert_eq!(Options::default().timer, TimerChoice::Auto);
        assert_eq!(
            Options::from_env(env(&[("CPUPROFILE_PER_THREAD_TIMERS", "")])).timer,
            TimerChoice::Thread
        );
        let o = Options::from_env(env(&[("CPUPROFILE_TIMER_SIGNAL", "40")]));
        assert_eq!((o.timer, o.timer_signal), (TimerChoice::Thread, Some(40)));
        let o = Options::from_env(env(&[("CPUPROFILE_TIMER", "perf"), ("CPUPROFILE_TIMER_SIGNAL", "40")]));
        assert_eq!((o.timer, o.timer_signal), (TimerChoice::Perf, Some(40)));
        assert_eq!(parse_timer("ITIMER"), Some(TimerChoice::Itimer));
        assert_eq!(parse_timer("hpet"), None);
    }

    #[test]
    fn unwinder_names() {
        assert_eq!(Options::default().unwinder, UnwinderChoice::Auto);
        let o = Options::from_env(env(&[("CPUPROFILE_UNWINDER", "fp")]));
        assert_eq!(o.unwinder, UnwinderChoice::FramePointer);
        assert_eq!(parse_unwinder("DWARF"), Some(UnwinderChoice::Auto));
        assert_eq!(parse_unwinder("libunwind"), None);
    }

    #[test]
    fn table_size_is_configurable_and_defaults_to_gperftools_ten_mib() {
        let default = Options::default().table;
        assert_eq!(default.buckets * default.ways, 4096);
        let mib = default.memory_bytes() as f64 / (1 << 20) as f64;
        assert!((9.5..=10.5).contains(&mib), "{mib} MiB");
        let small = Options::from_env(env(&[("CPUPROFILE_TABLE_ENTRIES", "1000")])).table;
        assert_eq!((small.buckets * small.ways, small.ring_slots), (1024, 1024 * 64));
        assert_eq!(small.max_depth, DEFAULT_MAX_DEPTH);
        for bad in ["0", "lots", "99999999"] {
            let o = Options::from_env(env(&[("CPUPROFILE_TABLE_ENTRIES", bad)]));
            assert_eq!(o.table.buckets, default.buckets, "{bad:?}");
        }
    }

    #[test]
    fn realtime_with_any_value_uses_the_wall_clock() {
        assert_eq!(
            Options::from_env(env(&[("CPUPROFILE_REALTIME", "")])).clock,
            Clock::Real
        );
        assert_eq!(Options::from_env(env(&[])).period_us(), 10000);
    }
}
