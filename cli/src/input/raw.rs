//! Reading profiles that end early. A process killed by `SIGKILL`, ended by `_exit`, or whose
//! profiling signal the application took over leaves the records written so far and no
//! trailer or maps, sometimes ending inside a record. Such a file is read up to the cut; the
//! missing maps are rebuilt from the program's executable when one is known, and the reader
//! prints one warning naming what is missing and how the addresses were placed.
//!
//! Which executable: the one given with `--binary`, else a file beside the profile whose name
//! the profile's starts with (`app` for `app.prof` or `app.prof_1234`). Where a position-
//! independent executable was loaded is not in the file either; it is found from the stacks:
//! the return addresses that follow a direct call in the executable all agree on one load
//! address, which a wrong binary or a wrong guess do not (see [`place`]).

use crate::error::{Error, Result};
use crate::input::Source;
use crate::symbols::{open_regular, Locator};
use cpuprof::format::{FastHash, MapEntry, Maps, ParseError, ParseErrorKind, Profile, ReadContext, Scan};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Deeper than any stack a profiler writes (gperftools stops at 254 frames, cpuprof at its
/// configured maximum, well below this): a record claiming more is damage, not a cut.
const MAX_PLAUSIBLE_DEPTH: u64 = 1 << 16;

/// Return addresses of the program that must agree on one load address before it is used
/// (or all of them, if the profile holds fewer).
const MIN_AGREEING: usize = 2;

const PAGE: u64 = 4096;

/// Parses `bytes`, read from `file`: a complete profile as it is, a cut-short one with one
/// warning on stderr. Damage that is not a cut (a zero count in the middle, a depth no stack
/// has) stays an error, as does a bad header.
pub fn read(file: &Path, bytes: &[u8], locator: &Locator) -> Result<Profile> {
    read_source(file, &Source::bytes(bytes), locator)
}

/// [`read`] of a profile in a file (not read into memory: see [`Source`]).
pub fn read_file(file: &Path, locator: &Locator) -> Result<Profile> {
    read_source(file, &Source::open(file)?, locator)
}

/// [`read`] of `source`, named `file`.
pub fn read_source(file: &Path, source: &Source, locator: &Locator) -> Result<Profile> {
    not_empty(file, source)?;
    let (mut profile, defect) = source
        .parse_lenient()?
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let mut outline = Scan {
        format: profile.format,
        period_us: profile.period_us,
        records: profile.records,
        total: profile.total_samples(),
        maps: std::mem::take(&mut profile.maps),
    };
    complete(file, source, locator, &mut outline, defect)?;
    profile.maps = outline.maps;
    Ok(profile)
}

/// The same checks and warning as [`read`], from one pass over the records that keeps none of
/// them: what a reader that then aggregates the records as it reads them needs (the period,
/// how many records, and the maps, rebuilt if missing).
pub fn outline(file: &Path, bytes: &[u8], locator: &Locator) -> Result<Scan> {
    outline_source(file, &Source::bytes(bytes), locator)
}

/// [`outline`] of `source`, named `file`.
pub fn outline_source(file: &Path, source: &Source, locator: &Locator) -> Result<Scan> {
    not_empty(file, source)?;
    let (mut outline, defect) = source.scan(|_| {})?.map_err(|e| format!("{}: {e}", file.display()))?;
    complete(file, source, locator, &mut outline, defect)?;
    Ok(outline)
}

/// What `check` says of a raw profile: what one pass over it found (the maps at the end,
/// or the defect that ended it) and how many distinct chains (per thread and state, in a
/// wall-clock profile) its records hold, counted as [`Profile::parse`] merges them but without
/// building the profile: each distinct chain is kept once, as slots in one array.
pub struct Summary {
    pub scan: Scan,
    pub distinct: usize,
}

/// [`Summary`] of `source`: `Ok(Err(..))` when it is not a complete profile, with what the
/// records before the defect held (none for a bad header). `Err` only when it cannot be read.
#[allow(clippy::type_complexity)]
pub fn summary(source: &Source) -> Result<std::result::Result<Summary, (ParseError, Option<Scan>)>> {
    let mut chains = ChainSet::default();
    let mut pcs = Vec::new();
    let (read, defect) = match source.scan(|record| {
        record.pcs_into(&mut pcs);
        chains.insert(&pcs);
    })? {
        Ok(read) => read,
        Err(e) => return Ok(Err((e, None))),
    };
    if let Some(e) = defect {
        return Ok(Err((e, Some(read))));
    }
    if !read.maps.contexts.is_empty() {
        // A wall-clock profile: chains are told apart by their context too (none is a
        // context of its own), which a second pass can give them now the contexts are known.
        chains = ChainSet::default();
        let mut ids: HashMap<&ReadContext, u64> = HashMap::new();
        let contexts = &read.maps.contexts;
        let mut ordinal = 0;
        let _ = source.scan(|record| {
            pcs.clear();
            pcs.push(match contexts.of(ordinal) {
                Some(context) => {
                    let next = ids.len() as u64 + 1;
                    *ids.entry(context).or_insert(next)
                }
                None => 0,
            });
            ordinal += 1;
            pcs.extend(record.pcs());
            chains.insert(&pcs);
        })?;
    }
    Ok(Ok(Summary {
        distinct: chains.ends.len(),
        scan: read,
    }))
}

/// Distinct chains, each kept once: their slots one after another in `words`, where each
/// ends in `ends`, and an open-addressing index of them at most half full (`u32::MAX` for an
/// empty slot). About 12 bytes per chain besides its slots.
#[derive(Default)]
pub struct ChainSet {
    words: Vec<u64>,
    ends: Vec<usize>,
    slots: Vec<u32>,
    hash: FastHash,
}

impl ChainSet {
    /// The `i`th distinct chain, in the order they were first added.
    pub fn chain(&self, i: usize) -> &[u64] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.words[start..self.ends[i]]
    }

    fn slot_of(&self, chain: &[u64]) -> usize {
        let mask = self.slots.len() - 1;
        let mut at = self.hash.hash_one(chain) as usize & mask;
        loop {
            match self.slots[at] {
                u32::MAX => return at,
                i if self.chain(i as usize) == chain => return at,
                _ => at = (at + 1) & mask,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Drops the index: no chain will be added any more.
    pub fn freeze(&mut self) {
        self.slots = Vec::new();
    }

    /// Adds `chain` if it is new; returns its number.
    pub fn insert(&mut self, chain: &[u64]) -> usize {
        if 2 * (self.ends.len() + 1) > self.slots.len() {
            let mut slots = vec![u32::MAX; (2 * self.slots.len()).max(1024)];
            std::mem::swap(&mut slots, &mut self.slots);
            for i in 0..self.ends.len() {
                let at = self.slot_of(self.chain(i));
                self.slots[at] = i as u32;
            }
        }
        let at = self.slot_of(chain);
        if self.slots[at] == u32::MAX {
            self.slots[at] = self.ends.len() as u32;
            self.words.extend_from_slice(chain);
            self.ends.push(self.words.len());
        }
        self.slots[at] as usize
    }
}

/// Whether `source` is something to read as a raw profile: not empty, and not a heap profile
/// (which the commands reading stacks take, through [`crate::input::heap`]).
fn not_empty(file: &Path, source: &Source) -> Result<()> {
    if crate::input::heap::is_heap(source)? {
        return Err(crate::input::heap::not_for_heap(file));
    }
    if crate::input::contention::is_contention(source)? {
        return Err(crate::input::contention::not_for_contention(file));
    }
    if source.len()? == 0 {
        return Err(format!(
            "{}: empty: the process ended before the profiler wrote anything (gperftools writes nothing until its 2 MiB buffer fills or it stops; cpuprof writes its first records after one second)",
            file.display()
        ).into());
    }
    Ok(())
}

/// Judges the defect that ended the reading of `source` (a cut is read up to it with a
/// warning, other damage is an error) and rebuilds missing maps into `outline`.
fn complete(
    file: &Path,
    source: &Source,
    locator: &Locator,
    outline: &mut Scan,
    defect: Option<ParseError>,
) -> Result<()> {
    let mut missing = Vec::new();
    if let Some(defect) = &defect {
        let last_record = match defect.kind {
            // Fewer than two slots after the last whole record: part of a count or depth.
            ParseErrorKind::MissingTrailer => {
                let partial = source.read_at(defect.offset as u64, 2 * outline.format.size)?.len();
                (partial > 0).then(|| format!("the end of the last record (only {partial} bytes of it are there)"))
            }
            ParseErrorKind::TruncatedRecord { depth, slots_left } if depth <= MAX_PLAUSIBLE_DEPTH => {
                // Its count and depth are there; count 0 is the trailer itself, cut. A chain
                // that is not whole is left out rather than charged to a stack without callers.
                let count = outline
                    .format
                    .get(&source.read_at(defect.offset as u64, outline.format.size)?);
                (count > 0).then(|| {
                    format!(
                        "the end of the last record ({slots_left} of its {depth} program counters are there; its {count} samples are not counted)"
                    )
                })
            }
            _ => return Err(format!("{}: {defect}", file.display()).into()),
        };
        missing.push("the trailer".to_string());
        missing.push("the maps".to_string());
        missing.extend(last_record);
    } else if outline.maps.entries.is_empty() {
        missing.push("the maps".to_string());
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut warning = format!(
        "{} is cut short (the process ended without stopping the profiler: SIGKILL, _exit, or a taken-over signal); read {} records, {} samples; missing {}.",
        file.display(),
        outline.records,
        outline.total,
        join(&missing)
    );
    // Without samples there are no addresses to place.
    if outline.maps.entries.is_empty() && outline.total > 0 {
        match rebuild_maps(file, source, locator) {
            Ok((maps, how)) => {
                outline.maps = maps;
                warning.push_str(&format!(" {how}; shared libraries stay unsymbolised."));
            }
            Err(why) => warning.push_str(&format!(
                " {why}: addresses stay unsymbolised; pass --binary PROGRAM (the executable that wrote the profile) to name its functions."
            )),
        }
    }
    eprintln!("cpuprof: warning: {warning}");
    Ok(())
}

fn join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [first, second] => format!("{first} and {second}"),
        [init @ .., last] => format!("{}, and {last}", init.join(", ")),
    }
}

/// Maps for a profile that has none (its records are in `bytes`): the executable's segments
/// where the stacks place them. Returns the maps and a sentence saying what was used; or why
/// nothing was.
fn rebuild_maps(file: &Path, source: &Source, locator: &Locator) -> Result<(Maps, String)> {
    let (binary, named_by) = match locator.binaries.first() {
        Some(b) => (b.clone(), "given with --binary"),
        None => (
            beside(file).ok_or_else(|| {
                Error::Input("No maps, and no executable given with --binary or found beside the profile".to_string())
            })?,
            "found beside the profile",
        ),
    };
    let (file_data, inode) = read_executable(&binary)?;
    let elf = Elf::parse(&file_data).ok_or_else(|| format!("{} is not an ELF executable", binary.display()))?;
    let bias = place(&elf, source)?.ok_or_else(|| {
        format!(
            "The stacks do not fit {} ({named_by}): it is not the program that wrote this profile, or was rebuilt since",
            binary.display()
        )
    })?;
    let path = std::fs::canonicalize(&binary).unwrap_or(binary.clone());
    let path = path.to_string_lossy().into_owned();
    let entries = elf
        .segments
        .iter()
        .map(|s| {
            let start = (bias.wrapping_add(s.vaddr)) & !(PAGE - 1);
            let end = bias.wrapping_add(s.vaddr).wrapping_add(s.memsz).next_multiple_of(PAGE);
            MapEntry {
                start,
                end,
                perms: format!(
                    "{}{}{}p",
                    if s.read { 'r' } else { '-' },
                    if s.write { 'w' } else { '-' },
                    if s.exec { 'x' } else { '-' }
                ),
                offset: s.offset & !(PAGE - 1),
                inode,
                path: path.clone(),
                build_id: None,
            }
        })
        .collect();
    Ok((
        Maps {
            entries,
            ..Maps::default()
        },
        format!("Using the maps of {path} ({named_by}), loaded at {bias:#x}"),
    ))
}

fn read_executable(path: &Path) -> Result<(Vec<u8>, u64)> {
    let (file, size, (_, inode)) = open_regular(path)?;
    let mut data = Vec::new();
    file.take(size)
        .read_to_end(&mut data)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((data, inode))
}

/// An executable beside `profile` whose name its name starts with, followed by `.` or `_`
/// (`app` for `app.prof`, `app.prof_1234`, `app_1234`), the longest such name first.
fn beside(profile: &Path) -> Option<PathBuf> {
    let dir = profile
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = profile.file_name()?.to_str()?;
    let mut cut: Vec<usize> = name.match_indices(['.', '_']).map(|(i, _)| i).collect();
    cut.reverse();
    cut.into_iter()
        .map(|i| dir.join(&name[..i]))
        .find(|candidate| std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

struct Segment {
    vaddr: u64,
    memsz: u64,
    offset: u64,
    read: bool,
    write: bool,
    exec: bool,
}

/// What placing an executable needs: its loadable segments, whether it is position-
/// independent, and the link-time return addresses of its direct calls to its functions.
struct Elf {
    segments: Vec<Segment>,
    position_independent: bool,
    call_returns: HashSet<u64>,
}

impl Elf {
    fn parse(data: &[u8]) -> Option<Elf> {
        let file = object::File::parse(data).ok()?;
        let position_independent = match file.kind() {
            object::ObjectKind::Executable => false,
            object::ObjectKind::Dynamic => true,
            _ => return None,
        };
        let mut segments = Vec::new();
        for s in file.segments() {
            let object::SegmentFlags::Elf { p_flags } = s.flags() else {
                continue;
            };
            segments.push(Segment {
                vaddr: s.address(),
                memsz: s.size(),
                offset: s.file_range().0,
                read: p_flags & object::elf::PF_R != 0,
                write: p_flags & object::elf::PF_W != 0,
                exec: p_flags & object::elf::PF_X != 0,
            });
        }
        let functions: HashSet<u64> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .map(|s| s.address())
            .collect();
        let mut call_returns = HashSet::new();
        for s in file.segments() {
            let object::SegmentFlags::Elf { p_flags } = s.flags() else {
                continue;
            };
            let Ok(code) = s.data() else { continue };
            if p_flags & object::elf::PF_X == 0 {
                continue;
            }
            // x86-64 `call rel32`: e8 and a 4-byte displacement from the next instruction.
            for (i, window) in code.windows(5).enumerate() {
                if window[0] != 0xe8 {
                    continue;
                }
                let next = s.address() + i as u64 + 5;
                let rel = i32::from_le_bytes([window[1], window[2], window[3], window[4]]);
                if functions.contains(&next.wrapping_add_signed(i64::from(rel))) {
                    call_returns.insert(next);
                }
            }
        }
        Some(Elf {
            segments,
            position_independent,
            call_returns,
        })
    }
}

/// The load bias (run-time address minus link-time address) that makes the profile's return
/// addresses land just after direct calls of the executable: the bias most of them agree on,
/// if at least [`MIN_AGREEING`] do (or every return address there is). A fixed-address
/// executable has bias 0, which is checked the same way.
fn place(elf: &Elf, source: &Source) -> Result<Option<u64>> {
    let mut returns: HashSet<u64> = HashSet::new();
    // The records before the cut; the cut itself was judged by the caller.
    let _ = source.scan(|record| returns.extend(record.pcs().skip(1)))?;
    let mut votes: HashMap<u64, usize> = HashMap::new();
    if elf.position_independent {
        // A bias is page-aligned, so a return address and its link-time address share their
        // offset in the page: only those pairs are candidates.
        let mut by_page_offset: HashMap<u64, Vec<u64>> = HashMap::new();
        for &r in &elf.call_returns {
            by_page_offset.entry(r % PAGE).or_default().push(r);
        }
        for &ra in &returns {
            for &r in by_page_offset.get(&(ra % PAGE)).map_or(&[][..], |v| v) {
                if let Some(bias) = ra.checked_sub(r).filter(|&b| b != 0) {
                    *votes.entry(bias).or_default() += 1;
                }
            }
        }
    } else {
        let agreeing = returns.iter().filter(|ra| elf.call_returns.contains(ra)).count();
        votes.insert(0, agreeing);
    }
    let Some((&bias, &count)) = votes
        .iter()
        .max_by_key(|&(&bias, &count)| (count, std::cmp::Reverse(bias)))
    else {
        return Ok(None);
    };
    Ok((count >= MIN_AGREEING.min(returns.len()).max(1)).then_some(bias))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beside_the_profile_are_tried_longest_first() {
        let dir = std::env::temp_dir().join(format!("cpuprof-beside-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("app");
        std::fs::copy("/bin/true", &exe).unwrap();
        assert_eq!(beside(&dir.join("app.prof_1234")), Some(exe.clone()));
        assert_eq!(beside(&dir.join("app_99")), Some(exe.clone()));
        assert_eq!(beside(&dir.join("application.prof")), None);
        assert_eq!(beside(&dir.join("other.prof")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn join_lists_like_a_sentence() {
        let items: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(join(&items[..1]), "a");
        assert_eq!(join(&items[..2]), "a and b");
        assert_eq!(join(&items), "a, b, and c");
    }
}
