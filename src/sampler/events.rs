//! The events a profile can count instead of CPU time (`CPUPROFILE_EVENT=NAME`,
//! `/pprof/pmuprofile?event=NAME`): perf's hardware and software events by the names `perf
//! list` gives them, and raw hardware codes (`rNNNN`, hexadecimal, as `perf record -e`).
//!
//! A sample is taken every `period` events of a thread, by the per-thread perf events of
//! `super::perf_event`, each signal weighed by the events counted since the last one (the
//! remainder carried), so a profile's total is the thread's count to within a period.
//!
//! Events count in user mode only (`exclude_kernel`), the way the CPU-time perf timer does: an
//! overflow in the kernel could queue a signal that an `execve` under way would carry into the
//! new program. Events that happen only inside the kernel (context switches, migrations) are
//! refused: counted there, their overflow signal is sent to a thread going to sleep and wakes
//! it, so its `nanosleep`, `poll` or `epoll_wait` returns `EINTR` (1,329 of 2,000 sleeps with a
//! sample per switch, measured). Wall-clock profiles (`CPUPROFILE_WALL`) show where threads
//! wait without signalling them.
//!
//! This module is pure code: the parsing and the table.

/// perf's event types (`perf_event_attr.type`).
const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_RAW: u32 = 4;

/// An event to count, as `perf_event_open` takes it, and the sampling period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The name as asked for, lower-cased (`cycles`, `page-faults`, `r01c2`).
    pub name: String,
    /// `perf_event_attr.type` and `.config`.
    pub kind: u32,
    pub config: u64,
    /// Events per sample.
    pub period: u64,
}

impl Event {
    /// Whether the machine's counters are needed (on most virtual machines there are none).
    pub fn is_hardware(&self) -> bool {
        self.kind != PERF_TYPE_SOFTWARE
    }
}

/// Software events that happen only inside the kernel (see the module's documentation).
const KERNEL_ONLY: &[&str] = &["context-switches", "cs", "cpu-migrations", "migrations"];

/// `(names, type, config, default period)`, as `perf list` spells them. The default periods
/// give a few hundred to a few thousand samples per second of a busy thread (hardware) or one
/// sample per a hundred events for the frequent software events, a handful for the rare ones.
const NAMED: &[(&[&str], u32, u64, u64)] = &[
    (&["cycles", "cpu-cycles"], PERF_TYPE_HARDWARE, 0, 1_000_000),
    (&["instructions"], PERF_TYPE_HARDWARE, 1, 1_000_000),
    (&["cache-references"], PERF_TYPE_HARDWARE, 2, 100_000),
    (&["cache-misses"], PERF_TYPE_HARDWARE, 3, 10_000),
    (&["branches", "branch-instructions"], PERF_TYPE_HARDWARE, 4, 100_000),
    (&["branch-misses"], PERF_TYPE_HARDWARE, 5, 10_000),
    (&["bus-cycles"], PERF_TYPE_HARDWARE, 6, 100_000),
    (
        &["stalled-cycles-frontend", "idle-cycles-frontend"],
        PERF_TYPE_HARDWARE,
        7,
        1_000_000,
    ),
    (
        &["stalled-cycles-backend", "idle-cycles-backend"],
        PERF_TYPE_HARDWARE,
        8,
        1_000_000,
    ),
    (&["ref-cycles"], PERF_TYPE_HARDWARE, 9, 1_000_000),
    (&["cpu-clock"], PERF_TYPE_SOFTWARE, 0, 10_000_000),
    (&["task-clock"], PERF_TYPE_SOFTWARE, 1, 10_000_000),
    (&["page-faults", "faults"], PERF_TYPE_SOFTWARE, 2, 100),
    (&["minor-faults"], PERF_TYPE_SOFTWARE, 5, 100),
    (&["major-faults"], PERF_TYPE_SOFTWARE, 6, 1),
    (&["alignment-faults"], PERF_TYPE_SOFTWARE, 7, 1),
    (&["emulation-faults"], PERF_TYPE_SOFTWARE, 8, 1),
];

/// Period of a raw event when none is given.
const RAW_DEFAULT_PERIOD: u64 = 1_000_000;

/// The names [`parse`] accepts, for messages.
pub fn known_names() -> String {
    let mut names: Vec<&str> = NAMED.iter().map(|(names, ..)| names[0]).collect();
    names.push("rNNNN");
    names.join(", ")
}

/// The event named `name` (a `perf list` name, or `rNNNN` for a raw code in hexadecimal),
/// sampled every `period` events (`None`: the event's default).
pub fn parse(name: &str, period: Option<&str>) -> Result<Event, String> {
    let lower = name.trim().to_ascii_lowercase();
    if KERNEL_ONLY.contains(&lower.as_str()) {
        return Err(format!(
            "{name:?} happens only inside the kernel, where its sample's signal would wake the thread going to \
             sleep and fail its call with EINTR; a wall-clock profile (CPUPROFILE_WALL) shows where threads wait"
        ));
    }
    let (kind, config, default_period) =
        if let Some((_, kind, config, period)) = NAMED.iter().find(|(names, ..)| names.contains(&lower.as_str())) {
            (*kind, *config, *period)
        } else if let Some(code) = lower
            .strip_prefix('r')
            .filter(|hex| !hex.is_empty() && hex.len() <= 16)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        {
            (PERF_TYPE_RAW, code, RAW_DEFAULT_PERIOD)
        } else {
            return Err(format!(
                "{name:?} is not an event cpuprof knows (known: {})",
                known_names()
            ));
        };
    let period = match period.map(str::trim).filter(|p| !p.is_empty()) {
        None => default_period,
        Some(p) => p
            .parse::<u64>()
            .ok()
            .filter(|&p| (1..=1 << 40).contains(&p))
            .ok_or_else(|| format!("period {p:?} is not a whole number of events from 1 to 2^40"))?,
    };
    Ok(Event {
        name: lower,
        kind,
        config,
        period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_perfs() {
        let e = parse("page-faults", None).unwrap();
        assert_eq!((e.kind, e.config, e.period), (PERF_TYPE_SOFTWARE, 2, 100));
        assert!(!e.is_hardware());
        let e = parse("Minor-Faults", Some("5")).unwrap();
        assert_eq!((e.name.as_str(), e.kind, e.config, e.period), ("minor-faults", 1, 5, 5));
        let e = parse("cycles", None).unwrap();
        assert_eq!((e.kind, e.config), (PERF_TYPE_HARDWARE, 0));
        assert!(e.is_hardware());
        assert_eq!(parse("cpu-cycles", None).unwrap().config, 0);
        assert_eq!(parse("branch-misses", None).unwrap().config, 5);
    }

    #[test]
    fn raw_codes_are_hexadecimal() {
        let e = parse("r01c2", Some("20000")).unwrap();
        assert_eq!((e.kind, e.config, e.period), (PERF_TYPE_RAW, 0x01c2, 20000));
        assert!(parse("r", None).is_err());
        assert!(parse("rxyz", None).is_err());
    }

    #[test]
    fn events_only_the_kernel_sees_are_refused_for_the_eintr_they_would_cause() {
        for name in ["context-switches", "CS", "cpu-migrations", "migrations"] {
            let e = parse(name, None).unwrap_err();
            assert!(e.contains("EINTR") && e.contains("CPUPROFILE_WALL"), "{e}");
        }
    }

    #[test]
    fn bad_names_and_periods_are_refused_with_the_reason() {
        let e = parse("hugs", None).unwrap_err();
        assert!(e.contains("not an event") && e.contains("page-faults"), "{e}");
        for bad in ["0", "-1", "x", "1099511627777"] {
            let e = parse("cycles", Some(bad)).unwrap_err();
            assert!(e.contains("period"), "{e}");
        }
    }
}
