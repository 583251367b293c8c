//! One profile being written ([`ProfileOutput`]): its encoder over the bytes' destination, the
//! first error writing it hit, the code mappings seen, the records' contexts, and the
//! wall-clock profile beside it; how it is completed (trailer and the text after it), at a
//! checkpoint, for an exec, or at the end.

use super::contexts::{RecordContexts, Run, Tags};
use super::mappings::SeenMappings;
use super::sink::OutputSink;
use super::{threadless, Finished};
use crate::format::writer::{encode_record, record_size};
use crate::format::{EventLine, ProcessLine, ProfileWriter, SignalWeights, SlotFormat, TRAILER};
use crate::in_program::procfs::read_self_maps;
use crate::sampler::SamplerState;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;

/// One profile being written (the middle layer of the writer's output: see `output`): its
/// encoder over its `OutputSink`, the first error writing it hit, the code mappings seen
/// while profiling, its records' contexts, and the wall-clock profile beside it.
pub struct ProfileOutput {
    pub(super) writer: ProfileWriter<OutputSink>,
    pub(super) error: Option<std::io::Error>,
    pub(super) mappings: SeenMappings,
    /// The contexts of the records written (wall mode).
    pub(super) contexts: RecordContexts,
    /// The wall-clock profile written beside this CPU profile: it takes the samples that
    /// carry a context.
    pub(super) beside: Option<Box<ProfileOutput>>,
    /// Completed for an exec under way: where the records ended in the file, and the bytes
    /// the writer had handed over then (see `writer`'s `complete_for_exec`).
    pub(super) exec_trailer_at: Option<(u64, u64)>,
    /// It holds a wall sampler's samples: its trailer says how many looks are missing
    /// (`# wall-looks`).
    pub(super) wall: bool,
    /// An event profile's event (`# event`, after the maps).
    pub(super) event: Option<EventLine>,
}

impl ProfileOutput {
    /// The profile going to `file`, its header written. `thread_labels`: its samples carry
    /// their threads, and it says so.
    pub(super) fn new(file: OutputSink, period_us: u64, thread_labels: bool) -> std::io::Result<ProfileOutput> {
        let writer = ProfileWriter::new(file, SlotFormat::NATIVE, period_us)?;
        let mut mappings = SeenMappings::default();
        mappings.record(&read_self_maps());
        Ok(ProfileOutput {
            writer,
            error: None,
            mappings,
            contexts: RecordContexts::new(thread_labels),
            beside: None,
            exec_trailer_at: None,
            wall: false,
            event: None,
        })
    }

    /// What the profile needs to be written without a writer thread (its header flushed to
    /// the file first), or `None` if it cannot be (kept in memory, a write failed).
    pub(crate) fn threadless(
        &mut self,
        path: &Path,
        max_depth: usize,
        summary: bool,
        checkpoint: Option<std::time::Duration>,
    ) -> Option<Box<threadless::Threadless>> {
        self.writer.flush().ok()?;
        let fd = self.writer.get_ref().descriptor()?;
        threadless::Threadless::new(
            path,
            fd,
            self.writer.get_ref().bytes_in_file(),
            max_depth,
            summary,
            checkpoint,
            self.event.as_ref().map(EventLine::line),
        )
    }

    /// Creates the file at `path` (not followed if a symbolic link, never blocking; regular
    /// files and /dev/null) with its header.
    pub(super) fn create(path: &Path, period_us: u64, thread_labels: bool) -> std::io::Result<ProfileOutput> {
        ProfileOutput::new(OutputSink::create(path)?, period_us, thread_labels)
    }
}

/// The `# process` line of this process as it is now: ids, origin, and `/proc/self/cmdline`
/// (no arguments if it cannot be read).
fn process_line() -> String {
    let args = crate::in_program::procfs::read_self_cmdline(crate::format::process::MAX_COMMAND_LINE);
    ProcessLine {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        forked: crate::session::children::is_forked_child(),
        args: ProcessLine::args_of_cmdline(&args.unwrap_or_default()),
    }
    .line()
}

/// Records of a checkpoint's tail: the table's counts not harvested yet, numbered after the
/// records in the file (for their contexts).
pub(super) struct TailRecords {
    bytes: Vec<u8>,
    next: u64,
    runs: Vec<Run>,
}

impl TailRecords {
    /// None yet, to follow the records of `out`.
    pub(super) fn after(out: &ProfileOutput) -> TailRecords {
        TailRecords {
            bytes: Vec::new(),
            next: out.writer.records_written(),
            runs: Vec::new(),
        }
    }

    pub(super) fn put(&mut self, count: u64, pcs: &[u64], tags: Tags) {
        let (size, records) = record_size(SlotFormat::NATIVE, count, pcs);
        if records == 0 {
            return;
        }
        let at = self.bytes.len();
        self.bytes.resize(at + size, 0);
        encode_record(SlotFormat::NATIVE, count, pcs, &mut self.bytes[at..]);
        if tags != Tags::default() {
            self.runs.push((self.next, records, tags));
        }
        self.next += records;
    }
}

/// What follows the trailer: the maps (with build-ids), the samples' signal weights, the
/// process that wrote the profile, the records' contexts, for a wall-clock profile
/// (`wall`) the wall sampler's missing looks, and for an event profile its event.
fn trailer_text(
    mappings: &mut SeenMappings,
    weights: SignalWeights,
    contexts: &RecordContexts,
    wall: bool,
    event: Option<&EventLine>,
) -> Vec<u8> {
    let maps = read_self_maps();
    // The program may have closed or reused the descriptor since the last tick: read ELF
    // images through one that is ours, not through its file.
    let _ = crate::unwind::safe_read::check();
    mappings.read_build_ids(&maps);
    let mut text = mappings.complete(&maps);
    text.extend_from_slice(weights.line().as_bytes());
    text.extend_from_slice(process_line().as_bytes());
    if wall {
        text.extend_from_slice(crate::wall::looks_line().as_bytes());
    }
    if let Some(event) = event {
        text.extend_from_slice(event.line().as_bytes());
    }
    text.extend_from_slice(&contexts.text());
    text
}

/// [`trailer_text`] for a checkpoint, whose last records (its tail) have the contexts
/// `tail_runs` beside those of `contexts`. Nothing is read from `/proc` (no descriptor is
/// opened or reopened while the program runs, every 2 s): the maps are the code mappings
/// recorded as objects were loaded, with their build-ids, and the process line is the one read
/// when the writer started.
fn checkpoint_trailer_text(
    mappings: &SeenMappings,
    weights: SignalWeights,
    contexts: &RecordContexts,
    tail_runs: &[Run],
    wall: bool,
    event: Option<&EventLine>,
) -> Vec<u8> {
    let mut text = mappings.complete(b"");
    text.extend_from_slice(weights.line().as_bytes());
    text.extend_from_slice(checkpoint_process_line().as_bytes());
    if wall {
        text.extend_from_slice(crate::wall::looks_line().as_bytes());
    }
    if let Some(event) = event {
        text.extend_from_slice(event.line().as_bytes());
    }
    text.extend_from_slice(&contexts.text_with(tail_runs));
    text
}

/// This process's `# process` line as its writer found it when it started (set by
/// [`remember_process_line`]; a forked child's writer sets its own).
fn checkpoint_process_line() -> String {
    let line = PROCESS_LINE.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is a leaked (never freed) box set by remember_process_line.
    match unsafe { line.as_ref() } {
        Some((pid, line)) if *pid == std::process::id() => line.clone(),
        _ => String::new(),
    }
}

/// Reads and keeps the `# process` line, for the checkpoints of this process's files. The
/// command line is read through a descriptor closed at once (the cached one would stay open
/// for the whole run, one of the few a program under a low `RLIMIT_NOFILE` has).
pub(super) fn remember_process_line() {
    let args = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args = &args[..args.len().min(crate::format::process::MAX_COMMAND_LINE)];
    let line = ProcessLine {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        forked: crate::session::children::is_forked_child(),
        args: ProcessLine::args_of_cmdline(args),
    }
    .line();
    let line = Box::into_raw(Box::new((std::process::id(), line)));
    // The previous one (a parent's, in a forked child) stays allocated: a few bytes, once per
    // process, and no reader can be left holding a freed one.
    PROCESS_LINE.store(line, Ordering::Release);
}

static PROCESS_LINE: std::sync::atomic::AtomicPtr<(u32, String)> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

impl ProfileOutput {
    /// Writes the trailer, the maps and the samples' signal weights (unless an error came
    /// first) and closes the file, and the one beside it.
    pub(super) fn finish(self, state: &SamplerState) -> Finished {
        self.finish_with(state.signal_weights(), state.wall_signal_weights())
    }

    /// `weights`: this file's samples'; `beside_weights`: those of the file beside it.
    pub(super) fn finish_with(self, weights: SignalWeights, beside_weights: SignalWeights) -> Finished {
        let ProfileOutput {
            mut writer,
            error,
            mut mappings,
            contexts,
            beside,
            exec_trailer_at,
            wall,
            event,
        } = self;
        debug_assert!(exec_trailer_at.is_none(), "taken back by Output::complete");
        // The last write: the held records and the trailer together, over the last tail.
        writer.get_mut().hold_records(false);
        let written = match error {
            Some(e) => Err(e),
            None => writer.write_trailer(&trailer_text(&mut mappings, weights, &contexts, wall, event.as_ref())),
        };
        let file = writer.into_inner();
        let bytes = file.bytes_in_file();
        let (closed, held) = match file.close() {
            Ok(held) => (Ok(()), held),
            Err(e) => (Err(e), None),
        };
        Finished {
            bytes,
            result: written.and(closed),
            held,
            beside: beside.map(|b| Box::new(b.finish_with(beside_weights, beside_weights))),
        }
    }

    /// The records written so far, then a trailer and the maps as they are now: a complete
    /// profile, while this one goes on. Call after a flush.
    pub(super) fn snapshot(&mut self, state: &SamplerState) -> io::Result<Vec<u8>> {
        if let Some(e) = &self.error {
            return Err(io::Error::new(e.kind(), e.to_string()));
        }
        let mut bytes = self.writer.get_ref().read_back()?;
        for slot in TRAILER {
            SlotFormat::NATIVE.put(slot, &mut bytes);
        }
        bytes.extend_from_slice(&trailer_text(
            &mut self.mappings,
            state.signal_weights(),
            &self.contexts,
            self.wall,
            self.event.as_ref(),
        ));
        Ok(bytes)
    }

    /// Completes the file for an exec (trailer, maps), keeping where its records end: if the
    /// exec fails, [`resume_after_exec`](Self::resume_after_exec) takes the trailer back. A
    /// profile kept in memory goes with the process image and needs none. The wall profile
    /// beside it likewise.
    pub(super) fn complete_for_exec(&mut self, state: &SamplerState) {
        if self.holds_records() {
            // A checkpoint completes the file; the next one (after an exec that failed) writes
            // over its tail.
            self.checkpoint(state);
            return;
        }
        self.complete_for_exec_with(state.signal_weights());
        if let Some(beside) = self.beside.as_mut().filter(|_| self.exec_trailer_at.is_some()) {
            beside.complete_for_exec_with(state.wall_signal_weights());
        }
    }

    pub(super) fn complete_for_exec_with(&mut self, weights: SignalWeights) {
        if self.exec_trailer_at.is_some() || self.error.is_some() {
            return;
        }
        self.flush_records();
        let Some(records_end) = self
            .writer
            .get_ref()
            .descriptor()
            .map(|_| self.writer.get_ref().bytes_in_file())
        else {
            return;
        };
        let written = self.writer.bytes_written();
        let text = trailer_text(
            &mut self.mappings,
            weights,
            &self.contexts,
            self.wall,
            self.event.as_ref(),
        );
        match self.writer.write_trailer(&text) {
            Ok(()) => self.exec_trailer_at = Some((records_end, written)),
            Err(e) => self.error = Some(e),
        }
    }

    /// Takes back the trailer written for an exec that failed (the file is cut back to its
    /// records), so that records go on after them.
    pub(super) fn resume_after_exec(&mut self) {
        if let Some((records_end, written)) = self.exec_trailer_at.take() {
            if let Err(e) = self.writer.get_mut().truncate_to(records_end) {
                self.error.get_or_insert(e);
            }
            self.writer.rewind_to(written);
        }
        if let Some(beside) = &mut self.beside {
            beside.resume_after_exec();
        }
    }

    /// Records are written at checkpoints only, in this file and the one beside it.
    pub(super) fn hold_records(&mut self) {
        if self.writer.get_ref().descriptor().is_some() {
            self.writer.get_mut().hold_records(true);
        }
        if let Some(beside) = &mut self.beside {
            beside.hold_records();
        }
    }

    pub(super) fn holds_records(&self) -> bool {
        self.writer.get_ref().holds_records()
    }

    pub(super) fn held_bytes(&self) -> usize {
        self.writer.get_ref().held_bytes() + self.beside.as_ref().map_or(0, |b| b.held_bytes())
    }

    /// Writes the records held since the last checkpoint and a tail that completes the
    /// profile: the table's counts not harvested yet (copied, not taken), the trailer and the
    /// trailer text (maps, build-ids, weights, process, contexts). The same for the file beside.
    pub fn checkpoint(&mut self, state: &SamplerState) {
        if !self.holds_records() {
            return;
        }
        let mut own = TailRecords::after(self);
        let mut beside = self.beside.as_deref().map(TailRecords::after);
        let mut scratch = vec![0; state.table.max_depth()];
        state.table.peek_with(&mut scratch, |count, chain| {
            let (pcs, tags) = super::contexts::split(chain);
            match beside.as_mut().filter(|_| tags.context.is_some()) {
                Some(beside) => beside.put(count, pcs, tags),
                None => own.put(count, pcs, tags),
            }
        });
        self.checkpoint_with(own, state.signal_weights());
        if let (Some(file), Some(records)) = (self.beside.as_mut(), beside) {
            file.checkpoint_with(records, state.wall_signal_weights());
        }
    }

    /// [`checkpoint`](Self::checkpoint) of this file alone, with `records` in its tail.
    pub(super) fn checkpoint_with(&mut self, records: TailRecords, weights: SignalWeights) {
        if self.error.is_some() || !self.holds_records() {
            return;
        }
        let mut tail = records.bytes;
        for slot in TRAILER {
            SlotFormat::NATIVE.put(slot, &mut tail);
        }
        tail.extend_from_slice(&checkpoint_trailer_text(
            &self.mappings,
            weights,
            &self.contexts,
            &records.runs,
            self.wall,
            self.event.as_ref(),
        ));
        if let Err(e) = self.writer.get_mut().checkpoint(&tail) {
            self.error = Some(e);
        }
    }

    /// Writes evicted records and, when `harvest`, the table's counts, then flushes to the
    /// file; returns the ring slots drained. After a write error nothing more is written (a
    /// partial record would corrupt the file); the error is kept for `stop` to report.
    /// Samples with a context go to the wall-clock profile beside this one, if there is one.
    pub fn write_pending(&mut self, state: &SamplerState, harvest: bool) -> usize {
        if self.exec_trailer_at.is_some() {
            // Completed for an exec under way: nothing is added after the trailer.
            return 0;
        }
        let mut drained = 0;
        let mut write = |count: u64, chain: &[u64]| {
            let (pcs, tags) = super::contexts::split(chain);
            match self.beside.as_mut().filter(|_| tags.context.is_some()) {
                Some(beside) => beside.put(count, pcs, tags),
                None => self.put(count, pcs, tags),
            }
        };
        state.table.drain_evicted(|count, pcs| {
            drained += pcs.len() + 2;
            write(count, pcs)
        });
        if harvest {
            state.table.harvest(&mut write);
        }
        self.flush_records();
        if let Some(beside) = &mut self.beside {
            beside.flush_records();
        }
        drained
    }

    /// Writes one record, noting its context and labels. After a write error nothing more is
    /// written.
    pub(super) fn put(&mut self, count: u64, pcs: &[u64], tags: Tags) {
        if self.error.is_some() {
            return;
        }
        let first = self.writer.records_written();
        match self.writer.write_record(count, pcs) {
            Ok(()) => {
                if let Some(context) = tags.context {
                    self.contexts.name_new_thread(context.tid);
                }
                self.contexts.note(first, self.writer.records_written() - first, tags);
            }
            Err(e) => self.error = Some(e),
        }
    }

    pub(super) fn flush_records(&mut self) {
        if self.error.is_none() {
            if let Err(e) = self.writer.flush() {
                self.error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_line_names_this_process_and_its_arguments() {
        let line = process_line();
        let p = ProcessLine::parse_line(&line).unwrap_or_else(|| panic!("{line}"));
        assert_eq!(p.pid, std::process::id());
        // SAFETY: getppid has no preconditions.
        assert_eq!(p.ppid, unsafe { libc::getppid() } as u32);
        assert!(!p.forked);
        let args: Vec<Vec<u8>> = std::env::args_os()
            .map(|a| std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str()).to_vec())
            .collect();
        assert_eq!(p.args, args);
    }
}
