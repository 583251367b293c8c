//! gperftools' text heap profile, as tcmalloc's heap profiler writes it, `/pprof/heap` serves
//! it and `google-pprof` and `go tool pprof` read it:
//!
//! ```text
//! heap profile:   12:  3145728 [    40: 10485760] @ heap_v2/524288
//!      8:  2097152 [    24:  6291456] @ 0x401234 0x401567 0x7f12a0029d8f
//!      4:  1048576 [    16:  4194304] @ 0x401299 0x401567 0x7f12a0029d8f
//!
//! MAPPED_LIBRARIES:
//! 00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app
//! ```
//!
//! The header holds the totals; each line below it one call chain's *sampled* objects and
//! bytes, in use (allocated and not yet freed) and allocated in all; then the mapped objects.
//! `heap_v2/N` says that about one allocation per `N` bytes was sampled, each with probability
//! `1 - exp(-size/N)`: readers scale every line back with [`unsample`], from the line's mean
//! object size, as pprof's `scaleHeapSample` does. A writer that keeps objects of very
//! different sizes on separate lines (cpuprof keeps one line per call chain and size class)
//! makes that scaling close to exact. A growth profile (`@ growth`) has the same shape and is
//! not scaled.
//!
//! Addresses are innermost first. The first is where the allocating call is (pprof does not
//! move it); the others are return addresses (pprof moves them onto their call, minus one).
//! Pure code, defensive like the CPU reader: any input gives a profile or an error.

use super::pprof::{Frame, Pprof};
use super::Maps;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};

/// What a heap profile's lines count: objects and bytes, in use and allocated in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCounts {
    /// Objects allocated and not yet freed.
    pub inuse_objects: u64,
    /// Their bytes.
    pub inuse_bytes: u64,
    /// Objects allocated since the profile started, freed or not.
    pub alloc_objects: u64,
    /// Their bytes.
    pub alloc_bytes: u64,
}

impl HeapCounts {
    /// The sum of two counts (saturating).
    pub fn plus(self, other: HeapCounts) -> HeapCounts {
        HeapCounts {
            inuse_objects: self.inuse_objects.saturating_add(other.inuse_objects),
            inuse_bytes: self.inuse_bytes.saturating_add(other.inuse_bytes),
            alloc_objects: self.alloc_objects.saturating_add(other.alloc_objects),
            alloc_bytes: self.alloc_bytes.saturating_add(other.alloc_bytes),
        }
    }

    /// These counts scaled back to the whole program's (see [`unsample`]); unchanged for a
    /// profile that is not sampled (`period` 0 or 1).
    pub fn unsampled(self, period: u64) -> HeapCounts {
        let (inuse_objects, inuse_bytes) = unsample(self.inuse_objects, self.inuse_bytes, period);
        let (alloc_objects, alloc_bytes) = unsample(self.alloc_objects, self.alloc_bytes, period);
        HeapCounts {
            inuse_objects,
            inuse_bytes,
            alloc_objects,
            alloc_bytes,
        }
    }

    /// The value a reader asked for.
    pub fn get(self, value: HeapValue) -> u64 {
        match value {
            HeapValue::InuseSpace => self.inuse_bytes,
            HeapValue::InuseObjects => self.inuse_objects,
            HeapValue::AllocSpace => self.alloc_bytes,
            HeapValue::AllocObjects => self.alloc_objects,
        }
    }
}

/// The four values of a heap profile, named as pprof names its sample types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapValue {
    /// Bytes in use (`inuse_space`, the default of every reader).
    InuseSpace,
    /// Objects in use (`inuse_objects`).
    InuseObjects,
    /// Bytes allocated in all (`alloc_space`).
    AllocSpace,
    /// Objects allocated in all (`alloc_objects`).
    AllocObjects,
}

impl HeapValue {
    /// All four, in the order of pprof's sample types for heap profiles.
    pub const ALL: [HeapValue; 4] = [
        HeapValue::AllocObjects,
        HeapValue::AllocSpace,
        HeapValue::InuseObjects,
        HeapValue::InuseSpace,
    ];

    /// pprof's name of the value (`inuse_space`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HeapValue::InuseSpace => "inuse_space",
            HeapValue::InuseObjects => "inuse_objects",
            HeapValue::AllocSpace => "alloc_space",
            HeapValue::AllocObjects => "alloc_objects",
        }
    }

    /// The value named `name` (pprof's names), if any.
    pub fn from_name(name: &str) -> Option<HeapValue> {
        HeapValue::ALL.into_iter().find(|v| v.name() == name)
    }

    /// Whether the value counts bytes (else objects).
    pub fn is_bytes(self) -> bool {
        matches!(self, HeapValue::InuseSpace | HeapValue::AllocSpace)
    }
}

/// Whether the profile is of the heap now (sampled) or of its growth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapKind {
    /// `@ heap_v2/N`: sampled about once per `period` bytes.
    Heap,
    /// `@ growth`: the stacks whose memory in use grew, not scaled.
    Growth,
}

/// One call chain's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapRecord {
    /// Sampled objects and bytes (as written: not scaled back).
    pub counts: HeapCounts,
    /// Innermost first: where the allocating call is, then return addresses.
    pub stack: Vec<u64>,
}

/// A heap profile: how it was sampled, its lines and the mapped objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapProfile {
    /// Heap or growth.
    pub kind: HeapKind,
    /// Mean bytes between samples (`heap_v2/N`); 1 when every allocation was recorded.
    pub period: u64,
    /// The lines, in file order.
    pub records: Vec<HeapRecord>,
    /// The text after `MAPPED_LIBRARIES:` (the process's `/proc/self/maps`, with cpuprof's
    /// `# build-id` lines).
    pub maps_text: Vec<u8>,
}

/// Scales a line's sampled `count` objects of `bytes` bytes back to what the program
/// allocated, as pprof does for `heap_v2/period`: each object of the line's mean size `s`
/// stands for `1 / (1 - exp(-s/period))` objects. Unchanged when `period` is 0 or 1 (every
/// allocation recorded).
pub fn unsample(count: u64, bytes: u64, period: u64) -> (u64, u64) {
    if count == 0 || bytes == 0 {
        return (0, 0);
    }
    if period <= 1 {
        return (count, bytes);
    }
    let mean = bytes as f64 / count as f64;
    let scale = 1.0 / (1.0 - (-mean / period as f64).exp());
    ((count as f64 * scale) as u64, (bytes as f64 * scale) as u64)
}

/// Why a text is not a heap profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapParseError {
    /// 1-based line of the problem.
    pub line: usize,
    /// What is wrong there.
    pub reason: &'static str,
}

impl fmt::Display for HeapParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "heap profile, line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for HeapParseError {}

/// Whether `bytes` begin as a heap profile does (`heap profile:`), to tell one from a CPU
/// profile before parsing.
pub fn looks_like_heap(bytes: &[u8]) -> bool {
    bytes.starts_with(b"heap profile:")
}

const MAPS_MARKER: &str = "MAPPED_LIBRARIES:";

impl HeapProfile {
    /// The totals over all lines (sampled, as written).
    pub fn totals(&self) -> HeapCounts {
        self.records
            .iter()
            .fold(HeapCounts::default(), |sum, r| sum.plus(r.counts))
    }

    /// Writes the profile in gperftools' text format.
    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        let tag = match self.kind {
            HeapKind::Heap => format!("heap_v2/{}", self.period),
            HeapKind::Growth => "growth".to_string(),
        };
        write!(out, "heap profile: ")?;
        write_counts(out, self.totals())?;
        writeln!(out, " @ {tag}")?;
        for record in &self.records {
            write_counts(out, record.counts)?;
            write!(out, " @")?;
            for pc in &record.stack {
                write!(out, " 0x{pc:x}")?;
            }
            writeln!(out)?;
        }
        writeln!(out, "\n{MAPS_MARKER}")?;
        out.write_all(&self.maps_text)
    }

    /// Reads a heap profile in gperftools' text format (`heap_v2`, the older `heap` and
    /// `heapprofile` tags, and `growth`).
    pub fn parse(bytes: &[u8]) -> Result<HeapProfile, HeapParseError> {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.split_inclusive('\n').enumerate();
        let (_, header) = lines.next().ok_or(HeapParseError {
            line: 1,
            reason: "empty",
        })?;
        let (kind, period) = parse_header(header).ok_or(HeapParseError {
            line: 1,
            reason: "not a heap profile (no `heap profile: ... @ heap_v2/N` header)",
        })?;
        let mut records = Vec::new();
        let mut maps_text = Vec::new();
        let mut in_maps = false;
        for (i, line) in lines {
            if in_maps {
                maps_text.extend_from_slice(line.as_bytes());
                continue;
            }
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if trimmed.contains(MAPS_MARKER) || trimmed.contains("--- Memory map:") {
                in_maps = true;
                continue;
            }
            records.push(parse_record(trimmed).ok_or(HeapParseError {
                line: i + 1,
                reason: "not `objects: bytes [objects: bytes] @ addresses`",
            })?);
        }
        Ok(HeapProfile {
            kind,
            period,
            records,
            maps_text,
        })
    }

    /// The mapped objects of the profile.
    pub fn maps(&self) -> Maps {
        Maps::parse(&self.maps_text)
    }

    /// The profile in pprof's terms: the four sample types `alloc_objects`, `alloc_space`,
    /// `inuse_objects`, `inuse_space` (the last the default), each line scaled back with
    /// [`unsample`], period type `space/bytes`. Addresses are named by `frames` (empty: left
    /// to the reader); `build_id` gives the id of an object the profile recorded none for.
    pub fn to_pprof(&self, frames: impl FnMut(u64) -> Vec<Frame>, build_id: impl FnMut(&str) -> String) -> Pprof {
        let period = if self.kind == HeapKind::Heap { self.period } else { 1 };
        let values = self.records.iter().map(|r| {
            let scaled = r.counts.unsampled(period);
            (r.stack.as_slice(), HeapValue::ALL.map(|v| scaled.get(v) as i64))
        });
        heap_pprof(&self.maps(), self.period, values, frames, build_id)
    }

    /// Each distinct call chain's four values ([`HeapValue::ALL`] order), scaled back and
    /// summed over its lines.
    pub fn by_stack(&self) -> HashMap<Vec<u64>, [i64; 4]> {
        let period = if self.kind == HeapKind::Heap { self.period } else { 1 };
        let mut out: HashMap<Vec<u64>, [i64; 4]> = HashMap::new();
        for r in &self.records {
            let scaled = r.counts.unsampled(period);
            let sum = out.entry(r.stack.clone()).or_default();
            for (s, v) in sum.iter_mut().zip(HeapValue::ALL) {
                *s = s.saturating_add(scaled.get(v) as i64);
            }
        }
        out
    }
}

/// A heap profile in pprof's terms from its mapped objects and its samples: each a call chain
/// (innermost first, the first address kept, the others moved onto their call) and its four
/// values in [`HeapValue::ALL`] order, already scaled (negative in a delta).
pub fn heap_pprof<'a>(
    maps: &Maps,
    period: u64,
    samples: impl Iterator<Item = (&'a [u64], [i64; 4])>,
    mut frames: impl FnMut(u64) -> Vec<Frame>,
    mut build_id: impl FnMut(&str) -> String,
) -> Pprof {
    let mut pprof = Pprof {
        kind: "space".into(),
        values: HeapValue::ALL
            .iter()
            .map(|v| (v.name(), if v.is_bytes() { "bytes" } else { "count" }))
            .collect(),
        period_ns: period,
        ..Pprof::default()
    };
    // Protobuf's int64 varint: two's complement as a u64.
    let samples = samples.map(|(stack, values)| (stack, values.iter().map(|&v| v as u64).collect()));
    super::pprof::add_chains(&mut pprof, maps, samples, true, &mut frames, &mut build_id);
    pprof
}

fn write_counts(out: &mut impl Write, c: HeapCounts) -> io::Result<()> {
    write!(
        out,
        "{:6}: {:8} [{:6}: {:8}]",
        c.inuse_objects, c.inuse_bytes, c.alloc_objects, c.alloc_bytes
    )
}

/// `heap profile: a: b [c: d] @ heap_v2/N` (or `@ growth`) -> kind and period.
fn parse_header(line: &str) -> Option<(HeapKind, u64)> {
    let rest = line.trim().strip_prefix("heap profile:")?;
    let (_, tag) = parse_counts_then_tag(rest)?;
    let tag = tag.trim();
    if tag.starts_with("growth") {
        return Some((HeapKind::Growth, 1));
    }
    let (name, period) = tag.split_once('/').unwrap_or((tag, ""));
    let period: u64 = if period.is_empty() { 0 } else { period.parse().ok()? };
    match name {
        "heap_v2" | "heapz_v2" => Some((HeapKind::Heap, period)),
        // pprof's reading of the older tags: `heap/2N` sampled every N, `heapprofile` unsampled.
        "heap" => Some((HeapKind::Heap, period / 2)),
        "heapprofile" => Some((HeapKind::Heap, 1)),
        _ => None,
    }
}

/// `a: b [c: d] @ rest` -> counts and `rest`.
fn parse_counts_then_tag(text: &str) -> Option<(HeapCounts, &str)> {
    let (counts, rest) = text.split_once('@')?;
    let (inuse, alloc) = counts.split_once('[')?;
    let alloc = alloc.trim().strip_suffix(']')?;
    let pair = |s: &str| -> Option<(u64, u64)> {
        let (a, b) = s.split_once(':')?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    };
    let (inuse_objects, inuse_bytes) = pair(inuse)?;
    let (alloc_objects, alloc_bytes) = pair(alloc)?;
    Some((
        HeapCounts {
            inuse_objects,
            inuse_bytes,
            alloc_objects,
            alloc_bytes,
        },
        rest,
    ))
}

fn parse_record(line: &str) -> Option<HeapRecord> {
    let (counts, rest) = parse_counts_then_tag(line)?;
    let stack = rest
        .split_whitespace()
        .map(|a| u64::from_str_radix(a.strip_prefix("0x").unwrap_or(a), 16).ok())
        .collect::<Option<Vec<u64>>>()?;
    Some(HeapRecord { counts, stack })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HeapProfile {
        HeapProfile {
            kind: HeapKind::Heap,
            period: 524288,
            records: vec![
                HeapRecord {
                    counts: HeapCounts {
                        inuse_objects: 8,
                        inuse_bytes: 2097152,
                        alloc_objects: 24,
                        alloc_bytes: 6291456,
                    },
                    stack: vec![0x401234, 0x401567],
                },
                HeapRecord {
                    counts: HeapCounts {
                        inuse_objects: 0,
                        inuse_bytes: 0,
                        alloc_objects: 3,
                        alloc_bytes: 96,
                    },
                    stack: vec![0x401299],
                },
            ],
            maps_text: b"00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n".to_vec(),
        }
    }

    #[test]
    fn writes_what_it_reads() {
        let mut text = Vec::new();
        sample().write_text(&mut text).unwrap();
        let text_str = String::from_utf8(text.clone()).unwrap();
        assert!(text_str.starts_with("heap profile:      8:  2097152 [    27:  6291552] @ heap_v2/524288\n"));
        assert!(text_str.contains("\nMAPPED_LIBRARIES:\n00400000-"));
        assert_eq!(HeapProfile::parse(&text).unwrap(), sample());
        assert!(looks_like_heap(&text));
    }

    #[test]
    fn reads_older_tags_and_growth() {
        let p = HeapProfile::parse(b"heap profile: 1: 2 [3: 4] @ heap/1048576\n1: 2 [3: 4] @ 0x10\n").unwrap();
        assert_eq!(p.period, 524288);
        let g = HeapProfile::parse(b"heap profile: 1: 2 [1: 2] @ growth\n1: 2 [1: 2] @ 0x10 0x20\n").unwrap();
        assert_eq!((g.kind, g.records[0].stack.len()), (HeapKind::Growth, 2));
    }

    #[test]
    fn rejects_what_is_not_one() {
        assert!(HeapProfile::parse(b"").is_err());
        assert!(HeapProfile::parse(b"\0\0\0\0").is_err());
        let bad = HeapProfile::parse(b"heap profile: 1: 2 [3: 4] @ heap_v2/10\n1: 2 [3 4] @ 0x10\n").unwrap_err();
        assert_eq!(bad.line, 2);
        assert!(HeapProfile::parse(b"heap profile: 1: 2 [3: 4] @ heap_v2/x\n").is_err());
        assert!(HeapProfile::parse(b"heap profile: 1: 2 [3: 4] @ 0xzz\n").is_err());
    }

    #[test]
    fn unsampling_follows_pprof() {
        // Objects far smaller than the period each stand for period/size objects.
        let (n, b) = unsample(10, 160, 524288);
        let expected = 10.0 * 524288.0 / 16.0;
        assert!((n as f64 - expected).abs() / expected < 1e-4, "{n}");
        assert_eq!(b / n, 16);
        // Objects far larger are all sampled.
        assert_eq!(unsample(2, 200 << 20, 524288), (2, 200 << 20));
        assert_eq!(unsample(5, 100, 1), (5, 100));
        assert_eq!(unsample(0, 0, 524288), (0, 0));
    }

    #[test]
    fn pprof_has_the_four_values_scaled() {
        let pprof = sample().to_pprof(|_| Vec::new(), |_| String::new());
        assert_eq!(pprof.values.len(), 4);
        let big = &pprof.samples[0];
        let scale = 1.0 / (1.0 - (-262144.0f64 / 524288.0).exp());
        assert_eq!(big.values[0], (24.0 * scale) as u64);
        assert_eq!(big.values[3], (2097152.0 * scale) as u64);
        // The first address is kept, return addresses move onto their call.
        assert_eq!(pprof.locations[0].address, 0x401234);
        assert_eq!(pprof.locations[1].address, 0x401566);
        assert_eq!(pprof.mappings[0].file, "/usr/bin/app");
    }
}
