//! `list REGEX PROFILE`: the source of each function whose name matches REGEX, with the samples
//! of each line, flat (the line was running) and cumulative (the line was running or waiting
//! for a call it made), like `pprof -list`; with `--disasm`, the same per instruction.
//!
//! Lines come from DWARF line tables and inline frames, through the symboliser's frames, which
//! give each frame the line *in its own function*: the innermost frame the line of the
//! address, each outer frame the line of its inlined call. So an address in a callee inlined
//! into F counts, in F's listing, on the line of F that called it; in the callee's own listing,
//! on the callee's line. A sample counts flat on the line of its leaf address's innermost
//! frame, and cumulatively, once, on each (function, line) its chain passes through.
//!
//! Memory stays bounded by what is listed: each distinct address is named once, as the other
//! readers do, but only the frames of matching functions are kept, with counts per line and
//! per address of those functions alone.

mod disasm;
mod source;

use disasm::disassembly;
use source::Sources;

use crate::model::filters::Filters;
use crate::model::stacks::Counts;
use crate::render::progress::Progress;
use crate::render::text::percent;
use crate::symbols::{open_regular, Locator, Symbolizer};
use cpuprof::format::Interner;
use cpuprof::format::{scan, FastHash, Maps, Scan};
use regex::Regex;
use std::collections::HashMap;
use std::fmt::Write;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Lines shown before the first and after the last line with samples (as pprof does).
const CONTEXT: u32 = 5;
/// Source files larger than this are not read (a path in DWARF may name anything).
const MAX_SOURCE_BYTES: u64 = 64 << 20;
/// Code disassembled per function at most.
const MAX_CODE_BYTES: u64 = 1 << 20;

#[derive(clap::Args, Clone, Default)]
pub struct Args {
    /// Samples per instruction, with addresses (x86-64 disassembly), instead of per line.
    #[arg(long)]
    pub disasm: bool,
    /// Directory searched for source files missing at the path DWARF names: DIR/<that path>,
    /// then with its leading directories dropped one by one (DIR/src/a.c, DIR/a.c). Repeatable.
    #[arg(long = "source-dir", value_name = "DIR")]
    pub source_dirs: Vec<PathBuf>,
    /// Read sources whose path starts with OLD under NEW instead (a tree built elsewhere or
    /// moved). Repeatable; the first matching OLD wins.
    #[arg(long = "substitute", value_name = "OLD=NEW", value_parser = substitution)]
    pub substitutions: Vec<(String, String)>,
}

fn substitution(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((old, new)) if !old.is_empty() => Ok((old.to_string(), new.to_string())),
        _ => Err(format!("`{text}`: expected OLD=NEW, OLD a path prefix")),
    }
}

/// One frame of an address that belongs to a listed function.
#[derive(Clone, Copy)]
struct Hit {
    function: u32,
    file: u32,
    line: u32,
    /// The address's innermost frame: a leaf address here is flat time of this line.
    innermost: bool,
    /// The address's outermost frame: the function whose code the address is in.
    outermost: bool,
}

/// What is counted for the listed functions.
struct Tally<'a> {
    regex: &'a Regex,
    symbolizer: Symbolizer,
    maps: &'a Maps,
    functions: Interner,
    files: Interner,
    /// Address looked up -> its hits in `hits` (start, length); most addresses have none.
    cache: HashMap<u64, (u32, u32), FastHash>,
    hits: Vec<Hit>,
    /// By function id.
    totals: Vec<Counts>,
    lines: HashMap<(u32, u32, u32), Counts, FastHash>,
    /// (function, address looked up) for addresses in the function's own code.
    addresses: HashMap<(u32, u64), Counts, FastHash>,
    /// All samples of the profile.
    total: u64,
    /// Function names by address, innermost first, when filters need them.
    names: HashMap<u64, Vec<String>, FastHash>,
}

impl<'a> Tally<'a> {
    fn hits(&mut self, addr: u64) -> (u32, u32) {
        if let Some(&known) = self.cache.get(&addr) {
            return known;
        }
        let start = self.hits.len() as u32;
        let frames = self.symbolizer.frames(self.maps, addr);
        let last = frames.len().saturating_sub(1);
        for (i, frame) in frames.iter().enumerate() {
            if !self.regex.is_match(&frame.function) {
                continue;
            }
            self.hits.push(Hit {
                function: self.functions.id(&frame.function),
                file: self.files.id(&frame.file),
                line: u32::try_from(frame.line).unwrap_or(0),
                innermost: i == 0,
                outermost: i == last,
            });
        }
        let known = (start, self.hits.len() as u32 - start);
        self.cache.insert(addr, known);
        known
    }

    /// Whether `filters` keep the sample `pcs` (interrupted PC first): its function names,
    /// outermost first, each address named once.
    fn kept_by(&mut self, filters: &Filters, pcs: &[u64]) -> bool {
        let mut names = Vec::new();
        for (i, &pc) in pcs.iter().enumerate().rev() {
            let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
            let at = self
                .names
                .entry(addr)
                .or_insert_with(|| self.symbolizer.functions(self.maps, addr));
            names.extend(at.iter().rev().cloned());
        }
        filters.frames_kept(&names).is_some()
    }

    /// Counts one record: `pcs` interrupted PC first.
    fn add(&mut self, pcs: &[u64], count: u64, seen: &mut Seen) {
        self.total = self.total.saturating_add(count);
        seen.clear();
        for (i, &pc) in pcs.iter().enumerate() {
            // Return addresses point after the call; look up the call instruction itself.
            let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
            let (start, len) = self.hits(addr);
            for j in start as usize..(start + len) as usize {
                let hit = self.hits[j];
                let line = (hit.function, hit.file, hit.line);
                seen.functions.push(hit.function);
                seen.lines.push(line);
                if hit.outermost {
                    seen.addresses.push((hit.function, addr));
                }
                if i == 0 && hit.innermost {
                    add_flat(self.lines.entry(line).or_default(), count);
                    add_flat(self.totals_of(hit.function), count);
                }
                if i == 0 && hit.outermost {
                    add_flat(self.addresses.entry((hit.function, addr)).or_default(), count);
                }
            }
        }
        // Recursion, or two inlined calls on one line, counts once per sample.
        seen.dedup();
        for &f in &seen.functions {
            add_cum(self.totals_of(f), count);
        }
        for line in &seen.lines {
            add_cum(self.lines.entry(*line).or_default(), count);
        }
        for a in &seen.addresses {
            add_cum(self.addresses.entry(*a).or_default(), count);
        }
    }

    fn totals_of(&mut self, function: u32) -> &mut Counts {
        let f = function as usize;
        if f >= self.totals.len() {
            self.totals.resize(f + 1, Counts::default());
        }
        &mut self.totals[f]
    }
}

fn add_flat(c: &mut Counts, n: u64) {
    c.flat = c.flat.saturating_add(n);
}

fn add_cum(c: &mut Counts, n: u64) {
    c.cum = c.cum.saturating_add(n);
}

/// What one sample touched, reused from record to record.
#[derive(Default)]
struct Seen {
    functions: Vec<u32>,
    lines: Vec<(u32, u32, u32)>,
    addresses: Vec<(u32, u64)>,
}

impl Seen {
    fn clear(&mut self) {
        self.functions.clear();
        self.lines.clear();
        self.addresses.clear();
    }

    fn dedup(&mut self) {
        self.functions.sort_unstable();
        self.functions.dedup();
        self.lines.sort_unstable();
        self.lines.dedup();
        self.addresses.sort_unstable();
        self.addresses.dedup();
    }
}

/// The listing of the functions of the raw profile in `bytes` (whose first pass found
/// `outline`) that match `regex`.
/// `filters` choose the samples counted (`--focus`, `--ignore`, `--show`, `--hide`: a sample
/// is counted if they keep any of its frames); percentages stay of the whole profile.
pub fn list(
    bytes: &[u8],
    outline: &Scan,
    locator: &Locator,
    regex: &Regex,
    args: &Args,
    filters: &Filters,
) -> Result<String, String> {
    let mut tally = Tally {
        regex,
        symbolizer: Symbolizer::new(locator.clone(), &outline.maps),
        maps: &outline.maps,
        functions: Interner::default(),
        files: Interner::default(),
        cache: HashMap::default(),
        hits: Vec::new(),
        totals: Vec::new(),
        lines: HashMap::default(),
        addresses: HashMap::default(),
        total: 0,
        names: HashMap::default(),
    };
    let mut progress = Progress::new("reading", outline.records);
    let (mut pcs, mut seen, mut done) = (Vec::new(), Seen::default(), 0);
    // The first pass already reported any defect; records before it are read.
    let _ = scan(bytes, |record| {
        progress.update(done);
        done += 1;
        record.pcs_into(&mut pcs);
        if filters.active() && !tally.kept_by(filters, &pcs) {
            tally.total = tally.total.saturating_add(record.count);
            return;
        }
        tally.add(&pcs, record.count, &mut seen);
    });
    drop(progress);
    if tally.totals.iter().all(|c| c.cum == 0) {
        return Err(format!("no function with samples matches `{regex}`"));
    }
    let mut order: Vec<u32> = (0..tally.totals.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (tally.totals[a as usize], tally.totals[b as usize]);
        (cb.cum, cb.flat)
            .cmp(&(ca.cum, ca.flat))
            .then_with(|| tally.functions.strings()[a as usize].cmp(&tally.functions.strings()[b as usize]))
    });
    let mut sources = Sources::new(args);
    let mut out = crate::render::text::total_line(tally.total, outline.period_us, outline.maps.event.as_ref());
    for f in order {
        if args.disasm {
            disassembly(&mut tally, f, &mut out);
        } else {
            source::source(&mut tally, f, &mut sources, &mut out);
        }
    }
    Ok(out)
}

fn count(n: u64) -> String {
    if n == 0 {
        ".".to_string()
    } else {
        n.to_string()
    }
}

fn routine(tally: &Tally, f: u32, place: &str, out: &mut String) {
    let c = tally.totals[f as usize];
    let _ = writeln!(
        out,
        "ROUTINE ======================== {}{place}\n{:>10} {:>10} (flat, cum) {:.2}% of Total",
        tally.functions.strings()[f as usize],
        c.flat,
        c.cum,
        percent(c.cum, tally.total)
    );
}
