//! One profile from start to stop: the file, the sampler state, the timer and the writer thread.
//!
//! Only one session runs per process (the timer and signal are process-wide); [`global`]
//! holds it for the front ends.

pub mod autostart;
pub mod children;
pub mod global;
pub mod options;
pub mod process_end;
pub(crate) mod timing;

use crate::error::Error;
use crate::sampler::{self, SampleSource, SamplerState};
use crate::wall;
use crate::writer::{self, threadless, PendingWriter, WriterControl};
pub use options::Options;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

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
    /// Wall mode's sampler of threads off the CPU (`wall`).
    wall: Option<wall::WallSampler>,
    /// The profiling signal.
    signal: std::ffi::c_int,
    /// A forked child's profile, started by `children` (it says nothing on stderr, and its
    /// file goes away at `exec` if it holds no sample).
    forked_child: bool,
}

/// How a session begins.
#[derive(Clone, Copy)]
enum Origin {
    /// Started by the program or its environment: it chooses its timer and signal.
    Program,
    /// The profile of a child forked from a profiling parent (`children`): the parent's timer
    /// kind and signal (the handler is installed: dispositions are inherited across fork) and
    /// its DWARF unwinder (an immutable snapshot of the same memory).
    ForkedChild {
        source: SampleSource,
        signal: std::ffi::c_int,
    },
}

/// The path children's profiles are named from: `path` without the `_<pid>` of the process
/// `pid` that writes it (`CPUPROFILE_USE_PID`), made absolute so that a child that changes
/// directory writes beside its parent.
fn family_base(path: &Path, pid: u32) -> PathBuf {
    let text = path.as_os_str().to_string_lossy();
    let suffix = format!("_{pid}");
    let base = match text.strip_suffix(&suffix) {
        Some(base) if !base.is_empty() => PathBuf::from(base),
        _ => path.to_path_buf(),
    };
    std::path::absolute(&base).unwrap_or(base)
}

/// Refuses what cannot be profiled together, before anything is created.
fn check_options(path: &Path, options: &Options, source: SampleSource) -> Result<(), Error> {
    let wall = options.wall || options.wall_beside.is_some();
    if wall && !matches!(source, SampleSource::ThreadTimers(_)) {
        // A process-wide timer's signal may go to a blocked thread and interrupt its call.
        return Err(Error::Timer(std::io::Error::other(
            "wall-clock profiling needs per-thread timers, which are unavailable",
        )));
    }
    if let Some(event) = options.event.as_ref().filter(|_| wall || options.epochs.is_some()) {
        return Err(Error::Event(format!(
            "event {}: an event profile is one profile of events: no wall-clock profile, no database of epochs",
            event.name
        )));
    }
    if options.epochs.is_some() && options.wall_beside.is_some() {
        return Err(Error::Open {
            path: path.to_path_buf(),
            source: std::io::Error::other("a wall-clock profile is not taken beside a profile database"),
        });
    }
    if options.in_memory.is_some() && (options.epochs.is_some() || options.wall_beside.is_some()) {
        return Err(Error::Open {
            path: path.to_path_buf(),
            source: std::io::Error::other(
                "a profile kept in memory is one profile: no database of epochs, no wall-clock profile beside it",
            ),
        });
    }
    Ok(())
}

/// The handler's state for these options: which samples carry their thread, and with
/// `threadless`, the hook that writes records without a writer thread.
fn sampler_state(options: &Options, source: SampleSource, thread_labels: bool, threadless: bool) -> SamplerState {
    let mut state = SamplerState::new(
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
    );
    if threadless {
        state.call_after_each_sample(threadless::after_sample);
    }
    state
}

/// Takes a use of the /proc/self/mem descriptor (`unwind::safe_read`), saying what is lost
/// without it; returns whether it did.
fn acquire_memory_reads() -> bool {
    match crate::unwind::safe_read::acquire() {
        Ok(()) => true,
        Err(e) => {
            crate::say!(
                "cpuprof: cannot open /proc/self/mem ({e}); stacks outside threads' own stacks (signal stacks, coroutines) are not walked"
            );
            false
        }
    }
}

/// Starts reading the labels the program sets through the custom-labels ABI, if it does, and
/// says so (or why they cannot be read); returns whether they are read.
fn read_custom_labels() -> bool {
    use crate::labels::custom_labels::{discover, Found, ABI_VERSION};
    match discover() {
        Found::Absent => false,
        Found::Reading(object) => {
            crate::say!("cpuprof: reading the labels {object} sets through the custom-labels ABI (v{ABI_VERSION})");
            true
        }
        Found::Unreadable(why) => {
            crate::say!("cpuprof: custom labels are not read: {why}");
            false
        }
    }
}

impl Session {
    /// Creates the file (in epoch mode, `path` is the database and this creates the first
    /// epoch's), writes the header, and starts sampling.
    pub fn start(path: &Path, options: Options) -> Result<Session, Error> {
        Session::start_as(path, options, Origin::Program)
    }

    /// The steps of a start, in this order: the timer and signal are chosen and the options
    /// checked before anything is created; the output is opened (so a path that cannot be
    /// written fails the start with nothing running); the sampler state is made and the
    /// writer started (or left waiting, `threadless`) before the state is published, so that
    /// every sample has somewhere to go; the wall sampler and the timers come last, once the
    /// threads they must leave alone (the writer, the wall sampler) are known; the hooks that
    /// follow forks and complete the profile at a fatal signal follow.
    fn start_as(path: &Path, options: Options, origin: Origin) -> Result<Session, Error> {
        let (source, signal) = match origin {
            Origin::Program => timing::choose(&options)?,
            Origin::ForkedChild { source, signal } => (source, signal),
        };
        check_options(path, &options, source)?;
        let wall = options.wall || options.wall_beside.is_some();
        // Thread labels of CPU samples; a wall profile labels every sample anyway, and beside a
        // CPU profile the labelled samples are the wall profile's.
        let thread_labels = options.thread_labels && !wall;
        crate::in_program::thread_names::want(thread_labels);
        let mut output = writer::Output::open(path, &options, thread_labels)?;
        let summary = options.report_on_stderr && crate::in_program::messages::speaks();
        let threadless = match &mut output {
            writer::Output::Single(out) if writer::can_start_threadless(&options) => {
                out.threadless(path, options.table.max_depth, summary, options.checkpoint)
            }
            _ => None,
        };
        let state = Arc::new(sampler_state(&options, source, thread_labels, threadless.is_some()));
        if options.unwinder == sampler::UnwinderChoice::Auto && matches!(origin, Origin::Program) {
            sampler::set_dwarf(Some(Box::new(crate::unwind::DwarfUnwinder::build())));
        }
        let control = Arc::new(WriterControl::default());
        let pending = PendingWriter {
            state: state.clone(),
            output,
            control: control.clone(),
            signal,
            source,
            exit_summary: summary.then(|| path.to_path_buf()),
            checkpoint_every: options.checkpoint,
        };
        crate::sampler::signals::on_takeover(writer::writer_notices_takeover);
        let (writer_thread, writer_tid) = writer::start_writer(pending, threadless, &options)?;
        crate::unwind::THREAD_STACKS.register_current_thread();
        let reads_memory = acquire_memory_reads();
        let custom_labels = reads_memory && read_custom_labels();
        sampler::publish(state.clone());
        let mut session = Session {
            path: path.to_path_buf(),
            pid: std::process::id(),
            started: SystemTime::now(),
            options,
            state,
            control,
            writer: writer_thread,
            source,
            reads_memory,
            wall: None,
            signal,
            forked_child: matches!(origin, Origin::ForkedChild { .. }),
        };
        let mut excluded: Vec<libc::pid_t> = writer_tid.into_iter().collect();
        if let Err(e) = session.start_wall_sampler(&mut excluded) {
            let _ = session.stop();
            return Err(Error::Spawn(e));
        }
        if let Err(e) = timing::start(source, signal, &session.options, excluded) {
            let _ = session.stop();
            return Err(e);
        }
        session.install_hooks(origin);
        if custom_labels {
            // Labels are written after the maps, by the writer thread: a profile that started
            // without one (a single-threaded process) gets it now, as at a first LabelSet.
            writer::start_waiting_writer();
        }
        Ok(session)
    }

    /// Wall mode: starts the sampler of threads off the CPU, leaving `excluded` alone, and
    /// adds its thread to them.
    fn start_wall_sampler(&mut self, excluded: &mut Vec<libc::pid_t>) -> std::io::Result<()> {
        let wall_frequency = match &self.options.wall_beside {
            Some(beside) => Some(beside.frequency),
            None => self.options.wall.then_some(self.options.frequency),
        };
        if let Some(frequency) = wall_frequency {
            let (sampler, tid) = wall::WallSampler::start(frequency, excluded.clone())?;
            self.wall = Some(sampler);
            excluded.push(tid);
        }
        Ok(())
    }

    /// The hooks of a running profile: forks are followed, and a process that ends by a
    /// signal's default action completes its profile first.
    fn install_hooks(&self, origin: Origin) {
        children::install_fork_handlers();
        if matches!(origin, Origin::Program) && self.options.follow_forks {
            children::begin_family();
        }
        if self.options.in_memory.is_none() {
            // A process that ends by a signal's default action completes its profile first.
            sampler::default_actions::hold(
                sampler::default_actions::Completer::Cpu,
                process_end::before_signal_end,
                &[self.signal],
            );
        }
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
        if threadless::active() {
            // A fatal signal during the write waits for it (its handler needs the file).
            let _quiet = process_end::SignalsHeld::all();
            threadless::flush(&self.state);
        } else {
            self.control.flush_and_wait();
        }
    }

    /// A complete copy of the profile so far; profiling goes on (not in epoch mode).
    pub fn snapshot(&self) -> Result<Vec<u8>, Error> {
        writer::start_waiting_writer();
        if threadless::active() {
            return Err(Error::Write {
                path: self.path.clone(),
                source: std::io::Error::other("no writer thread could be started to take the snapshot"),
            });
        }
        self.control.snapshot_and_wait().map_err(|source| Error::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Whether this is a forked child's profile (`children`).
    pub fn is_forked_child(&self) -> bool {
        self.forked_child
    }

    /// What a child forked from this process needs to start its own profile: its path
    /// (`<base>_<pid>`, and the same for a wall profile beside it), and these options.
    fn child_plan(&self, child_pid: u32) -> (PathBuf, Options, Origin) {
        let mut options = self.options.clone();
        let name = |path: &Path| {
            let mut name = family_base(path, self.pid).into_os_string();
            name.push(format!("_{child_pid}"));
            PathBuf::from(name)
        };
        if let Some(beside) = &mut options.wall_beside {
            beside.path = name(&beside.path);
        }
        let path = if options.epochs.is_some() {
            self.path.clone()
        } else {
            name(&self.path)
        };
        let origin = Origin::ForkedChild {
            source: self.source,
            signal: self.signal,
        };
        (path, options, origin)
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
        sampler::default_actions::release(sampler::default_actions::Completer::Cpu);
        let wall = self.wall.take().map(wall::WallSampler::stop);
        // Before the timers go: deleting a timer drops its pending signal (Linux 6.13 and later).
        let (held_back, held_by_process) = pending(self.signal);
        let stopped = timing::stop(self.source);
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
        let writer = self.writer.take().or_else(|| {
            writer::start_waiting_writer();
            writer::take_late_writer()
        });
        let finished = match writer.map(JoinHandle::join) {
            Some(Ok(finished)) => finished,
            // No thread could be started: the file is completed here.
            None if threadless::complete(&self.state) => {
                let (bytes, failure) = threadless::file_state();
                writer::Finished::completed_in_place(bytes, failure)
            }
            _ => {
                let source = std::io::Error::other("the profile writer thread failed");
                return Err(Error::Write {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        drop(unpublished);
        crate::in_program::thread_names::want(false);
        sampler::set_dwarf(None);
        crate::in_program::procfs::close();
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
        if self.forked_child {
            children::child_profile_stopped(interrupts > 0);
        }
        if self.options.report_on_stderr {
            match finished.result {
                Ok(()) => crate::say!("{}", report.summary_line()),
                Err(_) => crate::say!("{}", report.incomplete_summary_line()),
            }
            if let (Some(beside), Some(finished)) = (&self.options.wall_beside, &finished.beside) {
                let whole = if finished.result.is_ok() {
                    ""
                } else {
                    " (INCOMPLETE: the file does not hold the whole profile)"
                };
                crate::say!(
                    "cpuprof: wall-clock profile '{}': {} bytes{whole}",
                    beside.path.display(),
                    finished.bytes
                );
            }
            if let Some(w) = wall {
                crate::say!("{}", w.summary_line());
            }
            if lost > 0 {
                let reasons: Vec<String> = crate::table::Loss::ALL
                    .iter()
                    .filter_map(|&why| {
                        let n = stats.lost_for(why);
                        (n > 0).then(|| format!("{n} with {}", why.reason()))
                    })
                    .collect();
                crate::say!("cpuprof: {lost} samples lost: {}", reasons.join(", "));
            }
            say_label_losses();
            let shallow = stats.without_callers.load(Ordering::Relaxed);
            if shallow > 0 {
                crate::say!(
                    "cpuprof: {shallow} samples were recorded at their function without its callers: all {} walk \
                     workspaces were in use (handlers preempted in great numbers on a loaded machine)",
                    self.state.workspace_count()
                );
            }
            if held_back > 0 {
                crate::say!(
                    "cpuprof: {held_back} threads keep the profiling signal blocked while they run: their CPU time since \
                     their last sample is not in the profile (the signal is kept out of their waits' masks, where it \
                     would interrupt the wait, and out of their sigwait sets and signalfds)"
                );
            }
            if held_by_process {
                crate::say!(
                    "cpuprof: the process timer's signal ({}) is pending: the program's threads keep it blocked while \
                     they run, and the CPU time since it was last taken is not in the profile (the signal is kept out \
                     of their waits' masks, sigwait sets and signalfds)",
                    crate::sampler::signals::signal_name(self.signal)
                );
            }
            if let (n @ 1.., Some(limit)) = (stopped.limit_fallbacks, stopped.lowered_limit) {
                crate::say!(
                    "cpuprof: {n} threads got POSIX CPU timers instead of perf events: the program lowered \
                     RLIMIT_NOFILE to {limit}, below the descriptor numbers perf events use"
                );
            }
            if !self.forked_child && self.options.follow_forks && self.options.in_memory.is_none() {
                children::say_at_stop(&self.path);
            }
            if report.unsampled_threads > 0 {
                crate::say!(
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

/// What the label caps cost, if anything: sets over the cap, strings cut, custom labels that
/// could not be read.
fn say_label_losses() {
    let (over_cap, cut) = crate::labels::losses();
    if over_cap > 0 {
        crate::say!(
            "cpuprof: {over_cap} label sets came over the cap on distinct sets ({} of cpuprof's, {} read through the \
             custom-labels ABI): their samples are labelled cpuprof.labels=over-cap",
            crate::labels::MAX_SETS,
            crate::labels::MAX_FOREIGN_SETS
        );
    }
    if cut > 0 {
        crate::say!(
            "cpuprof: {cut} label keys, values or pairs were cut to the caps ({} bytes per key, {} per value, {} pairs)",
            crate::labels::MAX_KEY,
            crate::labels::MAX_VALUE,
            crate::labels::MAX_PAIRS
        );
    }
    let unreadable = crate::labels::custom_labels::unreadable_samples();
    if unreadable > 0 {
        crate::say!(
            "cpuprof: {unreadable} samples are without their custom labels, which could not be read (changed while \
             they were copied, or not mapped)"
        );
    }
}

/// How many threads of the process have `signal` pending for themselves (`SigPnd` in
/// `/proc/self/task/TID/status`): threads that block it while running, whose samples it holds
/// (per-thread timers). And whether it is pending for the process (`ShdPnd`): the process
/// timer's signal, when every thread blocks it (a daemon that takes its signals from a
/// signalfd or sigwait blocks them all).
fn pending(signal: std::ffi::c_int) -> (usize, bool) {
    let bit = 1u64 << (signal - 1);
    let has = |status: &str, field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|pending| pending & bit != 0)
    };
    let process = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| has(&s, "ShdPnd:"));
    let Some(tids) = crate::in_program::procfs::self_tids() else {
        return (0, process);
    };
    let holding = |tid: &&libc::pid_t| {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).is_ok_and(|s| has(&s, "SigPnd:"))
    };
    let first: Vec<&libc::pid_t> = tids.iter().filter(holding).collect();
    // A thread the program has just joined is still listed (and still holds its pending
    // signals) while it finishes leaving: looked at again a moment later, it is gone.
    if !first.is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let threads = first.into_iter().filter(holding).count();
    (threads, process)
}
