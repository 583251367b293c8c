//! A profile as symbolised call chains: what `top`, `collapse`, `flamegraph` and `diff` read.
//!
//! A raw profile is read in one pass over its records as they lie in the file, without
//! materialising them: each distinct address is symbolised once (its function ids cached),
//! each function name is stored once and chains are lists of name ids. `top` needs only
//! per-function sums, which [`Functions::read`] adds up record by record, keeping nothing
//! else; the other reports need the chains, which [`Stacks::read`] keeps once each, identical
//! chains summed through a fast hash. A record costs no allocation. The `--focus/--ignore/
//! --hide/--show` filters apply to each chain before it is summed (see [`crate::model::filters`]).
//!
//! Counts are CPU samples, or a heap profile's bytes or objects ([`Unit`]): a heap record is a
//! chain like a CPU record, weighing its scaled value instead of a count of samples.

use crate::error::Result;
use crate::input::Source;
use crate::model::filters::{Filtering, Filters};
use crate::model::unit::Unit;
use crate::render::progress::Progress;
use crate::symbols::{Locator, Symbolizer};
use cpuprof::format::{EventLine, FastHash, Interner, Maps, Profile, ReadContext, Scan, StateKind};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

pub struct Stacks {
    /// Microseconds per sample (0 for a heap profile, whose counts are bytes or objects); in
    /// an event profile, events per sample.
    pub period_us: u64,
    /// An event profile's event: the samples count it rather than CPU time.
    pub event: Option<EventLine>,
    /// What the counts measure.
    pub unit: Unit,
    names: Interner,
    /// The chains' name ids, outermost caller first (inlined frames expanded), one chain
    /// after another.
    frames: Vec<u32>,
    /// Each distinct chain: where it ends in `frames` (it starts where the one before ends)
    /// and its samples.
    chains: Vec<(usize, u64)>,
    /// Open-addressing index of `chains`, at most half full: each slot is `EMPTY` or a chain's
    /// index (low 32 bits) under the top 32 bits of its hash, which place it (the table
    /// indexes by the hash's top bits) and tell most other chains apart without reading
    /// them. Chains are compared in place, so none is stored twice.
    slots: Vec<u64>,
    hash: FastHash,
    /// Samples the filters dropped: still part of the total, which percentages are of.
    removed: u64,
    /// Whether filters were applied.
    filtered: bool,
}

const EMPTY: u64 = u64::MAX;

/// Flat (self) and cumulative samples of one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub flat: u64,
    pub cum: u64,
}

/// How a function's cumulative samples of a wall-clock profile divide by thread state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateSplit {
    pub on_cpu: u64,
    pub runnable: u64,
    pub blocked: u64,
    /// Blocked samples by the system call waited in (`fault` for none).
    pub blocked_in: BTreeMap<String, u64>,
}

impl StateSplit {
    fn add(&mut self, context: &ReadContext, count: u64) {
        match context.kind() {
            StateKind::OnCpu => self.on_cpu = self.on_cpu.saturating_add(count),
            StateKind::Runnable => self.runnable = self.runnable.saturating_add(count),
            StateKind::Blocked => {
                self.blocked = self.blocked.saturating_add(count);
                let call = context.syscall().unwrap_or(&context.state);
                let n = self.blocked_in.entry(call.to_string()).or_default();
                *n = n.saturating_add(count);
            }
        }
    }

    /// The system call most of the blocked samples waited in.
    pub fn main_wait(&self) -> Option<&str> {
        let (call, _) = self
            .blocked_in
            .iter()
            .max_by_key(|(call, n)| (**n, std::cmp::Reverse(*call)))?;
        Some(call)
    }
}

/// Names the addresses of one profile, each distinct address once.
struct Addresses<'a> {
    symbolizer: Symbolizer,
    maps: &'a Maps,
    /// Address (already moved into the call instruction for return addresses) -> where its
    /// name ids are in `ids`, innermost inlined frame last.
    cache: HashMap<u64, (u32, u32), FastHash>,
    ids: Vec<u32>,
}

impl<'a> Addresses<'a> {
    fn new(maps: &'a Maps, locator: &Locator) -> Self {
        Addresses {
            symbolizer: Symbolizer::new(locator.clone(), maps),
            maps,
            cache: HashMap::default(),
            ids: Vec::new(),
        }
    }

    /// The name ids of the chain `pcs` (interrupted PC first) into `out`, outermost caller
    /// first.
    fn chain(&mut self, names: &mut Interner, pcs: &[u64], out: &mut Vec<u32>) {
        out.clear();
        for (i, &pc) in pcs.iter().enumerate().rev() {
            // Return addresses point after the call; look up the call instruction itself.
            let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
            let (start, len) = match self.cache.get(&addr) {
                Some(&known) => known,
                None => {
                    let start = self.ids.len() as u32;
                    for name in self.symbolizer.functions(self.maps, addr).into_iter().rev() {
                        self.ids.push(names.id(name));
                    }
                    let known = (start, self.ids.len() as u32 - start);
                    self.cache.insert(addr, known);
                    known
                }
            };
            out.extend_from_slice(&self.ids[start as usize..(start + len) as usize]);
        }
    }
}

/// Reads the records of the raw profile in `bytes`, whose first pass (`cut_short::outline`)
/// found `outline` (its maps, perhaps rebuilt), handing `add` each record's chain of name ids
/// (outermost caller first) and count as `filters` leave it. Records past a defect are not
/// read, as that pass reported. Returns the samples the filters dropped.
fn read_chains(
    source: &Source,
    outline: &Scan,
    locator: &Locator,
    filters: &Filters,
    names: &mut Interner,
    mut add: impl FnMut(&[u32], u64, Option<&ReadContext>),
) -> Result<u64> {
    let mut addresses = Addresses::new(&outline.maps, locator);
    let mut filtering = Filtering::new(filters);
    let mut progress = Progress::new("reading", outline.records);
    let (mut pcs, mut chain, mut done, mut removed) = (Vec::new(), Vec::new(), 0, 0u64);
    // The outcome of this second pass (the same records, up to the same defect) is already
    // known from the first.
    let _ = source.scan(|record| {
        progress.update(done);
        let context = outline.maps.contexts.of(done as u64);
        let labels = outline.maps.labels.of(done as u64);
        done += 1;
        if !filters.keeps_labels(labels.map(|l| &l[..])) {
            removed = removed.saturating_add(record.count);
            return;
        }
        record.pcs_into(&mut pcs);
        addresses.chain(names, &pcs, &mut chain);
        match filtering.apply(&chain, names.strings()) {
            Some(kept) => add(kept, record.count, context),
            None => removed = removed.saturating_add(record.count),
        }
    })?;
    Ok(removed)
}

/// Flat and cumulative samples per function, summed chain by chain.
#[derive(Default)]
struct Tally {
    counts: Vec<Counts>,
    /// The number of the last chain each function was counted in, so recursion counts once.
    counted_in: Vec<u64>,
    chains: u64,
    total: u64,
    /// Wall-clock profiles: each function's samples by thread state.
    states: Vec<StateSplit>,
}

impl Tally {
    fn add(&mut self, chain: &[u32], count: u64, context: Option<&ReadContext>) {
        self.chains += 1;
        // Sums saturate: a parsed profile's total fits in a u64, but DCPI files are summed
        // across files.
        self.total = self.total.saturating_add(count);
        for &id in chain {
            let id = id as usize;
            if id >= self.counts.len() {
                self.counts.resize(id + 1, Counts::default());
                self.counted_in.resize(id + 1, 0);
            }
            if self.counted_in[id] != self.chains {
                self.counted_in[id] = self.chains;
                self.counts[id].cum = self.counts[id].cum.saturating_add(count);
                if let Some(context) = context {
                    if id >= self.states.len() {
                        self.states.resize(id + 1, StateSplit::default());
                    }
                    self.states[id].add(context, count);
                }
            }
        }
        if let Some(&leaf) = chain.last() {
            let leaf = &mut self.counts[leaf as usize];
            leaf.flat = leaf.flat.saturating_add(count);
        }
    }
}

/// What `top` shows: each function's flat and cumulative samples, and the total.
pub struct Functions {
    pub period_us: u64,
    /// An event profile's event: the samples count it rather than CPU time.
    pub event: Option<EventLine>,
    /// What the counts measure.
    pub unit: Unit,
    /// All samples, those the filters dropped included (pprof's percentages are of these).
    pub total: u64,
    /// With filters: the samples they kept.
    pub kept: Option<u64>,
    pub counts: Vec<(String, Counts)>,
    /// Wall-clock profiles (whose samples carry thread states): each function's split, by
    /// the index of its row in `counts`.
    pub states: Option<Vec<StateSplit>>,
}

impl Functions {
    /// Sums the records of the raw profile in `bytes` per function as they are read (see
    /// [`Stacks::read`] for `outline`), as `filters` leave them; no chain is kept.
    pub fn read(bytes: &[u8], outline: &Scan, locator: &Locator, filters: &Filters) -> Functions {
        Self::read_source(&Source::bytes(bytes), outline, locator, filters).expect("bytes in memory are read whole")
    }

    /// [`Functions::read`] of `source` (a file is read again, through a window).
    pub fn read_source(source: &Source, outline: &Scan, locator: &Locator, filters: &Filters) -> Result<Functions> {
        let (mut names, mut tally) = (Interner::default(), Tally::default());
        let removed = read_chains(
            source,
            outline,
            locator,
            filters,
            &mut names,
            |chain, count, context| tally.add(chain, count, context),
        )?;
        // Thread labels of a CPU profile say nothing of states: every sample is on the CPU.
        let has_states = !outline.maps.contexts.is_empty() && !outline.maps.contexts.cpu_profile;
        let mut functions = Functions::new(
            outline.period_us,
            Unit::Samples,
            names,
            tally,
            removed,
            filters.active(),
            has_states,
        );
        functions.event = outline.maps.event.clone();
        Ok(functions)
    }

    fn new(
        period_us: u64,
        unit: Unit,
        names: Interner,
        mut tally: Tally,
        removed: u64,
        filtered: bool,
        has_states: bool,
    ) -> Functions {
        // A name met only in chains of no samples (DCPI) still gets its (zero) row; one met
        // only in frames the filters dropped or hid does not, as in pprof.
        tally.counts.resize(names.len(), Counts::default());
        tally.states.resize(names.len(), StateSplit::default());
        let (counts, states): (Vec<_>, Vec<_>) = names
            .into_strings()
            .into_iter()
            .zip(tally.counts)
            .zip(tally.states)
            .filter(|((_, c), _)| !filtered || c.cum > 0)
            .unzip();
        Functions {
            period_us,
            event: None,
            unit,
            total: tally.total.saturating_add(removed),
            kept: filtered.then_some(tally.total),
            counts,
            states: has_states.then_some(states),
        }
    }
}

impl Stacks {
    pub fn new(period_us: u64) -> Stacks {
        Stacks {
            period_us,
            event: None,
            unit: Unit::Samples,
            names: Interner::default(),
            frames: Vec::new(),
            chains: Vec::new(),
            slots: Vec::new(),
            hash: FastHash::default(),
            removed: 0,
            filtered: false,
        }
    }

    /// Reads the records of the raw profile in `bytes`, whose first pass (`cut_short::outline`)
    /// found `outline`: its period and its maps (perhaps rebuilt), as `filters` leave them.
    /// Records past a defect are not read, as that pass reported.
    #[cfg(test)]
    pub fn read(bytes: &[u8], outline: &Scan, locator: &Locator, filters: &Filters) -> Stacks {
        Self::read_source(&Source::bytes(bytes), outline, locator, filters).expect("bytes in memory are read whole")
    }

    /// [`Stacks::read`] of `source` (a file is read again, through a window).
    pub fn read_source(source: &Source, outline: &Scan, locator: &Locator, filters: &Filters) -> Result<Stacks> {
        let mut stacks = Stacks::new(outline.period_us);
        stacks.event = outline.maps.event.clone();
        let mut names = std::mem::take(&mut stacks.names);
        stacks.removed = read_chains(source, outline, locator, filters, &mut names, |chain, count, _| {
            stacks.add(chain, count)
        })?;
        stacks.names = names;
        stacks.filtered = filters.active();
        Ok(stacks)
    }

    /// These chains as `filters` leave them (for stacks not read by [`Stacks::read`]: parsed
    /// or DCPI profiles).
    pub fn filter(self, filters: &Filters) -> Stacks {
        if !filters.active() {
            return self;
        }
        let mut out = Stacks::new(self.period_us);
        out.unit = self.unit;
        out.event = self.event.clone();
        out.names = self.names.clone();
        out.removed = self.removed;
        out.filtered = true;
        let mut filtering = Filtering::new(filters);
        for (chain, count) in self.chains() {
            match filtering.apply(chain, self.names.strings()) {
                Some(kept) => out.add(kept, count),
                None => out.removed = out.removed.saturating_add(count),
            }
        }
        out
    }

    /// Each distinct chain of name ids (outermost caller first) with its samples.
    pub fn chains(&self) -> impl Iterator<Item = (&[u32], u64)> {
        (0..self.chains.len()).map(|i| (self.chain(i), self.chains[i].1))
    }

    /// Function names by id.
    pub fn names(&self) -> &[String] {
        self.names.strings()
    }

    /// The chains of a parsed profile, symbolised.
    pub fn symbolise(profile: &Profile, locator: &Locator) -> Stacks {
        let mut stacks = Stacks::new(profile.period_us);
        stacks.event = profile.maps.event.clone();
        let mut addresses = Addresses::new(&profile.maps, locator);
        let mut progress = Progress::new("symbolising", profile.samples.len());
        let mut chain = Vec::new();
        for (n, s) in profile.samples.iter().enumerate() {
            progress.update(n);
            addresses.chain(&mut stacks.names, &s.pcs, &mut chain);
            stacks.add(&chain, s.count);
        }
        stacks
    }

    /// Chains of addresses with their counts in `unit` (a heap profile's records, each
    /// weighing its scaled value), symbolised against `maps` as [`Stacks::symbolise`] does: the
    /// first address looked up where it is, the others (return addresses) at their call. Chains
    /// of no weight are left out.
    pub fn symbolise_weighted<'p>(
        maps: &Maps,
        locator: &Locator,
        unit: Unit,
        chains: impl IntoIterator<Item = (&'p [u64], u64)>,
    ) -> Stacks {
        let mut stacks = Stacks::new(0);
        stacks.unit = unit;
        let mut addresses = Addresses::new(maps, locator);
        let mut chain = Vec::new();
        for (pcs, count) in chains.into_iter().filter(|&(_, count)| count > 0) {
            addresses.chain(&mut stacks.names, pcs, &mut chain);
            stacks.add(&chain, count);
        }
        stacks
    }

    /// Adds `count` samples of the chain of `names`, outermost caller first.
    pub fn push<S: AsRef<str>>(&mut self, names: impl IntoIterator<Item = S>, count: u64) {
        let chain: Vec<u32> = names.into_iter().map(|n| self.names.id(n.as_ref())).collect();
        self.add(&chain, count);
    }

    fn chain(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.chains[i - 1].0 };
        &self.frames[start..self.chains[i].0]
    }

    /// Adds `count` samples of the chain of name ids `chain`. Chains are numbered in u32s:
    /// 2^32 distinct chains would take more than 16 GiB of ids before this table's slots.
    fn add(&mut self, chain: &[u32], count: u64) {
        if 2 * (self.chains.len() + 1) > self.slots.len() {
            self.grow();
        }
        let bits = self.slots.len().trailing_zeros();
        let tag = self.hash.hash_one(chain) >> 32;
        let mut slot = (tag >> (32 - bits)) as usize;
        loop {
            let entry = self.slots[slot];
            if entry == EMPTY {
                self.slots[slot] = tag << 32 | self.chains.len() as u64;
                self.frames.extend_from_slice(chain);
                self.chains.push((self.frames.len(), count));
                return;
            }
            let i = (entry & u64::from(u32::MAX)) as usize;
            if entry >> 32 == tag && self.chain(i) == chain {
                // Saturating: DCPI profiles are summed across files.
                self.chains[i].1 = self.chains[i].1.saturating_add(count);
                return;
            }
            slot = (slot + 1) & (self.slots.len() - 1);
        }
    }

    /// Doubles the index, placing each chain by the hash bits its slot keeps.
    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(64);
        let bits = size.trailing_zeros();
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; size]);
        for entry in old.into_iter().filter(|&e| e != EMPTY) {
            let mut slot = ((entry >> 32) >> (32 - bits)) as usize;
            while self.slots[slot] != EMPTY {
                slot = (slot + 1) & (size - 1);
            }
            self.slots[slot] = entry;
        }
    }

    /// Sum of the counts, those of samples the filters dropped included (percentages are of
    /// this, as pprof's are). Sums of counts saturate here and below: a parsed profile's total
    /// fits in a u64, but DCPI files are summed across files.
    pub fn total(&self) -> u64 {
        self.kept().saturating_add(self.removed)
    }

    /// Sum of the counts the filters kept.
    pub fn kept(&self) -> u64 {
        self.chains.iter().fold(0u64, |total, &(_, c)| total.saturating_add(c))
    }

    /// Samples per function: flat where it is the leaf, cumulative where it is anywhere on the
    /// stack (counted once per stack, however deep the recursion).
    pub fn per_function(&self) -> HashMap<&str, Counts> {
        let mut counts = self.tally().counts;
        counts.resize(self.names.len(), Counts::default());
        self.names.strings().iter().map(String::as_str).zip(counts).collect()
    }

    /// The same, with the total, for `top`.
    pub fn functions(&self) -> Functions {
        let mut functions = Functions::new(
            self.period_us,
            self.unit,
            self.names.clone(),
            self.tally(),
            self.removed,
            self.filtered,
            false,
        );
        functions.event = self.event.clone();
        functions
    }

    fn tally(&self) -> Tally {
        let mut tally = Tally::default();
        for i in 0..self.chains.len() {
            tally.add(self.chain(i), self.chains[i].1, None);
        }
        tally
    }

    /// Folded stacks (`caller;callee count`), one line per distinct chain, sorted.
    pub fn folded(&self) -> Vec<String> {
        // `;` separates frames, so it may not appear inside a name (the count follows the
        // last space, so spaces in C++ signatures are fine).
        let escaped: Vec<String> = self.names.strings().iter().map(|n| n.replace(';', ":")).collect();
        let mut folded: HashMap<String, u64, FastHash> = HashMap::default();
        let mut line = String::new();
        for i in 0..self.chains.len() {
            line.clear();
            for (k, &id) in self.chain(i).iter().enumerate() {
                if k > 0 {
                    line.push(';');
                }
                line.push_str(&escaped[id as usize]);
            }
            let count = self.chains[i].1;
            match folded.get_mut(line.as_str()) {
                Some(total) => *total = total.saturating_add(count),
                None => {
                    folded.insert(line.clone(), count);
                }
            }
        }
        let mut lines: Vec<String> = folded.into_iter().map(|(k, v)| format!("{k} {v}")).collect();
        lines.sort();
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpuprof::format::scan;

    fn chains(stacks: &Stacks) -> Vec<(Vec<String>, u64)> {
        let mut out: Vec<(Vec<String>, u64)> = (0..stacks.chains.len())
            .map(|i| {
                let names = stacks
                    .chain(i)
                    .iter()
                    .map(|&id| stacks.names.strings()[id as usize].clone());
                (names.collect(), stacks.chains[i].1)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn identical_chains_are_summed_and_distinct_ones_kept_apart() {
        let mut stacks = Stacks::new(1000);
        // Enough chains to make the index grow several times.
        for round in 0..3u64 {
            for i in 0..1000u64 {
                stacks.push(["main".to_string(), format!("f{i}"), "leaf".to_string()], round + 1);
                stacks.push(["main".to_string(), format!("f{i}")], 1);
            }
        }
        assert_eq!(stacks.chains.len(), 2000);
        let all = chains(&stacks);
        assert_eq!(all.len(), 2000);
        assert!(all.contains(&(vec!["main".into(), "f7".into(), "leaf".into()], 6)));
        assert!(all.contains(&(vec!["main".into(), "f7".into()], 3)));
        assert_eq!(stacks.total(), 1000 * 6 + 1000 * 3);
        // Names are kept once: main, leaf and f0..f999.
        assert_eq!(stacks.names.len(), 1002);
    }

    #[test]
    fn reading_as_it_goes_agrees_with_reading_the_parsed_profile() {
        use cpuprof::format::{ProfileWriter, SlotFormat};
        // Addresses in a mapping of a file that is not there (named after the file) and in
        // none (named in hex), in chains that repeat, recurse and share prefixes.
        let maps = "400000-500000 r-xp 00000000 00:00 0 /nonexistent/app\n";
        let pool = [0x401000u64, 0x402000, 0x7000, 0x7008, 0x9000];
        for format in [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32] {
            let mut w = ProfileWriter::new(Vec::new(), format, 250).unwrap();
            let mut state = 0x2545F4914F6CDD1Du64;
            for _ in 0..2000 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let depth = 1 + (state % 6) as usize;
                let pcs: Vec<u64> = (0..depth)
                    .map(|i| pool[(state >> (8 * i)) as usize % pool.len()])
                    .collect();
                w.write_record(1 + (state >> 60), &pcs).unwrap();
            }
            let bytes = w.finish(maps.as_bytes()).unwrap();
            let (outline, defect) = scan(&bytes, |_| {}).unwrap();
            assert_eq!(defect, None);
            let locator = Locator::default();
            let parsed = Stacks::symbolise(&Profile::parse(&bytes).unwrap(), &locator);
            let streamed = Stacks::read(&bytes, &outline, &locator, &Filters::default());
            assert_eq!(streamed.folded(), parsed.folded(), "{format}");
            let sorted = |f: Functions| {
                let mut counts = f.counts;
                counts.sort_by(|a, b| a.0.cmp(&b.0));
                (f.period_us, f.total, counts)
            };
            let expected = sorted(parsed.functions());
            assert_eq!(
                sorted(Functions::read(&bytes, &outline, &locator, &Filters::default())),
                expected,
                "{format}"
            );
            assert_eq!(sorted(streamed.functions()), expected, "{format}");
            assert_eq!(expected.1, outline.total);
            let names: Vec<&str> = expected.2.iter().map(|(n, _)| n.as_str()).collect();
            // Return addresses are named at their call instruction (0x9000 - 1), leaves where
            // they are.
            for name in ["0x8fff", "0x9000", "[app]"] {
                assert!(names.contains(&name), "{format}: {names:?}");
            }
            // Filtered as read, or after (parsed and DCPI profiles: diff, top of DCPI): the
            // same chains and sums, over the same unfiltered total.
            let re = |s: &str| Some(regex::Regex::new(s).unwrap());
            let filters = Filters {
                focus: re("^0x9000$|app"),
                ignore: re("^0x7008$"),
                hide: re(r"^\[app\]$"),
                ..Filters::default()
            };
            let streamed = Stacks::read(&bytes, &outline, &locator, &filters);
            let after = Stacks::symbolise(&Profile::parse(&bytes).unwrap(), &locator).filter(&filters);
            assert_eq!(streamed.folded(), after.folded(), "{format}");
            assert!(!streamed
                .folded()
                .iter()
                .any(|l| l.contains("[app]") || l.contains("0x7008")));
            assert!(streamed.kept() < streamed.total() && streamed.kept() > 0, "{format}");
            assert_eq!(streamed.total(), outline.total);
            let filtered = sorted(Functions::read(&bytes, &outline, &locator, &filters));
            assert_eq!(filtered, sorted(after.functions()), "{format}");
            assert_eq!(filtered, sorted(streamed.functions()), "{format}");
            assert_eq!(filtered.1, outline.total);
        }
    }

    #[test]
    fn recursion_counts_once_in_cumulative_and_the_leaf_is_flat() {
        let mut stacks = Stacks::new(1000);
        stacks.push(["main", "fib", "fib", "fib"], 5);
        stacks.push(["main", "fib", "add"], 2);
        stacks.push(Vec::<&str>::new(), 1);
        let f = stacks.per_function();
        assert_eq!(f["main"], Counts { flat: 0, cum: 7 });
        assert_eq!(f["fib"], Counts { flat: 5, cum: 7 });
        assert_eq!(f["add"], Counts { flat: 2, cum: 2 });
        assert_eq!(f.len(), 3);
        assert_eq!(stacks.total(), 8);
    }

    #[test]
    fn folded_lines_merge_chains_that_read_the_same() {
        let mut stacks = Stacks::new(1000);
        stacks.push(["main", "a;b"], 2);
        stacks.push(["main", "a:b"], 3);
        stacks.push(["main"], 1);
        assert_eq!(stacks.folded(), vec!["main 1", "main;a:b 5"]);
    }

    #[test]
    fn counts_saturate() {
        let mut stacks = Stacks::new(1000);
        stacks.push(["main"], u64::MAX - 1);
        stacks.push(["main"], 5);
        stacks.push(["other"], 5);
        assert_eq!(stacks.per_function()["main"].cum, u64::MAX);
        assert_eq!(stacks.total(), u64::MAX);
    }
}
