//! A raw profile's samples by their labels (`cpuprof::labels`): the values of each key and
//! their shares (`top --tags`, as pprof's `-tags`), and the groups `top --by KEY` shows a
//! table for.

use crate::error::Result;
use crate::input::Source;
use crate::model::filters::Filters;
use cpuprof::format::Scan;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Samples per label key and value, over the samples the tag filters keep.
#[derive(Debug, Default)]
pub struct LabelCounts {
    pub total: u64,
    /// Key -> value -> samples.
    pub by_key: BTreeMap<String, BTreeMap<String, u64>>,
}

/// Counts the records of `source` (whose first pass found `outline`) by label.
pub fn count(source: &Source, outline: &Scan, filters: &Filters) -> Result<LabelCounts> {
    let mut counts = LabelCounts::default();
    let mut ordinal = 0u64;
    // The first pass found any defect; the records before it are what counts.
    let _ = source.scan(|record| {
        let labels = outline.maps.labels.of(ordinal);
        ordinal += 1;
        if !filters.keeps_labels(labels.map(|l| &l[..])) {
            return;
        }
        counts.total = counts.total.saturating_add(record.count);
        for (k, v) in labels.into_iter().flat_map(|l| l.iter()) {
            let n = counts
                .by_key
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default();
            *n = n.saturating_add(record.count);
        }
    })?;
    Ok(counts)
}

impl LabelCounts {
    /// The groups of `key`: each value with its samples, largest first, then the samples
    /// without the key (`None`), if any.
    pub fn groups(&self, key: &str) -> Vec<(Option<String>, u64)> {
        let mut groups: Vec<(Option<String>, u64)> = self
            .by_key
            .get(key)
            .into_iter()
            .flatten()
            .map(|(v, &n)| (Some(v.clone()), n))
            .collect();
        groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let labelled: u64 = groups.iter().map(|g| g.1).sum();
        if labelled < self.total {
            groups.push((None, self.total - labelled));
        }
        groups
    }

    /// pprof's `-tags` view: each key, its total, then its values, largest first, with their
    /// samples and share of the key's samples.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.by_key.is_empty() {
            out.push_str("no labels in this profile\n");
        }
        for key in self.by_key.keys() {
            let groups: Vec<_> = self.groups(key).into_iter().filter(|g| g.0.is_some()).collect();
            let total: u64 = groups.iter().map(|g| g.1).sum();
            let _ = writeln!(out, "{key}: total {total} samples");
            for (value, n) in groups {
                let share = 100.0 * n as f64 / total.max(1) as f64;
                let _ = writeln!(out, "  {n:>10} ({share:5.1}%): {}", value.unwrap_or_default());
            }
        }
        out
    }
}
