//! Reports in the program itself: a profile read back into memory and named, to walk or to
//! write as a top table, folded stacks, a pprof protobuf, a flame graph (feature
//! `flamegraph`) or the raw gperftools format, without the `cpuprof` command.
//!
//! Names come from the ELF symbol tables of the files the profile's maps list (`.symtab` and
//! `.dynsym`), read in this process by the ELF reader the `cpuprof` command uses, so that
//! both name code alike: of the symbols at one address the largest, a symbol without a size
//! holding the unwind-table extent it starts; code no symbol covers (a stripped binary's
//! static functions) is named `object+0xSTART` after the function start its unwind tables
//! give, and code nothing names `[object]`. Rust and C++ names are demangled (Rust's without
//! the hash). What this leaves out, the CLI's DWARF reading gives: inlined frames, source
//! lines, separate debug files.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = cpuprof::Profiler::builder().frequency(1000).start_in_memory()?;
//! let mut x = 0u64;
//! for i in 0..20_000_000u64 {
//!     x = std::hint::black_box(x.wrapping_mul(31) ^ i);
//! }
//! let report = guard.report()?;
//! let mut table = Vec::new();
//! report.write_top(&mut table, 10)?;
//! assert!(String::from_utf8_lossy(&table).starts_with("Total:"));
//! # Ok(())
//! # }
//! ```

pub mod heap;
mod names;
mod text;

use crate::error::Error;
use crate::format::pprof::{Frame as PprofFrame, Pprof};
use crate::format::Profile;
use crate::session::Summary;
use names::Names;
use std::collections::HashMap;
use std::io::{self, Write};
use std::time::Duration;

/// A profile in memory with every address named: from [`ProfilerGuard::report`],
/// [`ProfilerGuard::snapshot`] or [`Report::parse`].
///
/// [`ProfilerGuard::report`]: crate::ProfilerGuard::report
/// [`ProfilerGuard::snapshot`]: crate::ProfilerGuard::snapshot
pub struct Report {
    raw: Vec<u8>,
    profile: Profile,
    /// One per distinct address of the profile, in order of first appearance.
    frames: Vec<Frame>,
    /// Per sample of `profile.samples`, the indices of its frames, leaf first.
    stacks: Vec<Vec<usize>>,
    summary: Option<Summary>,
}

/// One frame of a sampled stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The address sampled: the interrupted instruction for the innermost frame, the call
    /// instruction (return address minus one) for its callers.
    pub address: u64,
    /// The function containing it, demangled; `object+0xSTART` for a function only the unwind
    /// tables know (START its link-time address), `[object]` for code nothing names in a
    /// mapped object, and the address in hex outside any mapping.
    pub function: String,
    /// The file mapped at the address, if any.
    pub object: Option<String>,
}

/// A sampled stack and how many samples it had.
#[derive(Clone, Copy)]
pub struct Sample<'a> {
    report: &'a Report,
    index: usize,
}

impl<'a> Sample<'a> {
    /// The frames, innermost first.
    pub fn frames(&self) -> impl Iterator<Item = &'a Frame> + 'a {
        let report = self.report;
        report.stacks[self.index].iter().map(move |&i| &report.frames[i])
    }

    /// How many samples had this stack (in this thread, when samples carry threads).
    pub fn count(&self) -> u64 {
        self.report.profile.samples[self.index].count
    }

    /// The thread the samples were taken in, when the profile labels samples with threads
    /// ([`ProfilerBuilder::thread_labels`](crate::ProfilerBuilder::thread_labels), and
    /// wall-clock profiles).
    pub fn thread(&self) -> Option<Thread<'a>> {
        let context = self.report.profile.samples[self.index].context.as_ref()?;
        let contexts = &self.report.profile.maps.contexts;
        Some(Thread {
            id: context.tid,
            name: contexts.thread_names.get(&context.tid).map(String::as_str),
        })
    }
}

/// A thread of the profiled process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thread<'a> {
    /// Its thread id (`gettid`).
    pub id: u32,
    /// Its name (`/proc/self/task/TID/comm`, at most 15 bytes), when it could be read.
    pub name: Option<&'a str>,
}

/// One function's samples: those where it was running (`flat`) and those where it was on
/// the stack (`cumulative`, each sample counted once however often it appears).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionCost {
    /// The function's name, as in [`Frame::function`].
    pub function: String,
    /// Samples in the function itself.
    pub flat: u64,
    /// Samples with the function anywhere on the stack.
    pub cumulative: u64,
}

impl Report {
    /// Reads a raw profile (the gperftools format, as a profile file holds it) and names its
    /// addresses from the files its maps list. Those files are read as they are now: right for
    /// a profile of this process, or of a program whose files have not changed since.
    pub fn parse(raw: Vec<u8>) -> Result<Report, Error> {
        Report::build(raw, None)
    }

    pub(crate) fn build(raw: Vec<u8>, summary: Option<Summary>) -> Result<Report, Error> {
        let profile = Profile::parse(&raw).map_err(|e| Error::Read(e.to_string()))?;
        let mut names = Names::new(profile.maps.clone());
        let mut frames = Vec::new();
        let mut frame_of_address: HashMap<u64, usize> = HashMap::new();
        let stacks = profile
            .samples
            .iter()
            .map(|sample| {
                sample
                    .pcs
                    .iter()
                    .enumerate()
                    .map(|(depth, &pc)| {
                        // A caller's PC is a return address: the call is the byte before.
                        let address = if depth == 0 { pc } else { pc.saturating_sub(1) };
                        *frame_of_address.entry(address).or_insert_with(|| {
                            frames.push(names.frame(address));
                            frames.len() - 1
                        })
                    })
                    .collect()
            })
            .collect();
        Ok(Report {
            raw,
            profile,
            frames,
            stacks,
            summary,
        })
    }

    /// The sampled stacks, each with its count (and thread, when the profile has them).
    pub fn samples(&self) -> impl Iterator<Item = Sample<'_>> + '_ {
        (0..self.stacks.len()).map(move |index| Sample { report: self, index })
    }

    /// Samples in the profile.
    pub fn total_samples(&self) -> u64 {
        self.profile.total_samples()
    }

    /// The time one sample stands for: CPU time, or wall time in a wall-clock profile
    /// (meaningless in an event profile, whose samples stand for [`Report::event`]'s events).
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.profile.period_us)
    }

    /// An event profile's event and the events one sample stands for
    /// ([`ProfilerBuilder::event`](crate::ProfilerBuilder::event)); `None` for time profiles.
    pub fn event(&self) -> Option<&crate::format::EventLine> {
        self.profile.maps.event.as_ref()
    }

    /// What stopping the profile reported (samples taken, evictions, losses); `None` for a
    /// snapshot or a parsed file.
    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    /// Whether every sample is wall-clock time (a wall-clock profile), rather than CPU time.
    pub fn is_wall_clock(&self) -> bool {
        !self.profile.maps.contexts.cpu_profile && self.profile.samples.iter().any(|s| s.context.is_some())
    }

    /// Samples per function, most flat samples first (then most cumulative, then by name).
    pub fn top(&self) -> Vec<FunctionCost> {
        let stacks = self
            .stacks
            .iter()
            .zip(&self.profile.samples)
            .map(|(s, sample)| (s.as_slice(), sample.count));
        function_costs(&self.frames, stacks)
    }

    /// Writes the `n` functions with most flat samples as a table, as `cpuprof top` prints
    /// it (and `pprof -top`): flat and cumulative samples and percentages per function.
    pub fn write_top(&self, out: &mut impl Write, n: usize) -> io::Result<()> {
        text::write_top(out, self, n)
    }

    /// Writes the stacks as folded lines, outermost frame first (`main;parse;read 12`), the
    /// input of flame graph tools. With threads, each stack starts with its thread's name.
    pub fn write_folded(&self, out: &mut impl Write) -> io::Result<()> {
        for line in text::folded_lines(self) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// Writes an SVG flame graph (inferno's), one frame per function.
    #[cfg(feature = "flamegraph")]
    pub fn write_flamegraph(&self, out: &mut impl Write) -> io::Result<()> {
        let lines = text::folded_lines(self);
        let mut options = inferno::flamegraph::Options::default();
        options.count_name = if self.is_wall_clock() {
            "wall samples"
        } else {
            "samples"
        }
        .to_string();
        inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Writes the profile as a gzipped pprof protobuf (`.pb.gz`, for `go tool pprof`,
    /// Pyroscope, speedscope), its locations named as in this report and its samples
    /// labelled with their threads when the profile has them.
    pub fn write_pprof(&self, out: &mut impl Write) -> io::Result<()> {
        let function_at: HashMap<u64, &str> = self.frames.iter().map(|f| (f.address, f.function.as_str())).collect();
        let pprof = Pprof::from_profile(
            &self.profile,
            |address| {
                let function = function_at
                    .get(&address)
                    .map_or_else(|| format!("{address:#x}"), |f| f.to_string());
                vec![PprofFrame {
                    function,
                    ..PprofFrame::default()
                }]
            },
            |_| String::new(),
        );
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&pprof.encode())?;
        gz.finish()?;
        Ok(())
    }

    /// The raw profile, in the gperftools format (what `CPUPROFILE` writes): for
    /// `google-pprof`, `go tool pprof` and the `cpuprof` command.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

/// `amount` per function over `stacks` (frame indices into `frames`, innermost first, each with
/// its amount), most in the function itself first (then most cumulative, then by name):
/// `flat` where it is innermost, `cumulative` where it is anywhere (once per stack). Shared by
/// [`Report::top`] and `HeapReport::top`.
pub(crate) fn function_costs<'a>(
    frames: &[Frame],
    stacks: impl Iterator<Item = (&'a [usize], u64)>,
) -> Vec<FunctionCost> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut costs: Vec<FunctionCost> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    for (stack, amount) in stacks {
        seen.clear();
        for (depth, &frame) in stack.iter().enumerate() {
            let name = frames[frame].function.as_str();
            let i = *index.entry(name).or_insert_with(|| {
                costs.push(FunctionCost {
                    function: name.to_string(),
                    flat: 0,
                    cumulative: 0,
                });
                costs.len() - 1
            });
            if depth == 0 {
                costs[i].flat += amount;
            }
            if !seen.contains(&i) {
                seen.push(i);
                costs[i].cumulative += amount;
            }
        }
    }
    costs.sort_by(|a, b| {
        (b.flat, b.cumulative)
            .cmp(&(a.flat, a.cumulative))
            .then_with(|| a.function.cmp(&b.function))
    });
    costs
}
