//! One profile from start to stop: the file, the sampler state, the timer and the writer thread.
//!
//! Only one session runs per process (the timer and signal are process-wide); [`global`]
//! holds it for the front ends.

pub mod autostart;
mod contexts;
pub mod epochs;
pub mod global;
mod mappings;
pub mod options;
pub mod process_end;
mod profile_file;
mod timing;
pub mod wall;
mod writer;

use crate::error::Error;
use crate::format::{ProfileWriter, SlotFormat};
use crate::sampler::{self, SampleSource, SamplerState};
use crate::sys::procfs::read_self_maps;
pub use options::Options;
use profile_file::ProfileFile;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;
use writer::WriterControl;

/// The profile file being written, the first error writing it hit, and the code mappings
/// seen while profiling.
pub struct OutputFile {
    writer: ProfileWriter<ProfileFile>,
    error: Option<std::io::Error>,
    mappings: mappings::SeenMappings,
    /// The contexts of the records written (wall mode).
    contexts: contexts::RecordContexts,
    /// The wall-clock profile written beside this CPU profile: it takes the samples that
    /// carry a context.
    beside: Option<Box<OutputFile>>,
    /// It holds a wall sampler's samples: its trailer says how many looks are missing
    /// (`# wall-looks`).
    wall: bool,
}

impl OutputFile {
    /// The profile going to `file`, its header written. `thread_labels`: its samples carry
    /// their threads, and it says so.
    fn new(file: ProfileFile, period_us: u64, thread_labels: bool) -> std::io::Result<OutputFile> {
        let writer = ProfileWriter::new(file, SlotFormat::NATIVE, period_us)?;
        let mut mappings = mappings::SeenMappings::default();
        mappings.record(&read_self_maps());
        Ok(OutputFile {
            writer,
            error: None,
            mappings,
            contexts: contexts::RecordContexts::new(thread_labels),
            beside: None,
            wall: false,
        })
    }

    /// Creates the file at `path` (not followed if a symbolic link, never blocking; regular
    /// files and /dev/null) with its header.
    fn create(path: &Path, period_us: u64, thread_labels: bool) -> std::io::Result<OutputFile> {
        OutputFile::new(ProfileFile::create(path)?, period_us, thread_labels)
    }
}

/// What a finished profile holds: gperftools' `PROFILE:` line, in numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The file written; `None` for a profile kept in memory.
    pub path: Option<PathBuf>,
    /// Signals that produced a sample.
    pub interrupts: u64,
    /// Records evicted from the table while running.
    pub evictions: u64,
    /// Bytes of the file, maps included.
    pub bytes: u64,
    /// Samples that could not be stored (eviction buffer full, or contention).
    pub lost: u64,
    /// Threads that were never sampled because no timer could be armed for them.
    pub unsampled_threads: usize,
}

impl Summary {
    /// gperftools' summary line, with the lost-sample count appended.
    pub fn summary_line(&self) -> String {
        format!(
            "PROFILE: interrupts/evictions/bytes = {}/{}/{} (lost samples: {})",
            self.interrupts, self.evictions, self.bytes, self.lost
        )
    }

    /// The summary line of a profile whose file is not whole (write error, descriptor taken
    /// over, file deleted): `bytes` is what the file holds, and the line says it is incomplete.
    pub fn incomplete_summary_line(&self) -> String {
        format!(
            "PROFILE: interrupts/evictions/bytes = {}/{}/{} (lost samples: {}; INCOMPLETE: the file does not hold the whole profile)",
            self.interrupts, self.evictions, self.bytes, self.lost
        )
    }
}

pub struct Session {
    path: PathBuf,
    pid: u32,
    started: SystemTime,
    options: Options,
    state: Arc<SamplerState>,
    control: Arc<WriterControl>,
    writer: Option<JoinHandle<writer::Finished>>,
    source: SampleSource,
    /// Whether this session holds the `/proc/self/mem` descriptor (`unwind::safe_read`).
    reads_memory: bool,
    /// Wall mode's sampler of threads off the CPU (`session::wall`).
    wall: Option<wall::WallSampler>,
    /// The profiling signal.
    signal: std::ffi::c_int,
}

impl Session {
    /// Creates the file (in epoch mode, `path` is the database and this creates the first
    /// epoch's), writes the header, and starts sampling.
    pub fn start(path: &Path, options: Options) -> Result<Session, Error> {
        let (source, signal) = timing::choose(&options)?;
        let wall = options.wall || options.wall_beside.is_some();
        if wall && !matches!(source, SampleSource::ThreadTimers(_)) {
            // A process-wide timer's signal may go to a blocked thread and interrupt its call.
            return Err(Error::Timer(std::io::Error::other(
                "wall-clock profiling needs per-thread timers, which are unavailable",
            )));
        }
        if options.epochs.is_some() && options.wall_beside.is_some() {
            return Err(Error::Open {
                path: path.to_path_buf(),
                source: std::io::Error::other("a wall-clock profile is not taken beside a profile database"),
            });
        }
        let open_error = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        if options.in_memory.is_some() && (options.epochs.is_some() || options.wall_beside.is_some()) {
            return Err(Error::Open {
                path: path.to_path_buf(),
                source: std::io::Error::other(
                    "a profile kept in memory is one profile: no database of epochs, no wall-clock profile beside it",
                ),
            });
        }
        // Thread labels of CPU samples; a wall profile labels every sample anyway, and beside a
        // CPU profile the labelled samples are the wall profile's.
        let thread_labels = options.thread_labels && !wall;
        crate::sys::thread_names::want(thread_labels);
        let output = match &options.epochs {
            Some(epoch_options) => {
                let db = epochs::Database::new(path, epoch_options.clone(), options.period_us())
                    .with_thread_labels(thread_labels);
                let first = db.open(SystemTime::now(), Default::default()).map_err(open_error)?;
                db.apply_budget(SystemTime::now());
                writer::Output::Epochs(writer::EpochOutput::new(db, first))
            }
            None => {
                let mut out = match options.in_memory {
                    Some(limit) => OutputFile::new(ProfileFile::in_memory(limit), options.period_us(), thread_labels),
                    // Not followed if a symbolic link, never blocking, regular files and /dev/null.
                    None => OutputFile::create(path, options.period_us(), thread_labels),
                }
                .map_err(open_error)?;
                out.wall = options.wall;
                if let Some(beside) = &options.wall_beside {
                    let period_us = 1_000_000 / u64::from(beside.frequency.max(1));
                    let mut wall_out =
                        OutputFile::create(&beside.path, period_us, false).map_err(|source| Error::Open {
                            path: beside.path.clone(),
                            source,
                        })?;
                    wall_out.wall = true;
                    out.beside = Some(Box::new(wall_out));
                }
                writer::Output::File(out)
            }
        };
        let state = Arc::new(SamplerState::new(
            options.table,
            options.filter,
            options.unwinder,
            source,
            match &options.wall_beside {
                Some(beside) => sampler::Labels::Beside {
                    cpu_period_ns: options.period_us() * 1000,
                    wall_period_ns: 1_000_000_000 / u64::from(beside.frequency.max(1)),
                },
                None if options.wall => sampler::Labels::All,
                None if thread_labels => sampler::Labels::Threads,
                None => sampler::Labels::None,
            },
        ));
        if options.unwinder == sampler::UnwinderChoice::Auto {
            sampler::set_dwarf(Some(Box::new(crate::unwind::DwarfUnwinder::build())));
        }
        let control = Arc::new(WriterControl::default());
        let writer_thread = {
            let (state, control) = (state.clone(), control.clone());
            let exit_summary = options.report_on_stderr.then(|| path.to_path_buf());
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            // Every signal blocked: the program's signals go to its own threads, and SIGXFSZ
            // from a profile reaching RLIMIT_FSIZE becomes EFBIG here (all writes happen on
            // this thread, the final ones included).
            let builder = std::thread::Builder::new().name("cpuprof-writer".into());
            let thread = crate::sys::thread::spawn_signal_free(builder, move || {
                let _ = tid_tx.send(sampler::thread_timers::gettid());
                writer::run(state, output, control, signal, source, exit_summary)
            })
            .map_err(Error::Spawn)?;
            (thread, tid_rx.recv().ok())
        };
        let (writer_thread, writer_tid) = writer_thread;
        crate::unwind::THREAD_STACKS.register_current_thread();
        let reads_memory = match crate::unwind::safe_read::acquire() {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "cpuprof: cannot open /proc/self/mem ({e}); stacks outside threads' own stacks (signal stacks, coroutines) are not walked"
                );
                false
            }
        };
        sampler::publish(state.clone());
        let mut session = Session {
            path: path.to_path_buf(),
            pid: std::process::id(),
            started: SystemTime::now(),
            options,
            state,
            control,
            writer: Some(writer_thread),
            source,
            reads_memory,
            wall: None,
            signal,
        };
        let mut excluded: Vec<libc::pid_t> = writer_tid.into_iter().collect();
        let wall_frequency = match &session.options.wall_beside {
            Some(beside) => Some(beside.frequency),
            None => session.options.wall.then_some(session.options.frequency),
        };
        if let Some(frequency) = wall_frequency {
            match wall::WallSampler::start(frequency, excluded.clone()) {
                Ok((sampler, tid)) => {
                    session.wall = Some(sampler);
                    excluded.push(tid);
                }
                Err(e) => {
                    let _ = session.stop();
                    return Err(Error::Spawn(e));
                }
            }
        }
        if let Err(e) = timing::start(source, signal, &session.options, excluded) {
            let _ = session.stop();
            return Err(e);
        }
        Ok(session)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn start_time(&self) -> SystemTime {
        self.started
    }

    pub fn samples_so_far(&self) -> u64 {
        self.state.interrupts.load(Ordering::Relaxed)
    }

    /// Writes everything sampled so far to the file (without the trailer).
    pub fn flush(&self) {
        self.control.flush_and_wait();
    }

    /// A complete copy of the profile so far; profiling goes on (not in epoch mode).
    pub fn snapshot(&self) -> Result<Vec<u8>, Error> {
        self.control.snapshot_and_wait().map_err(|source| Error::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Stops sampling, writes the remaining samples, the trailer and the maps, closes the file.
    pub fn stop(self) -> Result<Summary, Error> {
        self.stop_keeping().map(|(summary, _)| summary)
    }

    /// [`stop`](Self::stop), returning the profile's bytes too when it was kept in memory.
    pub fn stop_keeping(mut self) -> Result<(Summary, Option<Vec<u8>>), Error> {
        if std::process::id() != self.pid {
            // A forked child: the writer thread does not exist here, and the file is the
            // parent's. Leave both alone.
            let path = self.path.clone();
            std::mem::forget(self);
            return Err(Error::ForkedChild { path });
        }
        let wall = self.wall.take().map(wall::WallSampler::stop);
        let stopped = timing::stop(self.source);
        let held_back = threads_with_pending(self.signal);
        let unpublished = sampler::unpublish();
        if unpublished.is_some() {
            // No handler can still re-arm these fds or read through the /proc/self/mem
            // descriptor; otherwise they are leaked, never reused.
            sampler::thread_timers::close(stopped.perf_fds);
            if self.reads_memory {
                crate::unwind::safe_read::release();
            }
        }
        // The writer thread collects what is left (with the state unpublished no handler adds
        // samples; if a handler was stuck, the state stays leaked and it still writes what it
        // can see), writes the trailer and maps, and closes the file.
        self.control.request_stop();
        let Some(Ok(finished)) = self.writer.take().map(JoinHandle::join) else {
            let source = std::io::Error::other("the profile writer thread failed");
            return Err(Error::Write {
                path: self.path.clone(),
                source,
            });
        };
        drop(unpublished);
        crate::sys::thread_names::want(false);
        sampler::set_dwarf(None);
        crate::sys::procfs::close();
        let stats = &self.state.table.stats;
        let (interrupts, evictions, lost) = (
            self.state.interrupts.load(Ordering::Relaxed),
            stats.evictions.load(Ordering::Relaxed),
            stats.lost.load(Ordering::Relaxed),
        );
        let report = Summary {
            path: self.options.in_memory.is_none().then(|| self.path.clone()),
            interrupts,
            evictions,
            bytes: finished.bytes,
            lost,
            unsampled_threads: stopped.unsampled_threads,
        };
        if self.options.report_on_stderr {
            match finished.result {
                Ok(()) => eprintln!("{}", report.summary_line()),
                Err(_) => eprintln!("{}", report.incomplete_summary_line()),
            }
            if let (Some(beside), Some(finished)) = (&self.options.wall_beside, &finished.beside) {
                let whole = if finished.result.is_ok() {
                    ""
                } else {
                    " (INCOMPLETE: the file does not hold the whole profile)"
                };
                eprintln!(
                    "cpuprof: wall-clock profile '{}': {} bytes{whole}",
                    beside.path.display(),
                    finished.bytes
                );
            }
            if let Some(w) = wall {
                eprintln!("{}", w.summary_line());
            }
            if held_back > 0 {
                eprintln!(
                    "cpuprof: {held_back} threads keep the profiling signal blocked while they run: their CPU time since \
                     their last sample is not in the profile (the signal is kept out of their waits' masks, where it \
                     would interrupt the wait)"
                );
            }
            if let (n @ 1.., Some(limit)) = (stopped.limit_fallbacks, stopped.lowered_limit) {
                eprintln!(
                    "cpuprof: {n} threads got POSIX CPU timers instead of perf events: the program lowered \
                     RLIMIT_NOFILE to {limit}, below the descriptor numbers perf events use"
                );
            }
            if report.unsampled_threads > 0 {
                eprintln!(
                    "cpuprof: {} threads were not sampled: no timer could be created for them (see the messages above)",
                    report.unsampled_threads
                );
            }
        }
        let beside = match (&self.options.wall_beside, finished.beside) {
            (Some(b), Some(f)) => f.result.map_err(|source| Error::Write {
                path: b.path.clone(),
                source,
            }),
            _ => Ok(()),
        };
        finished
            .result
            .map_err(|source| Error::Write {
                path: self.path.clone(),
                source,
            })
            .and(beside)
            .map(|()| (report, finished.held))
    }
}

/// How many threads of the process have `signal` pending for themselves (`SigPnd` in
/// `/proc/self/task/TID/status`): threads that block it while running, whose samples it holds.
fn threads_with_pending(signal: std::ffi::c_int) -> usize {
    let Some(tids) = crate::sys::procfs::self_tids() else {
        return 0;
    };
    let bit = 1u64 << (signal - 1);
    tids.iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("SigPnd:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .is_some_and(|pending| pending & bit != 0)
            })
        })
        .count()
}
