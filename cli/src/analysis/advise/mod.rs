//! `cpuprof advise`: a short ranked list of what could be optimised, each hint with the numbers
//! from the profile behind it. Three kinds:
//!
//! * **growth**: functions whose cumulative time or share grew against a history of profiles,
//!   as `diff --history` judges them (only what it marks significant, with its interval);
//! * **lines**: a function of the program whose self time sits on a few source lines (the
//!   innermost frame, inlined frames expanded, of each sample's interrupted address);
//! * **family**: a known-costly family of library functions ([`FAMILIES`]), with the share of
//!   samples that are in it (counted once per sample) and its main callers in the program.
//!
//! Hints are ranked by the share of all samples at stake: for growth the points the share
//! grew by (or the time, as a share of the usual total), for lines the samples on those lines,
//! for a family the samples in it. Families may overlap (`free` calling `munmap` is both
//! allocation and a system call), so stakes are not summed.

mod families;

pub use families::{Family, FAMILIES};
use families::{SYSTEM_NAMES, SYSTEM_OBJECTS};

use crate::analysis::diff::{self, Report, Row};
use crate::model::stacks::{Counts, Stacks};
use crate::symbols::{file_name, Locator, Symbolizer};
use cpuprof::format::{FastHash, Maps, Profile};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// One frame of a sample's chain.
struct Site {
    name: String,
    file: String,
    line: u64,
    /// In a system object or standard-library code (see [`SYSTEM_OBJECTS`]).
    system: bool,
    /// Bit `i` set: a member of `FAMILIES[i]`.
    families: u32,
}

/// One family's samples and its callers in the program.
pub struct FamilyShare {
    pub family: &'static Family,
    pub samples: u64,
    /// Caller -> samples, `None` where no frame of the program calls the family.
    pub callers: Vec<(Option<String>, u64)>,
    /// Where the family's samples were taken: interrupted function -> samples.
    pub leaves: Vec<(String, u64)>,
}

#[derive(Default)]
struct FamilyTally {
    samples: u64,
    callers: HashMap<Option<String>, u64>,
    leaves: HashMap<String, u64>,
}

/// A profile read for advice: the chains as `top` names them, per-line self samples of the
/// program's functions, and the families.
pub struct Analysis {
    pub stacks: Stacks,
    pub total: u64,
    pub period_us: u64,
    /// Function -> (file, line) -> self samples, for functions of the program.
    lines: HashMap<String, HashMap<(String, u64), u64>>,
    pub families: Vec<FamilyShare>,
    /// The stacks of the samples labelled with each (key, value) (`cpuprof::labels`), for
    /// the report's label picker.
    pub by_label: BTreeMap<(String, String), Stacks>,
}

/// Names the addresses of one profile as `top` does, keeping file, line and object.
struct Sites<'a> {
    symbolizer: Symbolizer,
    maps: &'a Maps,
    cache: HashMap<u64, Rc<Vec<Site>>, FastHash>,
}

impl Sites<'_> {
    /// The frames at `addr`, outermost (caller of inlined code) first.
    fn at(&mut self, addr: u64) -> Rc<Vec<Site>> {
        if let Some(known) = self.cache.get(&addr) {
            return known.clone();
        }
        let object = self.maps.find(addr).map_or("", |m| file_name(&m.path));
        // Code in no mapping is nobody's: not a caller in the program.
        let in_system = object.is_empty() || SYSTEM_OBJECTS.iter().any(|s| object.starts_with(s));
        let mut frames: Vec<(String, String, u64)> = self
            .symbolizer
            .frames(self.maps, addr)
            .into_iter()
            .map(|f| (f.function, f.file, f.line))
            .collect();
        if frames.is_empty() {
            // Unnamed code gets the name `top` gives it.
            frames = self
                .symbolizer
                .functions(self.maps, addr)
                .into_iter()
                .map(|name| (name, String::new(), 0))
                .collect();
        }
        let sites: Vec<Site> = frames
            .into_iter()
            .rev()
            .map(|(name, file, line)| {
                let families = FAMILIES
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.matches(&name, object))
                    .fold(0, |bits, (i, _)| bits | 1 << i);
                Site {
                    system: in_system || SYSTEM_NAMES.iter().any(|p| name.starts_with(p)),
                    name,
                    file,
                    line,
                    families,
                }
            })
            .collect();
        let sites = Rc::new(sites);
        self.cache.insert(addr, sites.clone());
        sites
    }
}

impl Analysis {
    pub fn new(profile: &Profile, locator: &Locator) -> Analysis {
        let mut sites = Sites {
            symbolizer: Symbolizer::new(locator.clone(), &profile.maps),
            maps: &profile.maps,
            cache: HashMap::default(),
        };
        let mut stacks = Stacks::new(profile.period_us);
        stacks.event = profile.maps.event.clone();
        let mut lines: HashMap<String, HashMap<(String, u64), u64>> = HashMap::new();
        let mut families: Vec<FamilyTally> = FAMILIES.iter().map(|_| FamilyTally::default()).collect();
        let mut chain: Vec<Rc<Vec<Site>>> = Vec::new();
        let mut by_label = BTreeMap::new();
        for sample in &profile.samples {
            chain.clear();
            for (i, &pc) in sample.pcs.iter().enumerate().rev() {
                // Return addresses point after the call; look up the call instruction itself.
                chain.push(sites.at(if i == 0 { pc } else { pc.saturating_sub(1) }));
            }
            let frames: Vec<&Site> = chain.iter().flat_map(|s| s.iter()).collect();
            stacks.push(frames.iter().map(|s| s.name.as_str()), sample.count);
            for (key, value) in sample.labels.iter().flat_map(|l| l.iter()) {
                by_label
                    .entry((key.clone(), value.clone()))
                    .or_insert_with(|| Stacks::new(profile.period_us))
                    .push(frames.iter().map(|s| s.name.as_str()), sample.count);
            }
            if let Some(leaf) = frames.last().filter(|s| !s.system && s.line > 0) {
                *lines
                    .entry(leaf.name.clone())
                    .or_default()
                    .entry((leaf.file.clone(), leaf.line))
                    .or_default() += sample.count;
            }
            for (i, tally) in families.iter_mut().enumerate() {
                let bit = 1 << i;
                // The outermost member: what the family's callers called (callbacks it calls
                // back into the program, like qsort's comparison, are inside it).
                let Some(first) = frames.iter().position(|s| s.families & bit != 0) else {
                    continue;
                };
                tally.samples += sample.count;
                if let Some(leaf) = frames.last() {
                    *tally.leaves.entry(leaf.name.clone()).or_default() += sample.count;
                }
                let caller = frames[..first]
                    .iter()
                    .rev()
                    .find(|s| !s.system && s.families & bit == 0)
                    .map(|s| s.name.clone());
                *tally.callers.entry(caller).or_default() += sample.count;
            }
        }
        let families = FAMILIES
            .iter()
            .zip(families)
            .filter(|(_, tally)| tally.samples > 0)
            .map(|(family, tally)| FamilyShare {
                family,
                samples: tally.samples,
                callers: by_count(tally.callers),
                leaves: by_count(tally.leaves),
            })
            .collect();
        Analysis {
            total: stacks.total(),
            period_us: profile.period_us,
            stacks,
            lines,
            families,
            by_label,
        }
    }

    /// The self (flat) and cumulative samples of every function, as `top` counts them.
    fn functions(&self) -> HashMap<&str, Counts> {
        self.stacks.per_function()
    }
}

fn by_count<K: Ord>(map: HashMap<K, u64>) -> Vec<(K, u64)> {
    let mut v: Vec<(K, u64)> = map.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// One hint.
pub enum Hint {
    /// A function that grew against the history (a row `diff --history` marked significant).
    Growth {
        row: Row,
        runs: usize,
        usual_seconds: f64,
    },
    /// Self time of `function` concentrated on `lines` (file, line, samples, source text).
    Lines {
        function: String,
        self_samples: u64,
        lines: Vec<(String, u64, u64, Option<String>)>,
    },
    /// Functions whose time grew significantly but not their share: the run as a whole took
    /// longer (`seconds` against the history's usual `usual_seconds`).
    Slower {
        functions: Vec<String>,
        usual_seconds: f64,
        seconds: f64,
        runs: usize,
    },
    Family(usize),
}

/// The hints, ranked.
pub struct Advice<'a> {
    pub analysis: &'a Analysis,
    pub hints: Vec<(f64, Hint)>,
}

/// A function's self time counts as concentrated when at most this many lines hold at least
/// [`CONCENTRATED`] of it.
const MAX_LINES: usize = 3;
const CONCENTRATED: f64 = 0.5;
/// Fewer self samples than this cannot say which lines are hot (1 of 2 is "50 %").
const MIN_LINE_SAMPLES: u64 = 10;

pub fn advise<'a>(analysis: &'a Analysis, growth: Option<(&Report, usize)>) -> Advice<'a> {
    let total = analysis.total.max(1) as f64;
    let mut hints: Vec<(f64, Hint)> = Vec::new();
    if let Some((report, runs)) = growth {
        // The whole run took longer when a function with all the samples did.
        let whole = report
            .rows
            .iter()
            .any(|r| r.share.before >= 99.0 && r.time.significant && r.time.change() > 0.0);
        let mut slower = Vec::new();
        for row in report.rows.iter().filter(|r| grew(r)) {
            let share_grew = row.share.significant && row.share.change() > 0.0;
            if whole && !share_grew {
                // Its time grew, its share did not: it grew with the whole run.
                slower.push(row);
                continue;
            }
            // At stake: the points of share the growth added, or what its time added to the
            // usual total.
            let stake = if share_grew {
                row.share.change() / 100.0
            } else {
                row.time.change() / report.base_amount.max(f64::MIN_POSITIVE)
            };
            hints.push((
                stake,
                Hint::Growth {
                    row: row.clone(),
                    runs,
                    usual_seconds: report.base_amount,
                },
            ));
        }
        if !slower.is_empty() && report.base_amount > 0.0 {
            // One hint for all of them, at stake what the largest added to the usual total.
            let added = slower.iter().map(|r| r.time.change()).fold(0.0, f64::max);
            hints.push((
                added / report.base_amount,
                Hint::Slower {
                    functions: slower.iter().map(|r| r.function.clone()).collect(),
                    usual_seconds: report.base_amount,
                    seconds: report.new_amount,
                    runs,
                },
            ));
        }
    }
    let functions = analysis.functions();
    for (function, lines) in &analysis.lines {
        let self_samples = functions.get(function.as_str()).map_or(0, |c| c.flat);
        let ranked = by_count(lines.clone());
        let mut held = 0;
        let mut chosen = Vec::new();
        for ((file, line), samples) in ranked.into_iter().take(MAX_LINES) {
            held += samples;
            chosen.push((file.clone(), line, samples, source_line(&file, line)));
            if held as f64 >= CONCENTRATED * self_samples as f64 {
                break;
            }
        }
        if self_samples < MIN_LINE_SAMPLES || (held as f64) < CONCENTRATED * self_samples as f64 {
            continue;
        }
        hints.push((
            held as f64 / total,
            Hint::Lines {
                function: function.clone(),
                self_samples,
                lines: chosen,
            },
        ));
    }
    for (i, family) in analysis.families.iter().enumerate() {
        hints.push((family.samples as f64 / total, Hint::Family(i)));
    }
    hints.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| key(&a.1).cmp(&key(&b.1))));
    Advice { analysis, hints }
}

/// A stable tie-break between hints of equal stake.
fn key(hint: &Hint) -> String {
    match hint {
        Hint::Growth { row, .. } => format!("0{}", row.function),
        Hint::Slower { .. } => "0".to_string(),
        Hint::Lines { function, .. } => format!("1{function}"),
        Hint::Family(i) => format!("2{i}"),
    }
}

fn grew(row: &Row) -> bool {
    (row.share.significant && row.share.change() > 0.0) || (row.time.significant && row.time.change() > 0.0)
}

/// Line `line` of `file`, trimmed, if the file is at hand: shows what the line is.
fn source_line(file: &str, line: u64) -> Option<String> {
    let (f, _, _) = crate::symbols::open_regular(std::path::Path::new(file)).ok()?;
    // A source file beyond 64 MiB is not source.
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(f, 64 << 20), &mut text).ok()?;
    let text = text.lines().nth(usize::try_from(line).ok()?.checked_sub(1)?)?.trim();
    let mut shown: String = text.chars().take(70).collect();
    if shown.len() < text.len() {
        shown.push_str("...");
    }
    Some(shown)
}

/// History options: `diff --history`'s defaults, on cumulative samples.
pub fn diff_options() -> diff::Options {
    diff::Options {
        cumulative: true,
        alpha: 0.001,
        confidence: 0.95,
        rows: 0,
    }
}
