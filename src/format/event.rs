//! Which event a profile's samples count, recorded after the maps text of a hardware- or
//! software-event profile (`CPUPROFILE_EVENT`, `/pprof/pmuprofile`):
//!
//! ```text
//! # event page-faults 100
//! ```
//!
//! (the event's name as it was asked for, and how many events one sample stands for). Such a
//! profile keeps the legacy format, whose header slot holds that period where a CPU profile
//! holds microseconds, so readers that do not know the line (google-pprof, go tool pprof)
//! print times that are event counts in millionths: 1 s there is a million events. Readers
//! that know it print events.
//!
//! The spelling follows the build-id lines' rules (see [`super::build_id`]): it starts with `#`
//! and holds no `=` or `]`, so google-pprof and go tool pprof skip it.
//!
//! This module is pure code.

const PREFIX: &str = "# event ";

/// The event a profile counts, and the events per sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLine {
    /// The event's name as asked for (`cycles`, `page-faults`, `r01c2`).
    pub name: String,
    /// How many events one sample stands for.
    pub period: u64,
}

impl EventLine {
    /// The line (newline included), to append to a profile's maps text.
    pub fn line(&self) -> String {
        format!("{PREFIX}{} {}\n", self.name, self.period)
    }

    /// Reads a line written by [`EventLine::line`]; `None` for anything else.
    pub fn parse_line(line: &str) -> Option<EventLine> {
        let rest = line.trim_end().strip_prefix(PREFIX)?;
        let (name, period) = rest.split_once(' ')?;
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.');
        if name.is_empty() || !name.chars().all(valid) || period.contains(' ') {
            return None;
        }
        let period: u64 = period.parse().ok().filter(|&p| p > 0)?;
        Some(EventLine {
            name: name.to_string(),
            period,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_back() {
        let e = EventLine {
            name: "page-faults".into(),
            period: 100,
        };
        assert_eq!(e.line(), "# event page-faults 100\n");
        assert_eq!(EventLine::parse_line(&e.line()), Some(e));
        let raw = EventLine {
            name: "r01c2".into(),
            period: 10_000,
        };
        assert_eq!(EventLine::parse_line(&raw.line()), Some(raw));
    }

    #[test]
    fn other_lines_are_not_events() {
        for line in [
            "# event",
            "# event cycles",
            "# event cycles 0",
            "# event cycles -1",
            "# event cycles 1 2",
            "# event cyc=les 1",
            "# event cyc]les 1",
            "# events cycles 1",
            "# signal-weights 1 2 3",
        ] {
            assert_eq!(EventLine::parse_line(line), None, "{line:?}");
        }
    }
}
