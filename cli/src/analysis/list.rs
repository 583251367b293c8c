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
    let seconds = tally.total as f64 * outline.period_us as f64 / 1e6;
    let mut out = format!(
        "Total: {} samples ({seconds:.2} s at {} us per sample)\n",
        tally.total, outline.period_us
    );
    for f in order {
        if args.disasm {
            disassembly(&mut tally, f, &mut out);
        } else {
            source(&mut tally, f, &mut sources, &mut out);
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

/// Function `f`'s lines, file by file, with its source where it can be read.
fn source(tally: &mut Tally, f: u32, sources: &mut Sources, out: &mut String) {
    let mut by_file: HashMap<u32, Vec<(u32, Counts)>> = HashMap::new();
    for (&(function, file, line), &c) in &tally.lines {
        if function == f && line > 0 {
            by_file.entry(file).or_default().push((line, c));
        }
    }
    let no_line = tally
        .lines
        .iter()
        .filter(|(&(function, _, line), _)| function == f && line == 0)
        .fold(Counts::default(), |a, (_, c)| Counts {
            flat: a.flat + c.flat,
            cum: a.cum + c.cum,
        });
    if by_file.is_empty() {
        routine(tally, f, "", out);
        let _ = writeln!(
            out,
            " (no line information: its object has no DWARF line table, e.g. stripped; samples per address below, --disasm shows the instructions)"
        );
        addresses(tally, f, out);
        return;
    }
    let mut files: Vec<(u32, Vec<(u32, Counts)>)> = by_file.into_iter().collect();
    let cum_of = |lines: &[(u32, Counts)]| lines.iter().map(|(_, c)| c.cum).max().unwrap_or(0);
    files.sort_by(|a, b| cum_of(&b.1).cmp(&cum_of(&a.1)).then(a.0.cmp(&b.0)));
    for (i, (file, mut lines)) in files.into_iter().enumerate() {
        lines.sort_unstable_by_key(|&(line, _)| line);
        let path = tally.files.strings()[file as usize].clone();
        if i == 0 {
            routine(tally, f, &format!(" in {path}"), out);
        } else {
            let _ = writeln!(out, " (lines of {path}, inlined into it)");
        }
        let first = lines[0].0.saturating_sub(CONTEXT).max(1);
        let last = lines[lines.len() - 1].0.saturating_add(CONTEXT);
        match sources.get(&path) {
            Ok((read_from, text)) => {
                if read_from.as_path() != Path::new(&path) {
                    let _ = writeln!(out, " (source read from {})", read_from.display());
                }
                let mut counts = lines.iter().peekable();
                for n in first..=last.min(text.len() as u32) {
                    let c = match counts.next_if(|(line, _)| *line == n) {
                        Some(&(_, c)) => c,
                        None => Counts::default(),
                    };
                    let _ = writeln!(
                        out,
                        "{:>10} {:>10} {n:>6}:{}",
                        count(c.flat),
                        count(c.cum),
                        text[n as usize - 1]
                    );
                }
                // Lines past the end of the file read: it is not the source that was built.
                let beyond: Vec<String> = counts.map(|(line, _)| line.to_string()).collect();
                if !beyond.is_empty() {
                    let _ = writeln!(
                        out,
                        " (lines {} have samples but are past the end of {}: a different version of the source?)",
                        beyond.join(", "),
                        read_from.display()
                    );
                }
            }
            Err(why) => {
                let _ = writeln!(out, " (source not available: {why}; samples per line only)");
                for (n, c) in &lines {
                    let _ = writeln!(out, "{:>10} {:>10} {n:>6}:", count(c.flat), count(c.cum));
                }
            }
        }
    }
    if no_line.cum > 0 {
        let _ = writeln!(
            out,
            "{:>10} {:>10}      ?: (code the compiler gave no line)",
            count(no_line.flat),
            count(no_line.cum)
        );
    }
}

/// Samples of `f` per address of its code: link-time addresses in their object (or, when
/// that is not read, the address in the process), laid out as `--disasm` lays them out.
fn addresses(tally: &mut Tally, f: u32, out: &mut String) {
    let mut rows: Vec<(u64, Counts)> = tally
        .addresses
        .iter()
        .filter(|(&(function, _), _)| function == f)
        .map(|(&(_, addr), &c)| (addr, c))
        .collect();
    rows.sort_unstable_by_key(|&(addr, _)| addr);
    for (addr, c) in rows {
        let (at, object) = match tally.symbolizer.svma(tally.maps, addr) {
            Some((path, svma)) => (svma, crate::symbols::file_name(&path).to_string()),
            None => (addr, "(in no object read)".to_string()),
        };
        let _ = writeln!(out, "{:>10} {:>10} {at:>12x}: {object}", count(c.flat), count(c.cum));
    }
}

/// One stretch of a function's code: link-time start, bytes, and the samples at its
/// addresses (link-time).
struct Code {
    object: String,
    start: u64,
    bytes: Vec<u8>,
    samples: Vec<(u64, Counts)>,
}

/// Function `f`'s instructions with the samples at each: the addresses at which it is the
/// outermost frame (its own code, callees inlined into it included).
fn disassembly(tally: &mut Tally, f: u32, out: &mut String) {
    routine(tally, f, "", out);
    let mut samples: Vec<(u64, Counts)> = tally
        .addresses
        .iter()
        .filter(|(&(function, _), _)| function == f)
        .map(|(&(_, addr), &c)| (addr, c))
        .collect();
    samples.sort_unstable_by_key(|&(addr, _)| addr);
    let mut code: Vec<Code> = Vec::new();
    let mut elsewhere = Counts::default();
    for (addr, c) in samples {
        let Some((object, svma)) = tally.symbolizer.svma(tally.maps, addr) else {
            elsewhere = sum(elsewhere, c);
            continue;
        };
        let known = code
            .iter()
            .position(|k| k.object == object && svma >= k.start && svma - k.start < k.bytes.len() as u64);
        let index = match known {
            Some(i) => i,
            None => match tally.symbolizer.function_code(&object, svma, MAX_CODE_BYTES) {
                Some((start, bytes, object::Architecture::X86_64)) if svma - start < bytes.len() as u64 => {
                    code.push(Code {
                        object,
                        start,
                        bytes,
                        samples: Vec::new(),
                    });
                    code.len() - 1
                }
                _ => {
                    elsewhere = sum(elsewhere, c);
                    continue;
                }
            },
        };
        code[index].samples.push((svma, c));
    }
    code.sort_by(|a, b| a.object.cmp(&b.object).then(a.start.cmp(&b.start)));
    let mut shown = Counts::default();
    for stretch in &code {
        let _ = writeln!(
            out,
            " {} at {:#x} ({} bytes)",
            stretch.object,
            stretch.start,
            stretch.bytes.len()
        );
        shown = sum(shown, disassemble(&mut tally.symbolizer, stretch, out));
    }
    if elsewhere.flat + elsewhere.cum > 0 {
        let _ = writeln!(
            out,
            " ({} flat, {} cum samples at addresses whose code could not be read (object missing or not x86-64))",
            elsewhere.flat, elsewhere.cum
        );
    }
    let _ = writeln!(
        out,
        " (the instructions' flat samples add up to {}: the function's own code, callees inlined into it included)",
        shown.flat
    );
}

fn sum(a: Counts, b: Counts) -> Counts {
    Counts {
        flat: a.flat.saturating_add(b.flat),
        cum: a.cum.saturating_add(b.cum),
    }
}

/// Prints the instructions of `code` with their samples (an address inside an instruction,
/// as a return address moved back into its call is, counts for it), each new source line
/// before its first instruction; returns the samples shown.
fn disassemble(symbolizer: &mut Symbolizer, code: &Code, out: &mut String) -> Counts {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
    let mut decoder = Decoder::with_ip(64, &code.bytes, code.start, DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    let (mut text, mut samples, mut shown) = (String::new(), code.samples.iter().peekable(), Counts::default());
    let mut place = String::new();
    for instruction in &mut decoder {
        let (ip, next) = (instruction.ip(), instruction.next_ip());
        let mut c = Counts::default();
        while let Some(&(_, s)) = samples.next_if(|(svma, _)| *svma < next) {
            c = sum(c, s);
        }
        shown = sum(shown, c);
        if let Some(frame) = symbolizer
            .frames_at_svma(&code.object, ip)
            .and_then(|frames| frames.into_iter().next())
            .filter(|frame| frame.line > 0)
        {
            let here = format!("{}:{}", crate::symbols::file_name(&frame.file), frame.line);
            if here != place {
                let _ = writeln!(out, "{:>21} ; {here} ({})", "", frame.function);
                place = here;
            }
        }
        text.clear();
        formatter.format(&instruction, &mut text);
        let _ = writeln!(out, "{:>10} {:>10} {ip:>12x}: {text}", count(c.flat), count(c.cum));
    }
    shown
}

/// Source files by the path DWARF gives, read once each.
struct Sources<'a> {
    args: &'a Args,
    read: HashMap<String, Result<(PathBuf, Vec<String>), String>>,
}

impl<'a> Sources<'a> {
    fn new(args: &'a Args) -> Self {
        Sources {
            args,
            read: HashMap::new(),
        }
    }

    /// The file read for `path` and its lines, or why there is none.
    fn get(&mut self, path: &str) -> Result<&(PathBuf, Vec<String>), &String> {
        if !self.read.contains_key(path) {
            let found = self.find(path);
            self.read.insert(path.to_string(), found);
        }
        self.read[path].as_ref()
    }

    fn find(&self, path: &str) -> Result<(PathBuf, Vec<String>), String> {
        if path.is_empty() {
            return Err("DWARF names no file".to_string());
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some((old, new)) = self
            .args
            .substitutions
            .iter()
            .find(|(old, _)| path.starts_with(old.as_str()))
        {
            candidates.push(PathBuf::from(format!("{new}{}", &path[old.len()..])));
        }
        candidates.push(PathBuf::from(path));
        let parts: Vec<_> = Path::new(path)
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .collect();
        for dir in &self.args.source_dirs {
            for skip in 0..parts.len() {
                candidates.push(parts[skip..].iter().fold(dir.clone(), |p, c| p.join(c)));
            }
        }
        // Why the path DWARF gives could not be read: the first thing a user needs to know.
        let mut why = String::new();
        for candidate in &candidates {
            match read_lines(candidate) {
                Ok(lines) => return Ok((candidate.clone(), lines)),
                Err(e) if candidate.as_path() == Path::new(path) => why = e,
                Err(_) => {}
            }
        }
        let hint = if self.args.source_dirs.is_empty() && self.args.substitutions.is_empty() {
            "; give --source-dir DIR or --substitute OLD=NEW if the tree moved"
        } else {
            "; not found under --source-dir/--substitute either"
        };
        Err(format!("{why}{hint}"))
    }
}

/// The lines of a regular file of at most `MAX_SOURCE_BYTES` (a path from DWARF may name a
/// device or FIFO), or why it is not read.
fn read_lines(path: &Path) -> Result<Vec<String>, String> {
    let (file, size, _) = open_regular(path)?;
    if size > MAX_SOURCE_BYTES {
        return Err(format!("{}: larger than {MAX_SOURCE_BYTES} bytes", path.display()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(|l| l.replace('\t', "    "))
        .collect())
}
