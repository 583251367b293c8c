//! The contexts (thread and state) of a wall-clock profile's records, on their way from the
//! call-chain table to the file's context lines, and the names of the threads they name.
//!
//! In the table a context is the last word of its chain ([`SampleContext::marker`]); the
//! writer takes it off before the record is written, so every reader sees plain stacks, and
//! notes which records had which context, to write after the maps text.

use crate::format::sample_context::{context_line, cpu_labels_line, state_text, thread_line};
use crate::format::SampleContext;
use crate::in_program::thread_names;
use std::collections::BTreeSet;

/// The stack of a chain from the table, and its context if it ends in a marker.
pub fn split(pcs: &[u64]) -> (&[u64], Option<SampleContext>) {
    match pcs.split_last() {
        Some((&last, stack)) => match SampleContext::from_marker(last) {
            Some(context) => (stack, Some(context)),
            None => (pcs, None),
        },
        None => (pcs, None),
    }
}

/// The contexts of the records written to one file so far.
#[derive(Default)]
pub struct RecordContexts {
    /// (first record, records, context): a count too large for one slot takes several.
    runs: Vec<(u64, u64, SampleContext)>,
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

    /// Records `first .. first + records` of the file have `context`.
    pub fn note(&mut self, first: u64, records: u64, context: SampleContext) {
        if records > 0 {
            self.runs.push((first, records, context));
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

    /// The context lines, then a line naming each thread they mention whose name is known.
    pub fn text(&self) -> Vec<u8> {
        self.text_with(&[])
    }

    /// [`text`](Self::text) with the contexts `more` of records written after these (a
    /// checkpoint's tail, `writer`).
    pub fn text_with(&self, more: &[(u64, u64, SampleContext)]) -> Vec<u8> {
        let mut text = String::new();
        if self.cpu_profile && !(self.runs.is_empty() && more.is_empty()) {
            text.push_str(&cpu_labels_line());
        }
        let mut tids = BTreeSet::new();
        for &(first, records, context) in self.runs.iter().chain(more) {
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
        assert_eq!(split(&chain), (&chain[..2], Some(context)));
        assert_eq!(split(&chain[..2]), (&chain[..2], None));
        let mut contexts = RecordContexts::default();
        contexts.note(0, 2, context);
        contexts.note(
            5,
            1,
            SampleContext {
                tid: 8,
                state: ThreadState::OnCpu,
            },
        );
        let own = crate::sampler::thread_timers::gettid();
        assert!(thread_names::read(own));
        contexts.note(
            6,
            1,
            SampleContext {
                tid: own as u32,
                state: ThreadState::Runnable,
            },
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
