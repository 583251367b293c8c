//! Where samples go. "The output" is one concept in three layers, outermost first:
//!
//! - [`Output`]: everything a profile writes, chosen at start: a single profile
//!   ([`Output::Single`]), or a database of profiles, one per epoch ([`EpochOutput`], whose
//!   files `epochs` names, opens and publishes).
//! - [`ProfileOutput`] (`profile.rs`): one profile being written, the single one or an epoch's:
//!   its record encoder, the first error writing it hit, the code mappings and record contexts
//!   its trailer will name, the wall-clock profile written beside it (another `ProfileOutput`),
//!   and how it is completed: at a checkpoint, for an exec, at the end.
//! - [`OutputSink`] (`sink.rs`): where one profile's bytes land: a file (opened without blocking
//!   or following links, at a high descriptor number, checked before every write, never left
//!   ending mid-record) or memory, up to a limit.
//!
//! Only the writer thread uses them. Before it starts (`threadless`) the signal handler writes
//! records straight to the sink's descriptor; the writer then takes the file over
//! ([`Output::note_written_elsewhere`]).
//!
//! [`OutputSink`]: super::sink::OutputSink

use super::epochs::{Database, Epoch};
use super::profile::{ProfileOutput, TailRecords};
use super::sink::OutputSink;
use super::{failure_error, Finished};
use crate::error::Error;
use crate::format::{EventLine, SignalWeights};
use crate::sampler::SamplerState;
use crate::session::Options;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Where samples go: one profile, or a database of epoch files.
pub enum Output {
    /// One profile: a file, or memory, and maybe the wall-clock profile beside it.
    Single(ProfileOutput),
    /// A database of profiles, one file per epoch.
    Epochs(EpochOutput),
}

/// Epoch mode's state: the database and the epoch being written (`None` while an `exec` is
/// under way, or after opening the next epoch's file failed).
pub struct EpochOutput {
    db: Database,
    current: Option<Epoch>,
    /// Bytes of the epoch files completed, and the first error met (each is reported).
    bytes: u64,
    error: Option<io::Error>,
    /// Whether the last attempt to open an epoch file failed (reported once per streak).
    open_failing: bool,
    /// Each epoch file is written at checkpoints (see [`Output::hold_records`]).
    checkpoints: bool,
}

impl EpochOutput {
    pub fn new(db: Database, first: Epoch) -> EpochOutput {
        EpochOutput {
            db,
            current: Some(first),
            bytes: 0,
            error: None,
            open_failing: false,
            checkpoints: false,
        }
    }

    /// Writes the trailer and maps of the current epoch file and renames it into place.
    pub(super) fn complete_current(&mut self, state: &SamplerState) {
        let Some(epoch) = self.current.take() else {
            return;
        };
        self.complete(epoch, state);
    }

    pub(super) fn complete(&mut self, epoch: Epoch, state: &SamplerState) {
        let (directory, temporary) = (epoch.directory().to_path_buf(), epoch.temporary().to_path_buf());
        let finished = epoch.out.finish(state);
        self.bytes += finished.bytes;
        let published = finished.result.and_then(|()| self.db.publish(&directory, &temporary));
        if let Err(e) = published {
            let message = format!(
                "cpuprof: the epoch file '{}' is incomplete or missing: {e}\n",
                temporary.display()
            );
            // No lock: see print_exit_summary.
            crate::in_program::messages::say_bytes(message.as_bytes());
            self.error.get_or_insert(e);
        }
        self.db.apply_budget(SystemTime::now());
    }

    pub(super) fn open(&mut self, now: SystemTime) -> Option<Epoch> {
        let mappings = self
            .current
            .as_ref()
            .map(|e| e.out.mappings.clone())
            .unwrap_or_default();
        match self.db.open(now, mappings) {
            Ok(mut epoch) => {
                self.open_failing = false;
                if self.checkpoints {
                    // Complete from the start, as the first file is (the writer's first
                    // checkpoint): an epoch cut short by SIGKILL is a valid profile.
                    epoch.out.hold_records();
                    epoch
                        .out
                        .checkpoint_with(TailRecords::after(&epoch.out), SignalWeights::default());
                }
                Some(epoch)
            }
            Err(e) => {
                if !self.open_failing {
                    crate::say!(
                        "cpuprof: cannot write an epoch file in '{}': {e}; samples stay in memory (and are counted as lost once it is full) until one can be written",
                        self.db.dir().display()
                    );
                }
                self.open_failing = true;
                None
            }
        }
    }
}

impl Output {
    /// Opens where the samples go, headers written: the first epoch's file of a database, or the
    /// profile's file (or memory) and the wall-clock profile's file beside it.
    pub(crate) fn open(path: &Path, options: &Options, thread_labels: bool) -> Result<Output, Error> {
        let open_error = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        Ok(match &options.epochs {
            Some(epoch_options) => {
                let db =
                    Database::new(path, epoch_options.clone(), options.period_us()).with_thread_labels(thread_labels);
                let first = db.open(SystemTime::now(), Default::default()).map_err(open_error)?;
                db.apply_budget(SystemTime::now());
                Output::Epochs(EpochOutput::new(db, first))
            }
            None => {
                let mut out = match options.in_memory {
                    Some(limit) => ProfileOutput::new(OutputSink::in_memory(limit), options.period_us(), thread_labels),
                    // Not followed if a symbolic link, never blocking, regular files and /dev/null.
                    None => ProfileOutput::create(path, options.period_us(), thread_labels),
                }
                .map_err(open_error)?;
                out.wall = options.wall;
                out.event = options.event.as_ref().map(|e| EventLine {
                    name: e.name.clone(),
                    period: e.period,
                });
                if let Some(beside) = &options.wall_beside {
                    let period_us = 1_000_000 / u64::from(beside.frequency.max(1));
                    let mut wall_out =
                        ProfileOutput::create(&beside.path, period_us, false).map_err(|source| Error::Open {
                            path: beside.path.clone(),
                            source,
                        })?;
                    wall_out.wall = true;
                    out.beside = Some(Box::new(wall_out));
                }
                Output::Single(out)
            }
        })
    }

    /// Counts what `writer::threadless` wrote to the file before this writer took it over.
    pub(super) fn note_written_elsewhere(&mut self, handed: super::threadless::HandedOver) {
        if let Output::Single(out) = self {
            out.writer.note_written_elsewhere(handed.records, handed.bytes);
            out.writer.get_mut().note_written_elsewhere(handed.bytes, handed.failed);
            out.writer.get_mut().adopt_tail(handed.tail);
            if handed.failed {
                out.error.get_or_insert(failure_error(handed.failure));
            }
        }
    }

    pub(super) fn record_mappings(&mut self, maps: &[u8]) {
        let out = match self {
            Output::Single(out) => out,
            Output::Epochs(EpochOutput {
                current: Some(epoch), ..
            }) => &mut epoch.out,
            Output::Epochs(_) => return,
        };
        out.mappings.record(maps);
        out.mappings.read_build_ids(maps);
    }

    /// From now on records are written at checkpoints only, in every file (epoch files too).
    pub(super) fn hold_records(&mut self) {
        match self {
            Output::Single(out) => out.hold_records(),
            Output::Epochs(e) => {
                e.checkpoints = true;
                if let Some(epoch) = e.current.as_mut() {
                    epoch.out.hold_records();
                }
            }
        }
    }

    /// Records held for the next checkpoint.
    pub(super) fn held_bytes(&self) -> usize {
        match self {
            Output::Single(out) => out.held_bytes(),
            Output::Epochs(EpochOutput {
                current: Some(epoch), ..
            }) => epoch.out.held_bytes(),
            Output::Epochs(_) => 0,
        }
    }

    /// See [`ProfileOutput::checkpoint`]; in epoch mode, of the current epoch's file.
    pub(super) fn checkpoint(&mut self, state: &SamplerState) {
        match self {
            Output::Single(out) => out.checkpoint(state),
            Output::Epochs(e) => {
                if let Some(epoch) = e.current.as_mut() {
                    epoch.out.checkpoint(state);
                }
            }
        }
    }

    /// See [`ProfileOutput::write_pending`]; in epoch mode, into the current epoch's file (with
    /// none open, nothing is taken from the table or the ring).
    pub(super) fn write_pending(&mut self, state: &SamplerState, harvest: bool) -> usize {
        match self {
            Output::Single(out) => out.write_pending(state, harvest),
            Output::Epochs(e) => e
                .current
                .as_mut()
                .map_or(0, |epoch| epoch.out.write_pending(state, harvest)),
        }
    }

    /// The writer's wait, cut short to wake at the end of the epoch.
    pub(super) fn wait_at_most(&self, tick: Duration, now: SystemTime) -> Duration {
        match self {
            Output::Epochs(EpochOutput {
                current: Some(epoch), ..
            }) => match epoch.ends.duration_since(now) {
                // Past the end (the next file could not be opened): the usual tick, not a spin.
                Ok(left) if !left.is_zero() => tick.min(left),
                _ => tick,
            },
            _ => tick,
        }
    }

    /// Before an exec: the file is completed now (the new image cannot do it); a profile
    /// file keeps where its records end, for [`resume_after_exec`](Self::resume_after_exec).
    pub(super) fn close_for_exec(&mut self, state: &SamplerState) {
        match self {
            Output::Epochs(e) => e.complete_current(state),
            Output::Single(out) => out.complete_for_exec(state),
        }
    }

    /// After an exec that failed: a profile file completed for it goes on taking records.
    pub(super) fn resume_after_exec(&mut self) {
        if let Output::Single(out) = self {
            out.resume_after_exec();
        }
    }

    /// At the end of an epoch: everything counted so far (the table's counts and the ring's
    /// records) goes to the ending epoch's file, which is completed and renamed; the next
    /// epoch's file takes what follows. Also opens a file after a failed exec or open.
    /// Returns whether a new epoch file was opened.
    pub(super) fn roll_if_due(&mut self, state: &SamplerState, now: SystemTime, exec_pending: bool) -> bool {
        let Output::Epochs(e) = self else {
            return false;
        };
        let due = e.current.as_ref().is_some_and(|epoch| now >= epoch.ends);
        if due {
            if let Some(epoch) = e.current.as_mut() {
                epoch.out.write_pending(state, true);
            }
            // Opened before the old one is completed: if it cannot be, the old epoch goes on
            // taking samples rather than dropping them.
            if let Some(next) = e.open(now) {
                if let Some(ended) = e.current.replace(next) {
                    e.complete(ended, state);
                }
                return true;
            }
        } else if e.current.is_none() && !exec_pending {
            e.current = e.open(now);
            return e.current.is_some();
        }
        false
    }

    /// A complete copy of the profile so far (see [`WriterControl::snapshot_and_wait`]).
    pub(super) fn snapshot(&mut self, state: &SamplerState) -> io::Result<Vec<u8>> {
        match self {
            Output::Single(out) => out.snapshot(state),
            Output::Epochs(_) => Err(io::Error::other(
                "a profile database has no single profile to copy: read its epochs",
            )),
        }
    }

    /// At stop or `_exit`: writes what is left and completes the file (in epoch mode, the
    /// current epoch's, the last).
    pub(super) fn complete(self, state: &SamplerState) -> Finished {
        match self {
            Output::Single(mut out) => {
                // A trailer written for an exec (that failed, or not yet done) is taken back:
                // the records since then go before the final one.
                out.resume_after_exec();
                out.write_pending(state, true);
                out.finish(state)
            }
            Output::Epochs(mut e) => {
                if e.current.is_none() {
                    e.current = e.open(SystemTime::now());
                }
                if let Some(epoch) = e.current.as_mut() {
                    epoch.out.write_pending(state, true);
                }
                e.complete_current(state);
                Finished {
                    bytes: e.bytes,
                    result: e.error.map_or(Ok(()), Err),
                    held: None,
                    beside: None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SampleSource;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// The epochs written under `db`, in order: (epoch directory name, samples by chain).
    fn read_epochs(db: &std::path::Path) -> Vec<(String, std::collections::HashMap<Vec<u64>, u64>)> {
        let mut dirs: Vec<_> = std::fs::read_dir(db).unwrap().map(|e| e.unwrap().path()).collect();
        dirs.sort();
        dirs.iter()
            .map(|dir| {
                let files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
                assert_eq!(files.len(), 1, "{files:?}");
                assert!(files[0]
                    .to_string_lossy()
                    .ends_with(&format!(".{}.prof", std::process::id())));
                let profile = crate::format::Profile::parse(&std::fs::read(&files[0]).unwrap()).unwrap();
                let mut chains = std::collections::HashMap::new();
                for sample in profile.samples {
                    *chains.entry(sample.pcs).or_insert(0) += sample.count;
                }
                (dir.file_name().unwrap().to_string_lossy().into_owned(), chains)
            })
            .collect()
    }

    fn epoch_output(db: &std::path::Path, length: Duration, now: SystemTime) -> Output {
        let _ = std::fs::remove_dir_all(db);
        let database = Database::new(db, super::super::epochs::EpochOptions::new(length), 10_000);
        let first = database.open(now, Default::default()).unwrap();
        Output::Epochs(EpochOutput::new(database, first))
    }

    fn small_state() -> SamplerState {
        // 16 entries: most of the chains below are evicted through the ring.
        let table = crate::table::TableConfig::default().with_entries(16);
        SamplerState::new(
            table,
            None,
            crate::sampler::UnwinderChoice::FramePointer,
            SampleSource::ProcessTimer(crate::sampler::Clock::ProcessCpu),
            crate::sampler::Labels::None,
        )
    }

    #[test]
    fn each_epoch_file_holds_exactly_the_samples_counted_in_it() {
        let db = std::env::temp_dir().join(format!("cpuprof-epochs-exact-{}", std::process::id()));
        let length = Duration::from_secs(1);
        let start = super::super::epochs::epoch_bounds(SystemTime::now(), length).0;
        let mut out = epoch_output(&db, length, start);
        let state = small_state();
        // Epoch e gets (e + 1) * 100 samples of chain [e, k % 40 + 1]: 40 chains an epoch, in a
        // table of 16, so both the table's counts and evicted records cross each boundary.
        for e in 0..5u64 {
            for k in 0..(e + 1) * 100 {
                state.table.record(&[0x1000 + e, 0x2000 + k % 40], 1);
                // The writer's ticks: the ring (256 records of this size) never fills.
                if k % 100 == 99 {
                    out.write_pending(&state, false);
                }
            }
            out.roll_if_due(&state, start + length * (e as u32 + 1), false);
        }
        let finished = out.complete(&state);
        finished.result.unwrap();
        let epochs = read_epochs(&db);
        assert_eq!(epochs.len(), 6, "five rolled epochs and the last (empty) one");
        assert!(state.table.stats.evictions.load(Ordering::Relaxed) > 0);
        assert_eq!(state.table.stats.lost.load(Ordering::Relaxed), 0);
        for (e, (_, chains)) in epochs.iter().enumerate().take(5) {
            let e = e as u64;
            let total: u64 = chains.values().sum();
            assert_eq!(total, (e + 1) * 100, "epoch {e}");
            assert!(
                chains.keys().all(|pcs| pcs[0] == 0x1000 + e),
                "epoch {e} holds another's samples"
            );
            assert_eq!(chains.len(), 40);
        }
        assert!(epochs[5].1.is_empty());
        let _ = std::fs::remove_dir_all(&db);
    }

    #[test]
    fn samples_counted_during_roll_overs_are_written_once() {
        let db = std::env::temp_dir().join(format!("cpuprof-epochs-race-{}", std::process::id()));
        let length = Duration::from_secs(1);
        let start = super::super::epochs::epoch_bounds(SystemTime::now(), length).0;
        let mut out = epoch_output(&db, length, start);
        let state = Arc::new(small_state());
        const PER_THREAD: u64 = 300_000;
        let recorders: Vec<_> = (0..2u64)
            .map(|t| {
                let state = state.clone();
                std::thread::spawn(move || {
                    for k in 0..PER_THREAD {
                        state.table.record(&[0x3000 + t, 0x4000 + k % 64], 1);
                    }
                })
            })
            .collect();
        let mut rolls = 0;
        while recorders.iter().any(|r| !r.is_finished()) || rolls < 3 {
            rolls += 1;
            out.write_pending(&state, rolls % 3 == 0);
            out.roll_if_due(&state, start + length * rolls, false);
        }
        for r in recorders {
            r.join().unwrap();
        }
        out.complete(&state).result.unwrap();
        let written: u64 = read_epochs(&db).iter().flat_map(|(_, c)| c.values()).sum();
        let lost = state.table.stats.lost.load(Ordering::Relaxed);
        assert_eq!(written + lost, 2 * PER_THREAD, "lost {lost}");
        assert_eq!(state.table.stats.samples.load(Ordering::Relaxed), 2 * PER_THREAD);
        assert!(read_epochs(&db).len() >= 4);
        let _ = std::fs::remove_dir_all(&db);
    }
}
