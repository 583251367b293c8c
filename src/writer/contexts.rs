//! The contexts (thread and state) and label sets of a profile's records, on their way from
//! the call-chain table to the file's lines after the maps, and the names of the threads and
//! the label sets they name.
//!
//! In the table a label set and a context are the last words of their chain
//! ([`sample_labels::marker`], then [`SampleContext::marker`]); the writer takes them off
//! before the record is written, so every reader sees plain stacks, and notes which records
//! had which, to write after the maps text.

use crate::format::sample_context::{context_line, cpu_labels_line, state_text, thread_line};
use crate::format::sample_labels::{self, labels_line, labelset_line};
use crate::format::SampleContext;
use crate::in_program::thread_names;
use crate::labels::LabelSet;
use std::collections::BTreeSet;

/// What a chain from the table carries besides its stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tags {
    /// Its thread and state (wall-clock and thread-labelled profiles).
    pub context: Option<SampleContext>,
    /// The number of its label set (`crate::labels`).
    pub labels: Option<u32>,
}

/// The stack of a chain from the table, and what its outer end's markers carry.
pub fn split(pcs: &[u64]) -> (&[u64], Tags) {
    let (pcs, context) = match pcs.split_last() {
        Some((&last, stack)) => match SampleContext::from_marker(last) {
            Some(context) => (stack, Some(context)),
            None => (pcs, None),
        },
        None => (pcs, None),
    };
    let (pcs, labels) = sample_labels::split(pcs);
    (pcs, Tags { context, labels })
}

/// A run of records with the same tags: (first record, records, tags); a count too large for
/// one slot takes several records.
pub type Run = (u64, u64, Tags);

/// The contexts and label sets of the records written to one file so far.
#[derive(Default)]
pub struct RecordContexts {
    runs: Vec<Run>,
    /// The contexts label a CPU profile's samples with their threads (not a wall profile).
    cpu_profile: bool,
}

impl RecordContexts {
    /// `cpu_profile`: the contexts will label a CPU profile's samples with their threads.
    pub fn new(cpu_profile: bool) -> RecordContexts {
        RecordContexts {
            runs: Vec::new(),
            cpu_profile,
        }
    }

    /// Records `first .. first + records` of the file have `tags`.
    pub fn note(&mut self, first: u64, records: u64, tags: Tags) {
        if records > 0 && tags != Tags::default() {
            self.runs.push((first, records, tags));
        }
    }

    /// Notes the first record of thread `tid` in a CPU profile: its name is read now, while
    /// the thread most likely still runs (the wall sampler reads the names of the threads it
    /// looks at itself).
    pub fn name_new_thread(&self, tid: u32) {
        if self.cpu_profile {
            thread_names::read_if_unknown(tid as libc::pid_t);
        }
    }

    /// The context lines, a line naming each thread they mention whose name is known, then
    /// the label sets used and the labelled records' lines.
    pub fn text(&self) -> Vec<u8> {
        self.text_with(&[])
    }

    /// [`text`](Self::text) with the runs `more` of records written after these (a
    /// checkpoint's tail, `writer`).
    pub fn text_with(&self, more: &[Run]) -> Vec<u8> {
        let mut text = String::new();
        let runs = || self.runs.iter().chain(more);
        if self.cpu_profile && runs().any(|(_, _, t)| t.context.is_some()) {
            text.push_str(&cpu_labels_line());
        }
        let mut tids = BTreeSet::new();
        for &(first, records, tags) in runs() {
            let Some(context) = tags.context else { continue };
            let state = state_text(context.state, crate::in_program::syscall_names::name);
            for ordinal in first..first + records {
                text.push_str(&context_line(ordinal, context.tid, &state));
            }
            tids.insert(context.tid);
        }
        for tid in tids {
            // A thread still running whose name nobody read yet is read now.
            thread_names::read_if_unknown(tid as libc::pid_t);
            if let Some(name) = thread_names::get(tid) {
                text.push_str(&thread_line(tid, &name));
            }
        }
        let sets: BTreeSet<u32> = runs().filter_map(|(_, _, t)| t.labels).collect();
        for &id in &sets {
            if let Some(set) = LabelSet::by_id(id) {
                let pairs: Vec<(&str, &str)> = set.pairs().collect();
                text.push_str(&labelset_line(id, &pairs));
            }
        }
        for &(first, records, tags) in runs() {
            let Some(id) = tags.labels else { continue };
            for ordinal in first..first + records {
                text.push_str(&labels_line(ordinal, id));
            }
        }
        text.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{SampleContexts, ThreadState};

    #[test]
    fn markers_come_off_the_stacks_into_lines_readers_parse() {
        let context = SampleContext {
            tid: 7,
            state: ThreadState::Blocked {
                syscall: libc::SYS_read as u16,
            },
        };
        let chain = [0x401000, 0x402000, context.marker()];
        let tagged = |context| Tags {
            context: Some(context),
            labels: None,
        };
        assert_eq!(split(&chain), (&chain[..2], tagged(context)));
        assert_eq!(split(&chain[..2]), (&chain[..2], Tags::default()));
        let mut contexts = RecordContexts::default();
        contexts.note(0, 2, tagged(context));
        contexts.note(
            5,
            1,
            tagged(SampleContext {
                tid: 8,
                state: ThreadState::OnCpu,
            }),
        );
        let own = crate::sampler::thread_timers::gettid();
        assert!(thread_names::read(own));
        contexts.note(
            6,
            1,
            tagged(SampleContext {
                tid: own as u32,
                state: ThreadState::Runnable,
            }),
        );
        let mut read = SampleContexts::default();
        let text = String::from_utf8(contexts.text()).unwrap();
        for line in text.lines() {
            assert!(read.parse_line(line), "{line}");
        }
        assert_eq!(read.of(1).unwrap().state, "blocked:read");
        assert_eq!(read.of(5).unwrap().state, "cpu");
        assert_eq!(read.of(6).unwrap().state, "runnable");
        assert_eq!(read.of(2), None);
        let name = std::thread::current().name().map(|n| n[..n.len().min(15)].to_string());
        assert_eq!(Some(read.thread_label(own as u32)), name);
        assert_eq!(read.thread_label(7), "thread 7");
    }
}
