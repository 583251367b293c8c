//! The lock contention profile google-pprof and go tool pprof read (`/pprof/contention`,
//! `CPUPROFILE_CONTENTION`):
//!
//! ```text
//! --- contention:
//! cycles/second = 1000000000
//! sampling period = 1
//! ms since reset = 2000
//! 5230000 1280 @ 0x401234 0x401567 0x7f12a0029d8f
//! --- Memory map: ---
//! 00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app
//! ```
//!
//! Each line below the header is one call chain of waiting threads: the delay they waited, in
//! cycles at `cycles/second` (cpuprof writes nanoseconds: 10^9 cycles per second), and how many
//! waits; `sampling period` multiplies both (cpuprof writes its samples scaled back already, so
//! 1). Addresses are return addresses, innermost first (readers move them onto their call). The
//! header's marker is `--- contention:`, which both readers take (go tool pprof wants the
//! colon, google-pprof any `--- contention`). The maps follow `--- Memory map: ---`.
//!
//! A profile of the holder's view (the delay charged to the threads that released the lock,
//! [`View::Holders`]) says so in a comment after the header values, `# delay charged to:
//! holders`, which go tool pprof skips and google-pprof takes for a line of the maps (where it
//! matches no mapping).
//!
//! Pure code, defensive like the other readers: any input gives a profile or an error.

use super::pprof::{Frame, Pprof};
use super::Maps;
use std::fmt;
use std::io::{self, Write};

/// One call chain's waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentionRecord {
    /// Nanoseconds waited in all.
    pub delay_ns: u64,
    /// Waits.
    pub count: u64,
    /// Return addresses, innermost first.
    pub stack: Vec<u64>,
}

/// Whose call chains a contention profile's lines are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// The waiting threads', the delay their waits (as async-profiler and google-pprof's
    /// contention profiles).
    #[default]
    Waiters,
    /// The releasing threads', the delay what the lock's waiters accrued while they held it
    /// (as Go's mutex profile).
    Holders,
}

impl View {
    /// Both views.
    pub const ALL: [View; 2] = [View::Waiters, View::Holders];

    /// `waiters` or `holders`.
    pub fn name(self) -> &'static str {
        match self {
            View::Waiters => "waiters",
            View::Holders => "holders",
        }
    }
}

/// The comment that marks a profile of the holder's view.
pub const HOLDERS_LINE: &str = "# delay charged to: holders";

/// A contention profile: its lines and the mapped objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentionProfile {
    /// Whose chains the lines are.
    pub view: View,
    /// How long the profile ran, in milliseconds (`ms since reset`).
    pub duration_ms: u64,
    /// Waits the profile could not keep (`discarded samples`: its table was full).
    pub discarded: u64,
    /// The lines, in file order.
    pub records: Vec<ContentionRecord>,
    /// The text after `--- Memory map: ---` (the process's `/proc/self/maps`, with cpuprof's
    /// `# build-id` lines).
    pub maps_text: Vec<u8>,
}

/// The two values of a line, as pprof names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentionValue {
    /// Waits (`contentions/count`).
    Contentions,
    /// Nanoseconds waited (`delay/nanoseconds`): readers' default.
    Delay,
}

impl ContentionValue {
    /// Both, in the order of the pprof sample types.
    pub const ALL: [ContentionValue; 2] = [ContentionValue::Contentions, ContentionValue::Delay];

    /// pprof's name of the value.
    pub fn name(self) -> &'static str {
        match self {
            ContentionValue::Contentions => "contentions",
            ContentionValue::Delay => "delay",
        }
    }

    /// The value named `name` (pprof's names), if any.
    pub fn from_name(name: &str) -> Option<ContentionValue> {
        ContentionValue::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The value of `record`.
    pub fn of(self, record: &ContentionRecord) -> u64 {
        match self {
            ContentionValue::Contentions => record.count,
            ContentionValue::Delay => record.delay_ns,
        }
    }
}

/// Why a text is not a contention profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentionParseError {
    /// 1-based line of the problem.
    pub line: usize,
    /// What is wrong there.
    pub reason: &'static str,
}

impl fmt::Display for ContentionParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "contention profile, line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for ContentionParseError {}

const MARKER: &str = "--- contention";
const MAPS_MARKER: &str = "--- Memory map: ---";

/// Whether `bytes` begin as a contention profile does (`--- contention`).
pub fn looks_like_contention(bytes: &[u8]) -> bool {
    bytes.starts_with(MARKER.as_bytes())
}

impl ContentionProfile {
    /// Total delay and waits over all lines.
    pub fn totals(&self) -> (u64, u64) {
        self.records.iter().fold((0u64, 0u64), |(d, c), r| {
            (d.saturating_add(r.delay_ns), c.saturating_add(r.count))
        })
    }

    /// The mapped objects.
    pub fn maps(&self) -> Maps {
        Maps::parse(&self.maps_text)
    }

    /// Writes the profile in the text format above.
    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "--- contention:")?;
        writeln!(out, "cycles/second = 1000000000")?;
        writeln!(out, "sampling period = 1")?;
        writeln!(out, "ms since reset = {}", self.duration_ms)?;
        if self.discarded > 0 {
            writeln!(out, "discarded samples = {}", self.discarded)?;
        }
        if self.view == View::Holders {
            writeln!(out, "{HOLDERS_LINE}")?;
        }
        let mut line = String::new();
        for r in &self.records {
            use std::fmt::Write as _;
            line.clear();
            let _ = write!(line, "{} {} @", r.delay_ns, r.count);
            for pc in &r.stack {
                let _ = write!(line, " 0x{pc:x}");
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        writeln!(out, "{MAPS_MARKER}")?;
        out.write_all(&self.maps_text)
    }

    /// The profile as text.
    pub fn to_text(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_text(&mut out).expect("writing to memory");
        out
    }

    /// Parses a contention profile (cpuprof's, or any with the header google-pprof reads):
    /// delays in cycles at `cycles/second` become nanoseconds, and `sampling period`
    /// multiplies delays and counts.
    pub fn parse(bytes: &[u8]) -> Result<ContentionProfile, ContentionParseError> {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.split_inclusive('\n').enumerate();
        let bad = |line: usize, reason| ContentionParseError { line: line + 1, reason };
        match lines.next() {
            Some((_, first)) if first.starts_with(MARKER) => {}
            _ => return Err(bad(0, "not a contention profile (no `--- contention` header)")),
        }
        let mut profile = ContentionProfile::default();
        let (mut cycles_per_second, mut period) = (1e9f64, 1u64);
        let mut maps_start = None;
        let mut offset = text.split_inclusive('\n').next().map_or(0, str::len);
        for (n, line) in lines {
            let trimmed = line.trim();
            let here = offset;
            offset += line.len();
            if trimmed.starts_with(MAPS_MARKER) {
                maps_start = Some(offset);
                break;
            }
            if trimmed == HOLDERS_LINE {
                profile.view = View::Holders;
            }
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if let Some((key, value)) = trimmed.split_once('=').filter(|_| !trimmed.contains('@')) {
                let number = || {
                    value
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| bad(n, "a header value is not a number"))
                };
                match key.trim() {
                    "cycles/second" => cycles_per_second = number()?.max(1) as f64,
                    "sampling period" => period = number()?.max(1),
                    "ms since reset" => profile.duration_ms = number()?,
                    "discarded samples" => profile.discarded = number()?,
                    _ => {}
                }
                continue;
            }
            let Some(record) = parse_line(trimmed, cycles_per_second, period) else {
                // Not a sample: the maps begin (a profile without the marker).
                maps_start = Some(here);
                break;
            };
            profile.records.push(record);
        }
        if let Some(start) = maps_start {
            profile.maps_text = text.as_bytes()[start.min(text.len())..].to_vec();
        }
        Ok(profile)
    }

    /// The profile in pprof's terms: sample types `contentions/count` and
    /// `delay/nanoseconds` (the default), each address moved onto its call (minus one), as
    /// pprof's own reader of this format does. `frames` names a location (innermost inlined
    /// frame first; empty to leave it to the reader), `build_id` a mapping without a recorded
    /// build-id.
    pub fn to_pprof(
        &self,
        mut frames: impl FnMut(u64) -> Vec<Frame>,
        mut build_id: impl FnMut(&str) -> String,
    ) -> Pprof {
        let maps = self.maps();
        let mut pprof = Pprof {
            kind: "contentions".into(),
            unit: "count",
            period_ns: 1,
            values: vec![("contentions", "count"), ("delay", "nanoseconds")],
            default_value: "delay",
            duration_ns: self.duration_ms.saturating_mul(1_000_000),
            ..Pprof::default()
        };
        let chains = self
            .records
            .iter()
            .map(|r| (r.stack.as_slice(), vec![r.count, r.delay_ns]));
        super::pprof::add_chains(&mut pprof, &maps, chains, false, &mut frames, &mut build_id);
        pprof
    }
}

/// `<delay> <count> @ 0x... 0x...`, the delay converted from cycles to nanoseconds and both
/// values multiplied by the sampling period.
fn parse_line(line: &str, cycles_per_second: f64, period: u64) -> Option<ContentionRecord> {
    let (values, addresses) = line.split_once('@')?;
    let mut values = values.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (cycles, count) = (values.next()??, values.next()??);
    if values.next().is_some() {
        return None;
    }
    let stack = addresses
        .split_whitespace()
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect::<Option<Vec<u64>>>()?;
    let delay_ns = (cycles as f64 * 1e9 / cycles_per_second) as u64;
    Some(ContentionRecord {
        delay_ns: delay_ns.saturating_mul(period),
        count: count.saturating_mul(period),
        stack,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ContentionProfile {
        ContentionProfile {
            view: View::Waiters,
            duration_ms: 2000,
            discarded: 0,
            records: vec![
                ContentionRecord {
                    delay_ns: 5_230_000,
                    count: 1280,
                    stack: vec![0x401234, 0x401567],
                },
                ContentionRecord {
                    delay_ns: 1000,
                    count: 1,
                    stack: vec![0x401299],
                },
            ],
            maps_text: b"00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n".to_vec(),
        }
    }

    #[test]
    fn the_text_reads_back() {
        let p = sample();
        let text = p.to_text();
        let s = String::from_utf8_lossy(&text);
        assert!(
            s.starts_with("--- contention:\ncycles/second = 1000000000\nsampling period = 1\n"),
            "{s}"
        );
        assert!(s.contains("5230000 1280 @ 0x401234 0x401567\n"), "{s}");
        assert!(looks_like_contention(&text));
        assert_eq!(ContentionProfile::parse(&text), Ok(p.clone()));
        assert_eq!(p.totals(), (5_231_000, 1281));
        assert_eq!(p.maps().entries.len(), 1);
    }

    #[test]
    fn the_holders_view_reads_back_as_such() {
        let p = ContentionProfile {
            view: View::Holders,
            ..sample()
        };
        let text = p.to_text();
        assert!(String::from_utf8_lossy(&text).contains("\n# delay charged to: holders\n"));
        assert_eq!(ContentionProfile::parse(&text), Ok(p));
    }

    #[test]
    fn cycles_and_periods_of_other_writers_are_scaled() {
        let text = b"--- contention\ncycles/second = 2000000000\nsampling period = 100\n\
                     4000 3 @ 0x10 0x20\n00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n";
        let p = ContentionProfile::parse(text).unwrap();
        assert_eq!(p.records[0].delay_ns, 200_000);
        assert_eq!(p.records[0].count, 300);
        assert_eq!(p.maps().entries.len(), 1, "maps without the marker");
    }

    #[test]
    fn other_input_is_refused() {
        assert!(ContentionProfile::parse(b"heap profile: 1: 2 [3: 4] @ heap").is_err());
        assert!(ContentionProfile::parse(b"").is_err());
        assert!(!looks_like_contention(b"\0\0\0\0"));
        let bad = ContentionProfile::parse(b"--- contention:\ncycles/second = many\n").unwrap_err();
        assert_eq!(bad.line, 2);
    }

    #[test]
    fn pprof_values_are_contentions_and_delay() {
        let pprof = sample().to_pprof(|_| Vec::new(), |_| String::new());
        assert_eq!(pprof.default_value, "delay");
        assert_eq!(pprof.samples[0].values, vec![1280, 5_230_000]);
        assert_eq!(pprof.locations[0].address, 0x401233);
        assert_eq!(pprof.duration_ns, 2_000_000_000);
    }
}
