//! `cpuprof history`: one program's epochs in a profile database, each epoch's samples and its
//! top functions' shares, as a table and an SVG line chart, with the epochs where a function
//! left its usual range flagged.
//!
//! **Which statistics.** Each epoch is judged as `diff --history` judges a new profile: against
//! the mean of the epochs before it (the last `window` of them, at least `MIN_PAST`), their
//! spread beyond sampling estimated from those epochs, with Holm's correction over the
//! functions. Only shares are flagged: an epoch's CPU time is how busy the program was (the
//! night's traffic against the day's), not how its code behaves, so time effects are tested (as
//! `diff` does, counting in Holm's correction) but never flag.
//!
//! **Multiple testing across epochs.** A history of E judged epochs is E families of tests:
//! each at `alpha` would flag some noise somewhere in a long history. The level is divided
//! among the epochs (Bonferroni, `alpha / E`), so `alpha` bounds the chance that anything in the
//! whole table is flagged when nothing changed. Bonferroni rather than a sequential scheme:
//! the epochs' tests share their baselines (dependent), which Bonferroni does not mind, and its
//! price is small, a factor E on p-values that a real change makes tiny.
//!
//! After a change, the next epochs' baselines mix both versions: their spread grows and the
//! change stops being flagged once the window holds enough of the new version to make it usual.

use crate::analysis::diff::{self, Options, Summary};
use crate::model::stacks::Stacks;
use std::collections::{BTreeMap, HashMap};

/// Epochs before one that are needed to judge it: two make a spread, a third makes it less wild.
pub const MIN_PAST: usize = 3;

/// A share (percent) at or above which, in every epoch, a function is a root of every stack.
const ROOT_SHARE: f64 = 100.0;

/// One epoch as read.
pub struct Epoch {
    pub name: String,
    pub processes: usize,
    pub stacks: Stacks,
    pub records: usize,
    pub weights: Option<cpuprof::format::SignalWeights>,
}

/// A function that left its usual range in one epoch.
pub struct Flag {
    pub epoch: usize,
    pub function: String,
    /// The epochs' mean share before, and this epoch's (percent).
    pub usual: f64,
    pub share: f64,
    /// The change's interval (points) and Holm-adjusted p-value (within the epoch).
    pub low: f64,
    pub high: f64,
    pub adjusted: f64,
}

pub struct History {
    pub epochs: Vec<(String, usize, u64)>,
    /// The functions shown, and their share (percent) in each epoch.
    pub columns: Vec<(String, Vec<f64>)>,
    pub flags: Vec<Flag>,
    pub judged: usize,
    pub per_epoch_alpha: f64,
    /// Functions left out of the columns for being in every sample of every epoch.
    pub roots: usize,
}

/// Judges every epoch with at least [`MIN_PAST`] before it against the last `window` of those.
pub fn history(epochs: &[Epoch], opts: Options, window: usize, count: usize, tick_us: u64) -> History {
    let summaries: Vec<Summary> = epochs
        .iter()
        .map(|e| Summary::new(&e.stacks, e.records, e.weights, 1.0, opts.cumulative, tick_us))
        .collect();
    let judged = epochs.len().saturating_sub(MIN_PAST);
    let per_epoch = Options {
        alpha: opts.alpha / judged.max(1) as f64,
        ..opts
    };
    let mut flags = Vec::new();
    for i in MIN_PAST..epochs.len() {
        let past = &summaries[i.saturating_sub(window.max(MIN_PAST))..i];
        let report = diff::against_history(past, &summaries[i], String::new(), per_epoch);
        for row in report.rows.iter().filter(|r| r.share.significant) {
            flags.push(Flag {
                epoch: i,
                function: row.function.clone(),
                usual: row.share.before,
                share: row.share.after,
                low: row.share.low,
                high: row.share.high,
                adjusted: row.share.adjusted,
            });
        }
    }
    let shares: Vec<HashMap<String, f64>> = epochs
        .iter()
        .map(|e| {
            let total = e.stacks.total();
            e.stacks
                .per_function()
                .into_iter()
                .map(|(name, c)| {
                    let n = if opts.cumulative { c.cum } else { c.flat };
                    (name.to_string(), crate::render::text::percent(n, total))
                })
                .collect()
        })
        .collect();
    // The functions with the largest mean share, then any flagged one not among them. Those
    // in every sample of every epoch (cumulatively: _start, main, ...) would fill the columns
    // with 100 % and can never change: they are counted, not shown.
    let mut mean: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &shares {
        for (name, v) in s {
            *mean.entry(name).or_default() += v;
        }
    }
    let everywhere = |name: &str| shares.iter().all(|s| s.get(name).is_some_and(|v| *v >= ROOT_SHARE));
    let roots = mean.keys().filter(|n| everywhere(n)).count();
    let mut ranked: Vec<(&str, f64)> = mean.into_iter().filter(|(n, _)| !everywhere(n)).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let mut names: Vec<String> = ranked.iter().take(count).map(|(n, _)| n.to_string()).collect();
    for f in &flags {
        if !names.contains(&f.function) {
            names.push(f.function.clone());
        }
    }
    let columns = names
        .into_iter()
        .map(|name| {
            let series = shares.iter().map(|s| s.get(&name).copied().unwrap_or(0.0)).collect();
            (name, series)
        })
        .collect();
    History {
        epochs: epochs
            .iter()
            .map(|e| (e.name.clone(), e.processes, e.stacks.total()))
            .collect(),
        columns,
        flags,
        judged,
        per_epoch_alpha: per_epoch.alpha,
        roots,
    }
}

impl History {
    pub fn flagged(&self, epoch: usize, function: &str) -> Option<&Flag> {
        self.flags.iter().find(|f| f.epoch == epoch && f.function == function)
    }
}
