//! How many looks at threads a wall-clock profile's sampler took, and how many of them are
//! missing from it, recorded after the maps text of the wall-clock profile:
//!
//! ```text
//! # wall-looks 3000 2900 denied:2900
//! ```
//!
//! (looks, looks whose weight is missing, then `reason:count` for each reason that occurred).
//! The wall sampler looks at threads off the CPU in turn; a look that cannot tell where the
//! thread is (its state file unreadable after the program dropped its privileges, say) adds
//! nothing, so that thread's blocked time is missing from the profile. Without the line a
//! reader cannot tell a profile of busy threads from one whose blocked threads could not be
//! seen. `cpuprof check` warns about missing looks and refuses to call a profile valid when
//! most of its looks are missing.
//!
//! Reasons (the sampler's summary line at stop says the same in words):
//! * `denied`: the thread's `/proc/self/task/TID/syscall` could not be opened (the process
//!   is not dumpable after a change of credentials) and nothing else gave its registers;
//! * `no-switch`: the thread was watched by context-switch events, but none of its switches
//!   was recorded yet (it has been blocked since before they were opened);
//! * `lost-switches`: switch records were lost (a full buffer) and the thread ran since its
//!   last one;
//! * `unreadable`: any other failure to read the thread's state (out of descriptors).
//!
//! The spelling follows the build-id lines' rules (see [`super::build_id`]): it starts with `#`
//! and holds no `=` or `]`, so google-pprof and go tool pprof skip it.
//!
//! This module is pure code.

const PREFIX: &str = "# wall-looks ";

/// The looks behind a wall-clock profile and those missing from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WallLooks {
    /// Looks at threads by the wall sampler.
    pub looks: u64,
    /// Looks that recorded nothing because the thread's state could not be read.
    pub missing: u64,
    /// `(reason, looks)` for each reason some looks are missing, in the order written.
    pub reasons: Vec<(String, u64)>,
}

impl WallLooks {
    /// The share of looks missing, 0 without looks.
    pub fn missing_share(&self) -> f64 {
        if self.looks == 0 {
            0.0
        } else {
            self.missing as f64 / self.looks as f64
        }
    }

    /// The line recording these counts (newline included), to append to a profile's maps text.
    pub fn line(&self) -> String {
        let mut line = format!("{PREFIX}{} {}", self.looks, self.missing);
        for (reason, count) in &self.reasons {
            line += &format!(" {reason}:{count}");
        }
        line.push('\n');
        line
    }

    /// The counts a `# wall-looks` line records; `None` for any other line, or one whose
    /// numbers cannot be counts (more missing than looks, reasons summing past the missing).
    pub fn parse_line(line: &str) -> Option<WallLooks> {
        let mut fields = line.trim_start().strip_prefix(PREFIX)?.split_whitespace();
        let looks = fields.next()?.parse::<u64>().ok()?;
        let missing = fields.next()?.parse::<u64>().ok()?;
        let mut reasons = Vec::new();
        for field in fields {
            let (reason, count) = field.split_once(':')?;
            let valid = !reason.is_empty() && reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
            if !valid {
                return None;
            }
            reasons.push((reason.to_string(), count.parse::<u64>().ok()?));
        }
        let explained = reasons.iter().try_fold(0u64, |sum, (_, n)| sum.checked_add(*n))?;
        (missing <= looks && explained <= missing).then_some(WallLooks {
            looks,
            missing,
            reasons,
        })
    }

    /// The reasons in words, for a warning: `2900 denied` style, comma-separated.
    pub fn reasons_text(&self) -> String {
        self.reasons
            .iter()
            .map(|(reason, n)| {
                let why = match reason.as_str() {
                    "denied" => "the thread's state file was unreadable (a process no longer dumpable after a change of credentials)",
                    "no-switch" => "no context switch of the thread was recorded yet",
                    "lost-switches" => "context-switch records were lost",
                    "unreadable" => "the thread's state could not be read",
                    other => other,
                };
                format!("{n}: {why}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_round_trips_and_nonsense_is_refused() {
        let w = WallLooks {
            looks: 3000,
            missing: 2900,
            reasons: vec![("denied".into(), 2800), ("no-switch".into(), 100)],
        };
        assert_eq!(w.line(), "# wall-looks 3000 2900 denied:2800 no-switch:100\n");
        assert_eq!(WallLooks::parse_line(&w.line()), Some(w.clone()));
        assert!((w.missing_share() - 2900.0 / 3000.0).abs() < 1e-12);
        let none = WallLooks {
            looks: 10,
            ..Default::default()
        };
        assert_eq!(WallLooks::parse_line(&none.line()), Some(none));
        for bad in [
            "# wall-looks 1",
            "# wall-looks 5 6",
            "# wall-looks 5 2 denied:3",
            "# wall-looks 5 2 denied",
            "# wall-looks 5 2 Denied:1",
            "# wall-looks -1 0",
            "# signal-weights 1 2 3",
        ] {
            assert_eq!(WallLooks::parse_line(bad), None, "{bad}");
        }
        let line = w.line();
        assert!(line.starts_with('#') && !line.contains('=') && !line.contains(']'));
    }
}
