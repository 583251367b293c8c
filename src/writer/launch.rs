//! Starting the writer thread: at once, or, for a profile started in a single-threaded
//! process, later (`threadless`: the signal handler writes the records meanwhile), when the
//! program starts its first thread of its own or a control-plane call needs the writer.

use super::{threadless, Finished, Output, WriterControl};
use crate::error::Error;
use crate::sampler::{self, SampleSource, SamplerState};
use crate::session::Options;
use crate::sync::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What the writer thread needs to run.
pub(crate) struct PendingWriter {
    pub state: Arc<SamplerState>,
    pub output: Output,
    pub control: Arc<WriterControl>,
    pub signal: std::ffi::c_int,
    pub source: SampleSource,
    pub exit_summary: Option<PathBuf>,
    pub checkpoint_every: Option<std::time::Duration>,
}

impl PendingWriter {
    fn run(self) -> Finished {
        super::run(
            self.state,
            self.output,
            self.control,
            self.signal,
            self.source,
            self.exit_summary,
            self.checkpoint_every,
        )
    }

    /// Takes the file over from `threadless` (what it wrote, or the file it completed), then
    /// runs.
    fn run_after_threadless(mut self) -> Finished {
        if let Some(handed) = threadless::hand_over() {
            if handed.completed {
                return Finished::completed_elsewhere(handed.file_bytes);
            }
            self.output.note_written_elsewhere(handed);
        }
        self.run()
    }
}

/// The writer of a profile started in a single-threaded process, waiting for the process's
/// first thread of its own (`threadless`).
static WAITING_WRITER: Mutex<Option<PendingWriter>> = Mutex::new(None);
/// Set while a writer waits; taken by the one call that starts it.
static WRITER_WAITS: AtomicBool = AtomicBool::new(false);
/// The process whose writer waits (a vfork child, sharing its memory, never starts it).
static WRITER_WAITS_IN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// The writer started late, for `stop` to join.
static LATE_WRITER: Mutex<Option<JoinHandle<Finished>>> = Mutex::new(None);

/// Starts the writer of a profile that began in a single-threaded process, if one waits: the
/// program is about to start a thread of its own (libcpuprof.so's `pthread_create`), or a
/// control-plane call needs the writer. Not for signal context.
pub fn start_waiting_writer() {
    if WRITER_WAITS_IN.load(Ordering::SeqCst) != std::process::id() || !WRITER_WAITS.swap(false, Ordering::SeqCst) {
        return;
    }
    let builder = std::thread::Builder::new().name("cpuprof-writer".into());
    let spawned = crate::in_program::thread::spawn_signal_free(builder, || {
        // Before the file is handed over: an `_exit` or fatal signal from now on waits for this
        // writer (which may take a while to start) rather than finding no writer at all.
        super::claim_process();
        sampler::thread_timers::leave_calling_thread_unsampled();
        // Not in the match: its temporary guard would hold the lock for the writer's life.
        let pending = WAITING_WRITER.lock().take();
        match pending {
            Some(pending) => pending.run_after_threadless(),
            None => Finished::completed_elsewhere(0),
        }
    });
    match spawned {
        Ok(handle) => *LATE_WRITER.lock() = Some(handle),
        Err(e) => {
            // The profile goes on being written without a thread.
            WRITER_WAITS.store(true, Ordering::SeqCst);
            crate::say!(
                "cpuprof: cannot start the profile's writer thread ({e}); records are written by the signal handler"
            );
        }
    }
}

/// Before `dlclose` (libcpuprof.so interposes it) in a process whose writer waits: the
/// mappings and build-ids of the objects loaded now are recorded, as the writer records them
/// when the loaded objects change, so code unloaded before the profile ends keeps its maps
/// line. (A running writer notices unloads itself; `dlopen` needs nothing: what it maps is in
/// the maps at the end unless unloaded, which passes here.) Not for signal context.
pub fn before_unload() {
    if WRITER_WAITS_IN.load(Ordering::SeqCst) != std::process::id() || !WRITER_WAITS.load(Ordering::SeqCst) {
        return;
    }
    if let Some(pending) = WAITING_WRITER.lock().as_mut() {
        pending
            .output
            .record_mappings(&crate::in_program::procfs::read_self_maps());
    }
}

/// The waiting and late writers' locks, held across `fork` (`children`).
pub(crate) fn fork_locks() -> [&'static dyn crate::sync::ForkLock; 2] {
    [&WAITING_WRITER, &LATE_WRITER]
}

/// In a forked child: the parent's waiting writer (its file) and late writer thread are not
/// the child's. Forgotten, never run, joined or freed here.
pub(crate) fn forget_writers_in_child() {
    WRITER_WAITS.store(false, Ordering::SeqCst);
    std::mem::forget(WAITING_WRITER.lock().take());
    std::mem::forget(LATE_WRITER.lock().take());
}

/// The program replaced one of cpuprof's signal handlers (through the interposed `sigaction`):
/// a waiting writer starts, to notice it and stop sampling rather than feed the program's
/// handler our signals (`timing::taken_over`; the writer checks at every tick).
pub(crate) fn writer_notices_takeover(_signal: std::ffi::c_int) {
    start_waiting_writer();
    super::wake();
}

/// Spawns the writer thread now; returns it and its thread id.
fn spawn_writer(pending: PendingWriter) -> Result<(JoinHandle<Finished>, Option<libc::pid_t>), Error> {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    // Every signal blocked: the program's signals go to its own threads, and SIGXFSZ from a
    // profile reaching RLIMIT_FSIZE becomes EFBIG here (all writes happen on this thread, the
    // final ones included).
    let builder = std::thread::Builder::new().name("cpuprof-writer".into());
    let thread = crate::in_program::thread::spawn_signal_free(builder, move || {
        super::claim_process();
        let _ = tid_tx.send(sampler::thread_timers::gettid());
        pending.run()
    })
    .map_err(Error::Spawn)?;
    Ok((thread, tid_rx.recv().ok()))
}

/// Whether a profile with these options can start without a thread of cpuprof's: a single
/// file of plain CPU samples, in a single-threaded process whose thread creation libcpuprof.so
/// sees (so the writer starts with the program's first thread). Wall-clock profiles, databases
/// and labelled or in-memory profiles need their threads from the start.
pub(crate) fn can_start_threadless(options: &Options) -> bool {
    threadless::deferral_enabled()
        && options.in_memory.is_none()
        && options.epochs.is_none()
        && !options.wall
        && options.wall_beside.is_none()
        && !options.thread_labels
        && crate::in_program::procfs::self_thread_count() == Some(1)
}

/// Starts the writer thread, or with `threadless`, leaves it waiting for the program's first
/// thread (the handler writes meanwhile); returns the thread and its id, if it started.
pub(crate) fn start_writer(
    pending: PendingWriter,
    threadless: Option<Box<threadless::Threadless>>,
    options: &Options,
) -> Result<(Option<JoinHandle<Finished>>, Option<libc::pid_t>), Error> {
    match threadless {
        Some(threadless) => {
            threadless::publish(threadless);
            // Not in an event profile: the handler arms POSIX CPU timers, which count time.
            if matches!(pending.source, SampleSource::ThreadTimers(_)) && options.event.is_none() {
                let period_ns = options.thread_period();
                sampler::unannounced::watch(pending.signal, period_ns, sampler::thread_timers::gettid());
            }
            *WAITING_WRITER.lock() = Some(pending);
            WRITER_WAITS_IN.store(std::process::id(), Ordering::SeqCst);
            WRITER_WAITS.store(true, Ordering::SeqCst);
            Ok((None, None))
        }
        None => {
            let (thread, tid) = spawn_writer(pending)?;
            Ok((Some(thread), tid))
        }
    }
}

/// The writer started late (by [`start_waiting_writer`]), for `stop` to join.
pub(crate) fn take_late_writer() -> Option<JoinHandle<Finished>> {
    LATE_WRITER.lock().take()
}
