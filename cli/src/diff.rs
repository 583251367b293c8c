//! What changed between profiles, told apart from sampling noise.
//!
//! Shares are compared, not counts: two runs rarely last equally long. A function's share in
//! a profile of N samples has a sampling error of about sqrt(p(1-p)/N), so a change is flagged
//! only when it is both large (`min_points` percentage points) and unlikely to be noise (its
//! z-score, the change over its standard error, beyond `threshold`).

use crate::report::percent;
use crate::stacks::Stacks;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

#[derive(Clone, Copy, Debug)]
pub struct Criteria {
    /// Compare cumulative instead of flat (self) shares.
    pub cumulative: bool,
    /// Smallest |z| flagged.
    pub threshold: f64,
    /// Smallest change flagged, in percentage points.
    pub min_points: f64,
}

/// A function whose share changed, in percentage points.
#[derive(Clone, Debug)]
pub struct Change {
    pub function: String,
    pub before: f64,
    pub after: f64,
    pub z: f64,
}

/// Each function's share of the profile's samples, in percent.
fn shares(stacks: &Stacks, cumulative: bool) -> HashMap<String, f64> {
    let total = stacks.total();
    stacks
        .per_function()
        .into_iter()
        .map(|(name, c)| {
            (
                name.to_string(),
                percent(if cumulative { c.cum } else { c.flat }, total),
            )
        })
        .collect()
}

/// Changes from `base` to `new` that pass `criteria`, largest first.
pub fn compare(base: &Stacks, new: &Stacks, criteria: Criteria) -> Vec<Change> {
    let (before, after) = (shares(base, criteria.cumulative), shares(new, criteria.cumulative));
    let (n1, n2) = (base.total() as f64, new.total() as f64);
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let changes: Vec<Change> = names
        .into_iter()
        .filter_map(|name| {
            let (p1, p2) = (
                before.get(name).copied().unwrap_or(0.0),
                after.get(name).copied().unwrap_or(0.0),
            );
            // Two-proportion z-test with the pooled share.
            let pooled = (p1 * n1 + p2 * n2) / (n1 + n2) / 100.0;
            let se = 100.0 * (pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2)).sqrt();
            flagged(name, p1, p2, se, criteria)
        })
        .collect();
    largest_first(changes)
}

/// Functions whose share in `new` lies outside what `history` shows: the history's mean and
/// run-to-run spread, widened by `new`'s own sampling error.
pub fn against_history(history: &[Stacks], new: &Stacks, criteria: Criteria) -> Vec<Change> {
    let past: Vec<HashMap<String, f64>> = history.iter().map(|s| shares(s, criteria.cumulative)).collect();
    let now = shares(new, criteria.cumulative);
    let n = new.total() as f64;
    let runs = past.len() as f64;
    let names: BTreeSet<&String> = past.iter().flat_map(|p| p.keys()).chain(now.keys()).collect();
    let changes: Vec<Change> = names
        .into_iter()
        .filter_map(|name| {
            let values: Vec<f64> = past.iter().map(|p| p.get(name).copied().unwrap_or(0.0)).collect();
            let mean = values.iter().sum::<f64>() / runs;
            let spread = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (runs - 1.0).max(1.0);
            let share = now.get(name).copied().unwrap_or(0.0);
            let p = ((mean + share) / 200.0).clamp(0.0, 1.0);
            let sampling = 100.0 * 100.0 * p * (1.0 - p) / n;
            let se = (spread * (1.0 + 1.0 / runs) + sampling).sqrt();
            flagged(name, mean, share, se, criteria)
        })
        .collect();
    largest_first(changes)
}

/// The change of `function` from share `before` to `after` (standard error `se`), if it
/// passes `criteria`.
fn flagged(function: &str, before: f64, after: f64, se: f64, criteria: Criteria) -> Option<Change> {
    let z = if se > 0.0 { (after - before) / se } else { 0.0 };
    let large = (after - before).abs() >= criteria.min_points && z.abs() >= criteria.threshold;
    large.then(|| Change {
        function: function.to_string(),
        before,
        after,
        z,
    })
}

fn largest_first(mut changes: Vec<Change>) -> Vec<Change> {
    changes.sort_by(|a, b| (b.after - b.before).abs().total_cmp(&(a.after - a.before).abs()));
    changes
}

/// The report: what grew, what shrank.
pub fn render(changes: &[Change], header: &str, before_label: &str) -> String {
    let mut out = format!("{header}\n");
    if changes.is_empty() {
        out.push_str("no significant change\n");
        return out;
    }
    for (title, grew) in [("grew", true), ("shrank", false)] {
        let rows: Vec<&Change> = changes.iter().filter(|c| (c.after > c.before) == grew).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}:");
        let _ = writeln!(
            out,
            "  {:>8}  {before_label:>8}  {:>8}  {:>7}  function",
            "change", "now", "z"
        );
        for c in rows {
            let _ = writeln!(
                out,
                "  {:>+7.1}%  {:>7.1}%  {:>7.1}%  {:>+7.1}  {}",
                c.after - c.before,
                c.before,
                c.after,
                c.z,
                c.function
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stacks(counts: &[(&str, u64)]) -> Stacks {
        let mut stacks = Stacks::new(1000);
        for (f, c) in counts {
            stacks.push(["main", f], *c);
        }
        stacks
    }

    const CRITERIA: Criteria = Criteria {
        cumulative: false,
        threshold: 4.0,
        min_points: 1.0,
    };

    #[test]
    fn a_doubled_function_grows_and_its_sibling_shrinks() {
        let base = stacks(&[("a", 7500), ("b", 2500), ("c", 30)]);
        let new = stacks(&[("a", 7500), ("b", 5000), ("c", 38)]);
        let changes = compare(&base, &new, CRITERIA);
        let z: HashMap<&str, f64> = changes.iter().map(|c| (c.function.as_str(), c.z)).collect();
        assert_eq!(z.len(), 2, "{changes:?}");
        assert!(z["b"] > 10.0 && z["a"] < -10.0, "{changes:?}");
    }

    #[test]
    fn sampling_noise_is_not_flagged() {
        let base = stacks(&[("a", 750), ("b", 250)]);
        let new = stacks(&[("a", 735), ("b", 265)]);
        assert!(compare(&base, &new, CRITERIA).is_empty());
    }

    #[test]
    fn history_flags_only_what_left_its_usual_range() {
        let history = [
            stacks(&[("a", 7400), ("b", 2600)]),
            stacks(&[("a", 7600), ("b", 2400)]),
            stacks(&[("a", 7500), ("b", 2500)]),
        ];
        let usual = stacks(&[("a", 7450), ("b", 2550)]);
        assert!(against_history(&history, &usual, CRITERIA).is_empty());
        let grown = stacks(&[("a", 6000), ("b", 4000), ("new_fn", 500)]);
        let changes = against_history(&history, &grown, CRITERIA);
        let names: BTreeSet<&str> = changes.iter().map(|c| c.function.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["a", "b", "new_fn"]));
    }
}
