//! A profile as symbolised call chains: what `top`, `collapse`, `flamegraph` and `diff` read.

use crate::progress::Progress;
use crate::symbolize::{Locator, Symbolizer};
use cpuprof::format::Profile;
use std::collections::{HashMap, HashSet};

pub struct Stacks {
    pub period_us: u64,
    /// Call chains as function names, outermost caller first (inlined frames expanded), with
    /// their sample counts.
    pub stacks: Vec<(Vec<String>, u64)>,
}

/// Flat (self) and cumulative samples of one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub flat: u64,
    pub cum: u64,
}

impl Stacks {
    pub fn symbolise(profile: &Profile, locator: &Locator) -> Stacks {
        let mut symbolizer = Symbolizer::new(locator.clone(), &profile.maps);
        let mut cache: HashMap<u64, Vec<String>> = HashMap::new();
        let mut progress = Progress::new("symbolising", profile.samples.len());
        let stacks = profile
            .samples
            .iter()
            .enumerate()
            .map(|(n, s)| {
                progress.update(n);
                let mut names = Vec::new();
                for (i, &pc) in s.pcs.iter().enumerate().rev() {
                    // Return addresses point after the call; look up the call instruction itself.
                    let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
                    let frames = cache
                        .entry(addr)
                        .or_insert_with(|| symbolizer.functions(&profile.maps, addr));
                    names.extend(frames.iter().rev().cloned());
                }
                (names, s.count)
            })
            .collect();
        Stacks {
            period_us: profile.period_us,
            stacks,
        }
    }

    /// Sum of the counts. Sums of counts saturate here and below: a parsed profile's total
    /// fits in a u64, but DCPI files are summed across files.
    pub fn total(&self) -> u64 {
        self.stacks.iter().fold(0u64, |total, (_, c)| total.saturating_add(*c))
    }

    /// Samples per function: flat where it is the leaf, cumulative where it is anywhere on the
    /// stack (counted once per stack, however deep the recursion).
    pub fn per_function(&self) -> HashMap<&str, Counts> {
        let mut out: HashMap<&str, Counts> = HashMap::new();
        for (names, c) in &self.stacks {
            if let Some(leaf) = names.last() {
                let counts = out.entry(leaf).or_default();
                counts.flat = counts.flat.saturating_add(*c);
            }
            let unique: HashSet<&str> = names.iter().map(String::as_str).collect();
            for name in unique {
                let counts = out.entry(name).or_default();
                counts.cum = counts.cum.saturating_add(*c);
            }
        }
        out
    }

    /// Folded stacks (`caller;callee count`), one line per distinct chain, sorted.
    pub fn folded(&self) -> Vec<String> {
        let mut folded: HashMap<String, u64> = HashMap::new();
        for (names, c) in &self.stacks {
            // `;` separates frames, so it may not appear inside a name (the count follows the
            // last space, so spaces in C++ signatures are fine).
            let line = names.iter().map(|n| n.replace(';', ":")).collect::<Vec<_>>().join(";");
            let count = folded.entry(line).or_default();
            *count = count.saturating_add(*c);
        }
        let mut lines: Vec<String> = folded.into_iter().map(|(k, v)| format!("{k} {v}")).collect();
        lines.sort();
        lines
    }
}
