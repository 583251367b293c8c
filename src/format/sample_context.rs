//! What a wall-clock sample says besides its stack: which thread, and whether it was on a CPU,
//! runnable (waiting for one) or blocked, and in which system call.
//!
//! The legacy format has no labels, and its readers must keep working, so the records stay
//! plain and their contexts follow the maps text, one line per labelled record, with the
//! threads' names:
//!
//! ```text
//! # context 17 41236 blocked:read
//! # thread 41236 worker%203
//! ```
//!
//! `17` is the record's ordinal in the file (0 for the first record after the header), `41236`
//! the thread id. States: `cpu`, `runnable`, `blocked:NAME` (in system call NAME, or
//! `syscall-N` for a number the writer could not name, or `unknown` when the sampler could not
//! tell the call: see [`UNKNOWN_SYSCALL`]), `fault` (blocked outside a system call,
//! such as a page fault). Names are percent-encoded outside `[A-Za-z0-9._-]`. The spelling
//! follows the build-id lines' rules (see [`super::build_id`]): it starts with `#` and holds
//! no `=` or `]`, so google-pprof and go tool pprof skip it. Readers merge records by stack
//! *and* context, so samples of different threads or states stay apart.
//!
//! Readers get a sample's context as [`Sample::context`](super::Sample::context) (a
//! [`ReadContext`]), and the lines themselves, threads' names included, as
//! [`Maps::contexts`](super::Maps::contexts).
//!
//! Inside the profiler a context travels through the call-chain table as one extra word at the
//! outer end of a chain ([`SampleContext::marker`]), which the writer takes off again: a
//! non-canonical address, which no return address can be on x86-64 or aarch64 (both use at
//! most 57 bits with the rest copies of the top one).
//!
//! This module is pure code.

use std::collections::BTreeMap;
use std::fmt::Write;

const CONTEXT_PREFIX: &str = "# context ";
const THREAD_PREFIX: &str = "# thread ";
/// Says the contexts label a CPU profile's samples with their threads: not a wall-clock profile.
const CPU_LABELS_LINE: &str = "# samples cpu";
/// The top 16 bits of a marker: neither all zeros nor all ones, so never a user address.
const MARKER_TAG: u64 = 0xc9f0 << 48;
const TAG_MASK: u64 = 0xffff << 48;

/// Where a thread was when it was sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadState {
    /// Running on a CPU.
    OnCpu,
    /// Ready to run, waiting for a CPU.
    Runnable,
    /// Blocked in system call number `syscall` (of the profiled machine's architecture).
    Blocked {
        /// The system call's number (14 bits are kept).
        syscall: u16,
    },
    /// Blocked in the kernel outside a system call (a page fault).
    Fault,
}

/// The thread and state of a sample, as the profiler takes it (readers get a [`ReadContext`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleContext {
    /// Kernel thread id of the sampled thread.
    pub tid: u32,
    /// Where the thread was.
    pub state: ThreadState,
}

impl SampleContext {
    /// The word carrying this context at the outer end of a chain in the call-chain table:
    /// tag, state (2 bits), system call (14 bits), thread id (32 bits).
    pub fn marker(self) -> u64 {
        let (state, syscall) = match self.state {
            ThreadState::OnCpu => (0, 0),
            ThreadState::Runnable => (1, 0),
            ThreadState::Blocked { syscall } => (2, u64::from(syscall) & 0x3fff),
            ThreadState::Fault => (3, 0),
        };
        MARKER_TAG | state << 46 | syscall << 32 | u64::from(self.tid)
    }

    /// The context a chain's last word carries, if it is a marker.
    pub fn from_marker(word: u64) -> Option<SampleContext> {
        if word & TAG_MASK != MARKER_TAG {
            return None;
        }
        let state = match (word >> 46) & 3 {
            0 => ThreadState::OnCpu,
            1 => ThreadState::Runnable,
            2 => ThreadState::Blocked {
                syscall: ((word >> 32) & 0x3fff) as u16,
            },
            _ => ThreadState::Fault,
        };
        Some(SampleContext {
            tid: word as u32,
            state,
        })
    }
}

/// The system call number of [`ThreadState::Blocked`] when the sampler could not tell which
/// call a blocked thread is in (its registers came from a context switch, which does not
/// carry the number on x86-64): spelled `blocked:unknown`.
pub const UNKNOWN_SYSCALL: u16 = 0x3fff;

/// A state as the file spells it; `syscall_name` names a system call number.
pub(crate) fn state_text(state: ThreadState, syscall_name: impl Fn(u16) -> Option<&'static str>) -> String {
    match state {
        ThreadState::OnCpu => "cpu".into(),
        ThreadState::Runnable => "runnable".into(),
        ThreadState::Fault => "fault".into(),
        ThreadState::Blocked {
            syscall: UNKNOWN_SYSCALL,
        } => "blocked:unknown".into(),
        ThreadState::Blocked { syscall } => match syscall_name(syscall) {
            Some(name) => format!("blocked:{name}"),
            None => format!("blocked:syscall-{syscall}"),
        },
    }
}

/// A sample's context as read from a file: the state as spelled there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReadContext {
    /// Kernel thread id of the sampled thread.
    pub tid: u32,
    /// `cpu`, `runnable`, `blocked:NAME` or `fault`.
    pub state: String,
}

impl ReadContext {
    /// `on CPU`, `runnable` or `blocked` (`fault` included): the split `top` shows.
    pub fn kind(&self) -> StateKind {
        match self.state.as_str() {
            "cpu" => StateKind::OnCpu,
            "runnable" => StateKind::Runnable,
            _ => StateKind::Blocked,
        }
    }

    /// The system call a blocked sample waited in, if the state names one.
    pub fn syscall(&self) -> Option<&str> {
        self.state.strip_prefix("blocked:")
    }
}

/// The three kinds of state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// Running on a CPU (`cpu`).
    OnCpu,
    /// Ready to run, waiting for a CPU (`runnable`).
    Runnable,
    /// Waiting in the kernel: in a system call (`blocked:NAME`) or outside one (`fault`).
    Blocked,
}

/// The contexts of a profile's records and its threads' names, as read from the maps text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleContexts {
    /// (record ordinal, context), ordinals increasing.
    pub records: Vec<(u64, ReadContext)>,
    /// Thread id to name, for the threads whose names the profile recorded.
    pub thread_names: BTreeMap<u32, String>,
    /// The contexts label a CPU profile's samples with their threads (a `# samples cpu` line):
    /// every sample is CPU time, and the profile is not a wall-clock one.
    pub cpu_profile: bool,
}

impl SampleContexts {
    /// Whether no record has a context: true for every CPU profile.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Takes in one line of the maps text; false if it is not a context or thread line.
    pub(crate) fn parse_line(&mut self, line: &str) -> bool {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix(CONTEXT_PREFIX) {
            let mut fields = rest.split_ascii_whitespace();
            let parsed = (|| {
                let ordinal = fields.next()?.parse().ok()?;
                let tid = fields.next()?.parse().ok()?;
                let state = fields.next()?.to_string();
                Some((ordinal, ReadContext { tid, state }))
            })();
            if let Some(entry) = parsed {
                self.records.push(entry);
            }
            return true;
        }
        if line.trim_end() == CPU_LABELS_LINE {
            self.cpu_profile = true;
            return true;
        }
        if let Some(rest) = line.strip_prefix(THREAD_PREFIX) {
            if let Some((tid, name)) = rest.trim_end().split_once(' ') {
                if let Ok(tid) = tid.parse() {
                    self.thread_names.insert(tid, percent_decode(name));
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

    /// The context of record `ordinal` (0 for the first record after the header), if it has
    /// one.
    pub fn of(&self, ordinal: u64) -> Option<&ReadContext> {
        let i = self.records.binary_search_by_key(&ordinal, |(o, _)| *o).ok()?;
        Some(&self.records[i].1)
    }

    /// The name shown for thread `tid`: its name, else `thread TID`.
    pub fn thread_label(&self, tid: u32) -> String {
        match self.thread_names.get(&tid) {
            Some(name) => name.clone(),
            None => format!("thread {tid}"),
        }
    }
}

/// The context line of record `ordinal`.
pub(crate) fn context_line(ordinal: u64, tid: u32, state: &str) -> String {
    format!("{CONTEXT_PREFIX}{ordinal} {tid} {state}\n")
}

/// The line that marks a CPU profile whose samples carry their threads.
pub(crate) fn cpu_labels_line() -> String {
    format!("{CPU_LABELS_LINE}\n")
}

/// The line naming thread `tid`.
pub(crate) fn thread_line(tid: u32, name: &[u8]) -> String {
    let mut line = format!("{THREAD_PREFIX}{tid} ");
    percent_encode(name, &mut line);
    line.push('\n');
    line
}

/// Appends `bytes` to `out` with every byte outside `[A-Za-z0-9._-]` as `%xx`: no space, `=`
/// or `]` is left for pprof readers to misread.
pub(crate) fn percent_encode(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02x}");
        }
    }
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_carry_every_context_and_are_never_user_addresses() {
        for state in [
            ThreadState::OnCpu,
            ThreadState::Runnable,
            ThreadState::Blocked { syscall: 0 },
            ThreadState::Blocked { syscall: 441 },
            ThreadState::Fault,
        ] {
            for tid in [1, 4_194_304, u32::MAX] {
                let context = SampleContext { tid, state };
                let marker = context.marker();
                assert_eq!(SampleContext::from_marker(marker), Some(context));
                // Not canonical on a 48- or 57-bit address space.
                let top = marker >> 56;
                assert!(top != 0 && top != 0xff, "{marker:x}");
            }
        }
        for pc in [0x401000, 0x7fff_ffff_f000, 0xffff_ffff_ff60_0000, 0xc9f0] {
            assert_eq!(SampleContext::from_marker(pc), None, "{pc:x}");
        }
    }

    #[test]
    fn lines_round_trip_and_readers_skip_them() {
        let mut read = SampleContexts::default();
        let text = context_line(3, 77, "blocked:read")
            + &context_line(1, 78, "cpu")
            + &thread_line(77, b"worker 3=a]b%")
            + &thread_line(78, b"main");
        for line in text.lines() {
            assert!(
                line.starts_with('#') && !line.contains('=') && !line.contains(']'),
                "{line}"
            );
            assert!(read.parse_line(line));
        }
        assert!(!read.parse_line("00400000-00401000 r-xp 00000000 08:01 1 /bin/x"));
        read.finish();
        assert_eq!(read.of(3).map(|c| (c.tid, c.syscall())), Some((77, Some("read"))));
        assert_eq!(read.of(1).map(ReadContext::kind), Some(StateKind::OnCpu));
        assert_eq!(read.of(2), None);
        assert_eq!(read.thread_label(77), "worker 3=a]b%");
        assert_eq!(read.thread_label(79), "thread 79");
    }

    #[test]
    fn states_are_spelled_with_their_system_call() {
        let names = |n: u16| (n == 0).then_some("read");
        assert_eq!(state_text(ThreadState::Blocked { syscall: 0 }, names), "blocked:read");
        assert_eq!(
            state_text(ThreadState::Blocked { syscall: 9 }, names),
            "blocked:syscall-9"
        );
        assert_eq!(
            state_text(
                ThreadState::Blocked {
                    syscall: UNKNOWN_SYSCALL
                },
                names
            ),
            "blocked:unknown"
        );
        let marker = SampleContext {
            tid: 7,
            state: ThreadState::Blocked {
                syscall: UNKNOWN_SYSCALL,
            },
        }
        .marker();
        assert_eq!(
            SampleContext::from_marker(marker).unwrap().state,
            ThreadState::Blocked {
                syscall: UNKNOWN_SYSCALL
            }
        );
        assert_eq!(state_text(ThreadState::Runnable, names), "runnable");
        let kind = |s: &str| {
            ReadContext {
                tid: 1,
                state: s.into(),
            }
            .kind()
        };
        assert_eq!(kind("fault"), StateKind::Blocked);
        assert_eq!(kind("runnable"), StateKind::Runnable);
    }
}
