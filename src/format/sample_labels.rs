//! Labels on samples: which request, endpoint, tenant or trace a sample's CPU time went to.
//! A program installs a label set for the current thread (`crate::labels`); every sample the
//! thread takes meanwhile carries the set.
//!
//! The legacy format has no labels and its readers must keep working, so records stay plain,
//! and the sets follow the maps text as contexts do (`super::sample_context`), each set once,
//! then one line per labelled record:
//!
//! ```text
//! # labelset 3 endpoint %2Fapi%2Fusers tenant acme
//! # labels 17 3
//! ```
//!
//! `3` is the set's number in this file, followed by its keys and values, each
//! percent-encoded outside `[A-Za-z0-9._-]` (so the lines hold no `=` or `]`, and
//! google-pprof and go tool pprof skip them); `17` is the record's ordinal (0 for the first
//! record after the header). Readers merge records by stack *and* label set.
//!
//! Inside the profiler a set travels through the call-chain table as one word at the outer
//! end of a chain, before a context's marker if there is one ([`marker`]): a non-canonical
//! address, as context markers are, with another tag.
//!
//! This module is pure code.

use super::sample_context::{percent_decode, percent_encode};
use std::collections::BTreeMap;
use std::sync::Arc;

const LABELSET_PREFIX: &str = "# labelset ";
const LABELS_PREFIX: &str = "# labels ";
/// The top 16 bits of a label marker: neither all zeros nor all ones (never a user address),
/// and not a context marker's (0xc9f0).
const MARKER_TAG: u64 = 0xc9f1 << 48;
const TAG_MASK: u64 = 0xffff << 48;

/// A label set as read: (key, value) pairs, keys sorted and distinct.
pub type Labels = Arc<[(String, String)]>;

/// The word carrying label set `id` (not 0) in a chain.
pub fn marker(id: u32) -> u64 {
    MARKER_TAG | u64::from(id)
}

/// The label set a chain's word carries, if it is a label marker.
pub fn from_marker(word: u64) -> Option<u32> {
    (word & TAG_MASK == MARKER_TAG).then_some(word as u32)
}

/// The stack of a chain whose outer end may be a label marker, and the set's id if it is.
pub fn split(pcs: &[u64]) -> (&[u64], Option<u32>) {
    match pcs.split_last() {
        Some((&last, stack)) => match from_marker(last) {
            Some(id) => (stack, Some(id)),
            None => (pcs, None),
        },
        None => (pcs, None),
    }
}

/// The line defining set `id` as `pairs`.
pub fn labelset_line<K: AsRef<[u8]>, V: AsRef<[u8]>>(id: u32, pairs: &[(K, V)]) -> String {
    let mut line = format!("{LABELSET_PREFIX}{id}");
    for (k, v) in pairs {
        line.push(' ');
        percent_encode(k.as_ref(), &mut line);
        line.push(' ');
        percent_encode(v.as_ref(), &mut line);
    }
    line.push('\n');
    line
}

/// The line giving record `ordinal` the set `id`.
pub fn labels_line(ordinal: u64, id: u32) -> String {
    format!("{LABELS_PREFIX}{ordinal} {id}\n")
}

/// The label sets of a profile's records, as read from the maps text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleLabels {
    /// The sets, by their number in the file.
    pub sets: BTreeMap<u32, Labels>,
    /// (record ordinal, set number), ordinals increasing.
    pub records: Vec<(u64, u32)>,
}

impl SampleLabels {
    /// Whether no record has labels.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Takes in one line of the maps text; false if it is not a label line.
    pub(crate) fn parse_line(&mut self, line: &str) -> bool {
        // Not trimmed at the end: an empty value is a set's last word.
        let line = line.trim_start().trim_end_matches(['\r', '\n']);
        if let Some(rest) = line.strip_prefix(LABELSET_PREFIX) {
            let mut fields = rest.split(' ');
            if let Some(Ok(id)) = fields.next().map(str::parse::<u32>) {
                let words: Vec<String> = fields.map(percent_decode).collect();
                let mut pairs: Vec<(String, String)> =
                    words.chunks_exact(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
                pairs.sort();
                pairs.dedup_by(|a, b| a.0 == b.0);
                self.sets.insert(id, pairs.into());
            }
            return true;
        }
        if let Some(rest) = line.strip_prefix(LABELS_PREFIX) {
            if let Some((ordinal, id)) = rest.split_once(' ') {
                if let (Ok(ordinal), Ok(id)) = (ordinal.parse(), id.parse()) {
                    self.records.push((ordinal, id));
                }
            }
            return true;
        }
        false
    }

    /// Sorts the records by ordinal (a file's are written in order; this makes any order do).
    pub(crate) fn finish(&mut self) {
        if !self.records.is_sorted_by_key(|(ordinal, _)| *ordinal) {
            self.records.sort_by_key(|(ordinal, _)| *ordinal);
        }
    }

    /// The labels of record `ordinal`, if it has a set the file defines.
    pub fn of(&self, ordinal: u64) -> Option<&Labels> {
        self.sets.get(&self.set_of(ordinal)?)
    }

    /// The number of record `ordinal`'s set, if it has one the file defines.
    pub fn set_of(&self, ordinal: u64) -> Option<u32> {
        let i = self.records.binary_search_by_key(&ordinal, |(o, _)| *o).ok()?;
        let id = self.records[i].1;
        self.sets.contains_key(&id).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_carry_ids_and_are_neither_addresses_nor_contexts() {
        for id in [1, 77, u32::MAX] {
            let m = marker(id);
            assert_eq!(from_marker(m), Some(id));
            assert_eq!(super::super::SampleContext::from_marker(m), None);
            let top = m >> 56;
            assert!(top != 0 && top != 0xff, "{m:x}");
        }
        let context = super::super::SampleContext {
            tid: 5,
            state: super::super::ThreadState::OnCpu,
        }
        .marker();
        assert_eq!(from_marker(context), None);
        for pc in [0x401000, 0x7fff_ffff_f000, 0xffff_ffff_ff60_0000] {
            assert_eq!(from_marker(pc), None);
        }
        let chain = [0x401000, 0x402000, marker(9)];
        assert_eq!(split(&chain), (&chain[..2], Some(9)));
        assert_eq!(split(&chain[..2]), (&chain[..2], None));
    }

    #[test]
    fn lines_round_trip_and_pprof_readers_skip_them() {
        let text = labelset_line(3, &[("endpoint", "/api/users?x=1]"), ("tenant", "acme corp")])
            + &labelset_line(4, &[("span_id", "")])
            + &labels_line(17, 3)
            + &labels_line(2, 4)
            + &labels_line(5, 99);
        let mut read = SampleLabels::default();
        for line in text.lines() {
            assert!(
                line.starts_with('#') && !line.contains('=') && !line.contains(']'),
                "{line}"
            );
            assert!(read.parse_line(line), "{line}");
        }
        assert!(!read.parse_line("# thread 7 main"));
        read.finish();
        let set = read.of(17).unwrap();
        assert_eq!(
            &set[..],
            &[
                ("endpoint".to_string(), "/api/users?x=1]".to_string()),
                ("tenant".to_string(), "acme corp".to_string())
            ]
        );
        assert_eq!(&read.of(2).unwrap()[..], &[("span_id".to_string(), String::new())]);
        assert_eq!(read.of(5), None, "a set the file does not define");
        assert_eq!(read.of(3), None);
    }
}
