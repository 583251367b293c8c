//! A heap profile with every address named, as [`super::Report`] is for CPU profiles: from
//! [`crate::heap::report`] or [`HeapReport::parse`]. Values are scaled back line by line as
//! pprof does, so `top` agrees with `go tool pprof -sample_index=...` and `cpuprof top`.

use super::names::Names;
use super::{Frame, FunctionCost};
use crate::error::Error;
use crate::format::heap::{HeapProfile, HeapValue};
use crate::format::pprof::Frame as PprofFrame;
use std::collections::HashMap;
use std::io::{self, Write};

/// A heap profile in memory, named.
pub struct HeapReport {
    profile: HeapProfile,
    /// One per distinct address, in order of first appearance.
    frames: Vec<Frame>,
    /// Per line of the profile: its frames (indices into `frames`, innermost first) and its
    /// four values in [`HeapValue::ALL`] order, scaled back.
    lines: Vec<(Vec<usize>, [u64; 4])>,
}

impl HeapReport {
    /// Reads a heap profile (gperftools' text format) and names its addresses from the files
    /// its maps list, as they are now.
    pub fn parse(text: &[u8]) -> Result<HeapReport, Error> {
        let profile = HeapProfile::parse(text).map_err(|e| Error::Read(e.to_string()))?;
        Ok(HeapReport::new(profile))
    }

    pub(crate) fn new(profile: HeapProfile) -> HeapReport {
        let mut names = Names::new(profile.maps());
        let mut frames = Vec::new();
        let mut frame_of: HashMap<u64, usize> = HashMap::new();
        let period = profile.period;
        let lines = profile
            .records
            .iter()
            .map(|record| {
                let stack = record
                    .stack
                    .iter()
                    .enumerate()
                    .map(|(depth, &pc)| {
                        // The first address is the allocating call itself; the others return
                        // addresses, whose call is the byte before.
                        let address = if depth == 0 { pc } else { pc.saturating_sub(1) };
                        *frame_of.entry(address).or_insert_with(|| {
                            frames.push(names.frame(address));
                            frames.len() - 1
                        })
                    })
                    .collect();
                let scaled = record.counts.unsampled(period);
                (stack, HeapValue::ALL.map(|v| scaled.get(v)))
            })
            .collect();
        HeapReport { profile, frames, lines }
    }

    /// The profile as read.
    pub fn profile(&self) -> &HeapProfile {
        &self.profile
    }

    fn value_of(values: &[u64; 4], value: HeapValue) -> u64 {
        let i = HeapValue::ALL.iter().position(|&v| v == value).unwrap_or(3);
        values[i]
    }

    /// The total of `value` (bytes or objects, scaled back).
    pub fn total(&self, value: HeapValue) -> u64 {
        self.lines.iter().map(|(_, v)| Self::value_of(v, value)).sum()
    }

    /// `value` per function, most in the function itself first: `flat` where the function
    /// made the allocating call, `cumulative` where it was anywhere on the stack.
    pub fn top(&self, value: HeapValue) -> Vec<FunctionCost> {
        let stacks = self
            .lines
            .iter()
            .map(|(stack, values)| (stack.as_slice(), Self::value_of(values, value)));
        let mut costs = super::function_costs(&self.frames, stacks);
        costs.retain(|c| c.cumulative > 0);
        costs
    }

    /// Writes the `n` functions with most of `value` as a table, as `cpuprof top
    /// --sample-index` prints it.
    pub fn write_top(&self, out: &mut impl Write, value: HeapValue, n: usize) -> io::Result<()> {
        let total = self.total(value);
        let percent = |x: u64| {
            if total == 0 {
                0.0
            } else {
                100.0 * x as f64 / total as f64
            }
        };
        let unit = if value.is_bytes() { " bytes" } else { " objects" };
        writeln!(
            out,
            "Total: {total}{unit} {} (sampled every {} bytes)",
            value.name(),
            self.profile.period
        )?;
        writeln!(
            out,
            "{:>12} {:>6} {:>6} {:>12} {:>6}  function",
            "flat", "flat%", "sum%", "cum", "cum%"
        )?;
        let mut sum = 0;
        for cost in self.top(value).into_iter().take(n) {
            sum += cost.flat;
            writeln!(
                out,
                "{:>12} {:>5.1}% {:>5.1}% {:>12} {:>5.1}%  {}",
                cost.flat,
                percent(cost.flat),
                percent(sum),
                cost.cumulative,
                percent(cost.cumulative),
                cost.function
            )?;
        }
        Ok(())
    }

    /// Writes the stacks as folded lines weighted by `value`, outermost frame first.
    pub fn write_folded(&self, out: &mut impl Write, value: HeapValue) -> io::Result<()> {
        for (stack, values) in &self.lines {
            let amount = Self::value_of(values, value);
            if amount == 0 {
                continue;
            }
            let names: Vec<String> = stack
                .iter()
                .rev()
                .map(|&f| self.frames[f].function.replace(';', ":"))
                .collect();
            writeln!(out, "{} {amount}", names.join(";"))?;
        }
        Ok(())
    }

    /// Writes the profile as gzipped pprof protobuf with Go's four heap sample types, its
    /// locations named as in this report.
    pub fn write_pprof(&self, out: &mut impl Write) -> io::Result<()> {
        let function_at: HashMap<u64, &str> = self.frames.iter().map(|f| (f.address, f.function.as_str())).collect();
        let pprof = self.profile.to_pprof(
            |addr| {
                function_at
                    .get(&addr)
                    .map(|name| PprofFrame {
                        function: name.to_string(),
                        ..PprofFrame::default()
                    })
                    .into_iter()
                    .collect()
            },
            |_| String::new(),
        );
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&pprof.encode())?;
        gz.finish().map(drop)
    }
}
