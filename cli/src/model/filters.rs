//! `--focus`, `--ignore`, `--hide` and `--show`: pprof's sample filters, with pprof's meanings
//! (its `profile.FilterSamplesByName`), applied to each sample's chain of function names
//! before anything is summed.
//!
//! A sample is kept when no frame matches `--ignore` and, with `--focus`, some frame matches
//! it; of a kept sample's frames, those matching `--hide` (or, with `--show`, not matching it)
//! are taken out, so their time goes to the frames around them (a hidden leaf's flat time to
//! its caller); a sample left with no frames is dropped. Percentages stay relative to the
//! unfiltered total, as pprof's are (without its `-relative_percentages`).
//!
//! pprof matches a frame's function name, source file or object; here a frame's function name
//! (unnamed code is named `[object]`, so the object still matches there).
//!
//! Readers call [`Filtering::apply`] on each chain of name ids: a function's verdict is worked
//! out once, the first time its id is met, so a filtered read stays one pass with no
//! allocation per record, and an unfiltered one pays one branch per record.
//!
//! `--tagfocus` and `--tagignore` filter samples by their labels (`cpuprof::labels`), with
//! pprof's meanings: `KEY=REGEX` matches a sample whose label KEY has a value REGEX matches
//! (unanchored; several regexes separated by commas match if any does), `REGEX` alone any
//! label's value; a sample without the key does not match.

use crate::symbols::{Locator, Symbolizer};
use clap::Args;
use cpuprof::format::heap::{HeapProfile, HeapRecord};
use cpuprof::format::{Maps, Profile, Sample};
use regex::Regex;
use std::collections::HashMap;

/// The filters, shared by every reading command (`#[command(flatten)]`).
#[derive(Args, Clone, Debug, Default)]
pub struct Filters {
    /// Keep only samples with a frame whose function name matches REGEX (pprof -focus).
    /// Percentages stay relative to the unfiltered total, as in pprof. All four filters match
    /// function names only (pprof also matches source file and object names).
    #[arg(long, value_name = "REGEX", value_parser = regex)]
    pub focus: Option<Regex>,
    /// Drop samples with a frame whose function name matches REGEX (pprof -ignore); it wins
    /// over --focus.
    #[arg(long, value_name = "REGEX", value_parser = regex)]
    pub ignore: Option<Regex>,
    /// Take frames whose function name matches REGEX out of the stacks (pprof -hide): their
    /// samples go to their callers (flat) and stay in the rest of the stack.
    #[arg(long, value_name = "REGEX", value_parser = regex)]
    pub hide: Option<Regex>,
    /// Keep only frames whose function name matches REGEX in the stacks (pprof -show); a
    /// sample with none is dropped.
    #[arg(long, value_name = "REGEX", value_parser = regex)]
    pub show: Option<Regex>,
    /// Keep only samples with a label matching [KEY=]REGEX (pprof -tagfocus): KEY's value, or
    /// without KEY any label's value, matched by REGEX (commas separate alternatives).
    #[arg(long, value_name = "[KEY=]REGEX", value_parser = tag_filter)]
    pub tagfocus: Option<TagFilter>,
    /// Drop samples with a label matching [KEY=]REGEX (pprof -tagignore); it wins over
    /// --tagfocus.
    #[arg(long, value_name = "[KEY=]REGEX", value_parser = tag_filter)]
    pub tagignore: Option<TagFilter>,
    /// `top --by KEY`'s section being read: the samples whose label KEY has this value (none:
    /// the samples without KEY).
    #[arg(skip)]
    pub group: Option<(String, Option<String>)>,
}

pub fn regex(text: &str) -> Result<Regex, String> {
    Regex::new(text).map_err(|e| format!("not a regular expression: {e}"))
}

/// A `--tagfocus` or `--tagignore` argument: a label key (none: any) and value patterns.
#[derive(Clone, Debug)]
pub struct TagFilter {
    key: Option<String>,
    values: Vec<Regex>,
}

impl TagFilter {
    /// Whether `labels` (a sample's (key, value) pairs) match.
    pub fn matches(&self, labels: &[(String, String)]) -> bool {
        labels
            .iter()
            .any(|(k, v)| self.key.as_ref().is_none_or(|key| key == k) && self.values.iter().any(|re| re.is_match(v)))
    }
}

pub fn tag_filter(text: &str) -> Result<TagFilter, String> {
    let (key, values) = match text.split_once('=') {
        Some((key, values)) => (Some(key.to_string()), values),
        None => (None, text),
    };
    let values = values.split(',').map(regex).collect::<Result<Vec<_>, _>>()?;
    Ok(TagFilter { key, values })
}

/// A function's verdict, in bits: it is focused on, ignored, or hidden.
const FOCUSED: u8 = 1;
const IGNORED: u8 = 2;
const HIDDEN: u8 = 4;
/// Not worked out yet.
const UNKNOWN: u8 = 8;

impl Filters {
    pub fn active(&self) -> bool {
        self.focus.is_some() || self.ignore.is_some() || self.hide.is_some() || self.show.is_some() || self.by_tags()
    }

    /// Whether samples are kept or dropped by their labels.
    pub fn by_tags(&self) -> bool {
        self.tagfocus.is_some() || self.tagignore.is_some() || self.group.is_some()
    }

    /// Whether a sample with `labels` (`None`: unlabelled) is kept by `--tagfocus`,
    /// `--tagignore` and the group `top --by` reads.
    pub fn keeps_labels(&self, labels: Option<&[(String, String)]>) -> bool {
        let labels = labels.unwrap_or(&[]);
        let in_group = |(key, value): &(String, Option<String>)| {
            labels.iter().find(|(k, _)| k == key).map(|(_, v)| v) == value.as_ref()
        };
        !self.tagignore.as_ref().is_some_and(|f| f.matches(labels))
            && self.tagfocus.as_ref().is_none_or(|f| f.matches(labels))
            && self.group.as_ref().is_none_or(in_group)
    }

    /// What the filters make of a frame of function `name`. Ignoring wins over focusing, as in
    /// pprof: a sample with an ignored frame is dropped whatever else it holds.
    fn verdict(&self, name: &str) -> u8 {
        let matches = |re: &Option<Regex>| re.as_ref().is_some_and(|re| re.is_match(name));
        let mut verdict = if matches(&self.ignore) {
            IGNORED
        } else if self.focus.is_none() || matches(&self.focus) {
            FOCUSED
        } else {
            0
        };
        if matches(&self.hide) || self.show.as_ref().is_some_and(|re| !re.is_match(name)) {
            verdict |= HIDDEN;
        }
        verdict
    }

    /// Whether a frame of function `name` is taken out of kept samples.
    pub fn hides(&self, name: &str) -> bool {
        self.verdict(name) & HIDDEN != 0
    }

    /// The frames `names` (outermost caller first) of one sample: `None` when the sample is
    /// dropped, else which frames stay. For callers that hold names rather than ids.
    pub fn frames_kept<S: AsRef<str>>(&self, names: &[S]) -> Option<Vec<bool>> {
        let verdicts: Vec<u8> = names.iter().map(|n| self.verdict(n.as_ref())).collect();
        keep(&verdicts).then(|| verdicts.iter().map(|v| v & HIDDEN == 0).collect())
    }
}

/// Whether a sample whose frames have `verdicts` is kept.
fn keep(verdicts: &[u8]) -> bool {
    let focused = verdicts.iter().any(|v| v & FOCUSED != 0);
    let ignored = verdicts.iter().any(|v| v & IGNORED != 0);
    focused && !ignored && verdicts.iter().any(|v| v & HIDDEN == 0)
}

/// The filters applied to chains of name ids, each id's verdict worked out once.
pub struct Filtering<'f> {
    filters: &'f Filters,
    active: bool,
    verdicts: Vec<u8>,
    kept: Vec<u32>,
}

impl<'f> Filtering<'f> {
    pub fn new(filters: &'f Filters) -> Self {
        Filtering {
            filters,
            active: filters.active(),
            verdicts: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// The frames of `chain` (ids into `names`, outermost caller first) that the filters
    /// keep, or `None` when they drop the sample. Without filters, `chain` itself.
    pub fn apply<'a>(&'a mut self, chain: &'a [u32], names: &[String]) -> Option<&'a [u32]> {
        if !self.active {
            return Some(chain);
        }
        let (mut focused, mut hidden) = (false, false);
        for &id in chain {
            let id = id as usize;
            if id >= self.verdicts.len() {
                self.verdicts.resize(id + 1, UNKNOWN);
            }
            if self.verdicts[id] == UNKNOWN {
                self.verdicts[id] = self.filters.verdict(&names[id]);
            }
            let v = self.verdicts[id];
            if v & IGNORED != 0 {
                return None;
            }
            focused |= v & FOCUSED != 0;
            hidden |= v & HIDDEN != 0;
        }
        if !focused {
            return None;
        }
        if !hidden {
            return Some(chain);
        }
        self.kept.clear();
        let verdicts = &self.verdicts;
        self.kept
            .extend(chain.iter().filter(|&&id| verdicts[id as usize] & HIDDEN == 0));
        (!self.kept.is_empty()).then_some(self.kept.as_slice())
    }
}

/// `profile` as `filters` leave it, for `convert`: dropped samples left out, and addresses all
/// of whose frames are hidden taken out of the chains (an address with some hidden inlined
/// frames stays; the pprof encoder leaves those frames out).
pub fn profile(profile: &Profile, locator: &Locator, filters: &Filters) -> Profile {
    let mut chains = Chains::new(&profile.maps, locator, filters);
    let samples = profile
        .samples
        .iter()
        .filter(|sample| filters.keeps_labels(sample.labels.as_deref()))
        .filter_map(|sample| {
            Some(Sample {
                count: sample.count,
                pcs: chains.kept(&sample.pcs)?,
                context: sample.context.clone(),
                labels: sample.labels.clone(),
            })
        })
        .collect();
    Profile {
        samples,
        ..profile.clone()
    }
}

/// `profile` with only the samples the tag filters keep (`None`: they keep every sample), for
/// readers that filter chains themselves (`diff`).
pub fn by_labels(profile: &Profile, filters: &Filters) -> Option<Profile> {
    filters.by_tags().then(|| Profile {
        samples: profile
            .samples
            .iter()
            .filter(|sample| filters.keeps_labels(sample.labels.as_deref()))
            .cloned()
            .collect(),
        ..profile.clone()
    })
}

/// A heap profile as `filters` leave it, for `convert`, as [`profile`] leaves a CPU profile.
pub fn heap_profile(profile: &HeapProfile, locator: &Locator, filters: &Filters) -> HeapProfile {
    let maps = profile.maps();
    let mut chains = Chains::new(&maps, locator, filters);
    let records = profile
        .records
        .iter()
        .filter_map(|record| {
            Some(HeapRecord {
                counts: record.counts,
                stack: chains.kept(&record.stack)?,
            })
        })
        .collect();
    HeapProfile {
        records,
        ..profile.clone()
    }
}

/// Chains of addresses (the first looked up where it is, return addresses at their call) as
/// the filters leave them, each address named once.
struct Chains<'a> {
    maps: &'a Maps,
    filters: &'a Filters,
    symbolizer: Symbolizer,
    /// Each address's function names, innermost first.
    known: HashMap<u64, Vec<String>>,
}

impl<'a> Chains<'a> {
    fn new(maps: &'a Maps, locator: &Locator, filters: &'a Filters) -> Self {
        Chains {
            maps,
            filters,
            symbolizer: Symbolizer::new(locator.clone(), maps),
            known: HashMap::new(),
        }
    }

    /// The addresses of `pcs` that keep a frame, or `None` when the filters drop the chain.
    fn kept(&mut self, pcs: &[u64]) -> Option<Vec<u64>> {
        // Names outermost first, and for each the index of its address in `pcs`.
        let (mut names, mut owner) = (Vec::new(), Vec::new());
        for (i, &pc) in pcs.iter().enumerate().rev() {
            // Return addresses are looked up at the call instruction, as the readers do.
            let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
            let at = self
                .known
                .entry(addr)
                .or_insert_with(|| self.symbolizer.functions(self.maps, addr));
            for name in at.iter().rev() {
                names.push(name.clone());
                owner.push(i);
            }
        }
        let kept = self.filters.frames_kept(&names)?;
        let mut stays = vec![false; pcs.len()];
        for (&i, k) in owner.iter().zip(kept) {
            stays[i] |= k;
        }
        let mut kept: Vec<u64> = (0..pcs.len()).filter(|&i| stays[i]).map(|i| pcs[i]).collect();
        // A return address that becomes the leaf would be looked up as it is, not at its call
        // instruction: store the call's address instead.
        if !stays[0] {
            kept[0] = kept[0].saturating_sub(1);
        }
        Some(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters(focus: &str, ignore: &str, hide: &str, show: &str) -> Filters {
        let re = |s: &str| (!s.is_empty()).then(|| Regex::new(s).unwrap());
        Filters {
            focus: re(focus),
            ignore: re(ignore),
            hide: re(hide),
            show: re(show),
            ..Filters::default()
        }
    }

    #[test]
    fn tag_filters_have_pprofs_meanings() {
        let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let a = labels(&[("endpoint", "/api/a"), ("tenant", "acme")]);
        let b = labels(&[("endpoint", "/b")]);
        let keeps = |focus: &str, ignore: &str, sample: Option<&[(String, String)]>| {
            let f = Filters {
                tagfocus: (!focus.is_empty()).then(|| tag_filter(focus).unwrap()),
                tagignore: (!ignore.is_empty()).then(|| tag_filter(ignore).unwrap()),
                ..Filters::default()
            };
            assert!(f.active());
            f.keeps_labels(sample)
        };
        assert!(keeps("endpoint=/a", "", Some(&a)), "unanchored");
        assert!(!keeps("endpoint=/a", "", Some(&b)));
        assert!(!keeps("endpoint=/a", "", None), "no labels: no match");
        assert!(keeps("acme", "", Some(&a)), "any key");
        assert!(keeps("endpoint=/x,/b", "", Some(&b)), "alternatives");
        assert!(!keeps("tenant=acme", "", Some(&b)), "the key is missing");
        assert!(!keeps("endpoint=/", "tenant=acme", Some(&a)), "tagignore wins");
        assert!(keeps("", "tenant=acme", Some(&b)));
        assert!(keeps("", "tenant=acme", None));
        let group = |value: Option<&str>| Filters {
            group: Some(("endpoint".to_string(), value.map(str::to_string))),
            ..Filters::default()
        };
        assert!(group(Some("/b")).keeps_labels(Some(&b)));
        assert!(!group(Some("/b")).keeps_labels(Some(&a)));
        assert!(group(None).keeps_labels(None));
        assert!(!group(None).keeps_labels(Some(&b)));
        assert!(tag_filter("endpoint=(").is_err());
    }

    /// The chain of `names` through `Filtering`, as names.
    fn apply(f: &Filters, chain: &[&str]) -> Option<Vec<String>> {
        let names: Vec<String> = ["main", "a", "b", "c", "burn"].map(String::from).to_vec();
        let ids: Vec<u32> = chain
            .iter()
            .map(|n| names.iter().position(|m| m == n).unwrap() as u32)
            .collect();
        let mut filtering = Filtering::new(f);
        let kept = filtering.apply(&ids, &names)?;
        let by_ids: Vec<String> = kept.iter().map(|&i| names[i as usize].clone()).collect();
        // The name-based entry point agrees.
        let flags = f.frames_kept(chain).unwrap();
        let by_names: Vec<String> = chain
            .iter()
            .zip(flags)
            .filter(|(_, k)| *k)
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(by_ids, by_names);
        Some(by_ids)
    }

    #[test]
    fn focus_ignore_hide_and_show_as_pprof_defines_them() {
        let chain = ["main", "a", "c", "burn"];
        let none = Filters::default();
        assert!(!none.active());
        assert_eq!(apply(&none, &chain).unwrap(), chain);
        // Focus: some frame matches (unanchored, like pprof's regexps).
        assert_eq!(apply(&filters("^a$", "", "", ""), &chain).unwrap(), chain);
        assert_eq!(apply(&filters("^b$", "", "", ""), &chain), None);
        assert_eq!(apply(&filters("ur", "", "", ""), &chain).unwrap(), chain);
        // Ignore wins over focus, even on the same frame.
        assert_eq!(apply(&filters("^a$", "^c$", "", ""), &chain), None);
        assert_eq!(apply(&filters("^a$", "^a$", "", ""), &chain), None);
        assert_eq!(apply(&filters("", "^b$", "", ""), &chain).unwrap(), chain);
        // Hide takes frames out, keeping the sample.
        assert_eq!(apply(&filters("", "", "burn|^a$", ""), &chain).unwrap(), ["main", "c"]);
        // Show keeps only matching frames; a sample left with none is dropped.
        assert_eq!(apply(&filters("", "", "", "^[ac]$"), &chain).unwrap(), ["a", "c"]);
        assert_eq!(apply(&filters("", "", "", "^b$"), &chain), None);
        assert_eq!(apply(&filters("", "", ".", ""), &chain), None);
        // Focus looks at hidden frames too (pprof filters samples before hiding frames).
        assert_eq!(
            apply(&filters("burn", "", "burn", ""), &chain).unwrap(),
            ["main", "a", "c"]
        );
    }
}
