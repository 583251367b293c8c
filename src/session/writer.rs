//! The writer thread: moves samples from the table to the file while profiling runs.
//!
//! Every tick it checks that the application has not taken the profiling signal over (if it
//! has, sampling stops rather than feed its handler), resolves stack-range requests from the
//! handlers, arms threads nothing announced, replaces the DWARF unwinder if libraries were
//! loaded or unloaded, and drains evicted records. The tick adapts to the eviction rate: it
//! doubles up to 50 ms while the ring fills slowly (each wake-up costs ~100 us of CPU on these
//! VMs, so a fixed 20 ms tick alone was 0.5 % of a CPU), and shrinks, down to 5 ms, to what
//! drains a quarter of the ring per tick at the rate just seen. 50 ms bounds the loss to a
//! sudden burst: the default 2 MiB ring holds 50 ms of 100,000 evictions per second of
//! 50-frame chains.
//! It also harvests the counts held in the table, first after one second and then at doubling
//! intervals up to 30 s, so that a process killed without warning leaves a readable file with
//! recent samples, while a long-running server does not grow its file with every tick.
//!
//! Checkpoints (`CPUPROFILE_CHECKPOINT`, every 2 s by default) keep the file a complete
//! profile at every moment: records are held in memory between them, and each checkpoint
//! writes them with a tail that completes the profile: the counts still in the table (copied,
//! not taken: the file does not grow by them), the trailer, the maps with their build-ids,
//! the signal weights, the process line. The next checkpoint writes over that tail
//! (`session::profile_file`). Nothing is written while nothing was sampled or loaded.
//!
//! Code that ends the process without `atexit` (`_exit`, `exec`; see `process_end`) may run in
//! a signal handler, so it cannot take the locks of [`WriterControl`]: it asks through the
//! atomics below, wakes the writer with a futex, and waits on another, for a bounded time.

use super::contexts::RecordContexts;
use super::epochs::{Database, Epoch};
use super::mappings::SeenMappings;
use super::timing;
use super::OutputFile;
use crate::format::writer::{encode_record, record_size};
use crate::format::{ProcessLine, SampleContext, SignalWeights, SlotFormat, TRAILER};
use crate::sampler::{self, SampleSource, SamplerState};
use crate::sys::futex;
use crate::sys::procfs::read_self_maps;
use crate::unwind::dwarf::loaded_objects_generation;
use crate::unwind::THREAD_STACKS;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Longest tick: a library loaded with dlopen is unwound through, and a thread nothing
/// announced is armed, within this.
const MAX_TICK: Duration = Duration::from_millis(50);
const MIN_TICK: Duration = Duration::from_millis(5);
const FIRST_HARVEST: Duration = Duration::from_secs(1);
/// Records held for the next checkpoint beyond which it comes at once.
const MAX_HELD_BYTES: usize = 1 << 20;
const MAX_HARVEST_INTERVAL: Duration = Duration::from_secs(30);

/// The process whose writer thread runs (0: none). A forked or vfork'ed child inherits the
/// number of its parent, so it never asks a writer that is not its own (nor touches the
/// parent's memory, which a vfork child shares, beyond reading this).
static WRITER_PID: AtomicU32 = AtomicU32::new(0);
/// Bumped by every request; the writer sleeps on it between ticks.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// Requests of the process-ending paths asked and served so far (served once the writer has
/// written everything sampled before the request, or has finished the file).
static ENDS_ASKED: AtomicU32 = AtomicU32::new(0);
static ENDS_SERVED: AtomicU32 = AtomicU32::new(0);
/// Set by `_exit`: the writer finishes the file (records, trailer, maps) and ends.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set by `exec` until it fails: in epoch mode the writer completes the epoch file and opens
/// no other, so that an exec that succeeds leaves no temporary file behind.
static EXEC_PENDING: AtomicBool = AtomicBool::new(false);

fn wake_writer() {
    WAKE.fetch_add(1, Ordering::SeqCst);
    futex::wake_all(&WAKE);
}

/// What became of a request of a process-ending path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndRequest {
    /// No writer runs in this process (none started, or this is a forked child).
    NoWriter,
    Served,
    /// The writer did not answer in time (it may be blocked on a lock the interrupted code
    /// holds, when the request comes from a signal handler).
    TimedOut,
}

/// Asks the writer thread to write everything sampled so far to the file (and with `exit`,
/// the trailer and the maps, closing it) and waits for it, at most `limit`.
/// Async-signal-safe: atomics, futexes and clock_gettime only.
pub fn request_end(exit: bool, limit: Duration) -> EndRequest {
    // SAFETY: getpid has no preconditions (and is not cached by glibc: right in a vfork child).
    let pid = unsafe { libc::getpid() } as u32;
    if WRITER_PID.load(Ordering::SeqCst) != pid {
        return EndRequest::NoWriter;
    }
    if exit {
        EXITING.store(true, Ordering::SeqCst);
    } else {
        EXEC_PENDING.store(true, Ordering::SeqCst);
    }
    let mine = ENDS_ASKED.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
    wake_writer();
    let deadline = futex::monotonic_now() + limit;
    loop {
        let served = ENDS_SERVED.load(Ordering::SeqCst);
        if served.wrapping_sub(mine) as i32 >= 0 {
            return EndRequest::Served;
        }
        let now = futex::monotonic_now();
        if now >= deadline {
            return EndRequest::TimedOut;
        }
        futex::wait(&ENDS_SERVED, served, deadline - now);
    }
}

/// Wakes the writer to look at once (the program took the profiling signal over).
/// Async-signal-safe.
pub fn wake() {
    wake_writer();
}

/// The exec that `request_end(false, ..)` prepared for failed: the writer carries on.
/// Async-signal-safe.
pub fn exec_failed() {
    EXEC_PENDING.store(false, Ordering::SeqCst);
    wake_writer();
}

/// Whether process `pid` has a writer thread running (false in a forked child).
/// Async-signal-safe.
pub fn runs_in(pid: u32) -> bool {
    WRITER_PID.load(Ordering::SeqCst) == pid
}

/// The writer has closed the file: every request so far is answered.
fn writer_gone() {
    WRITER_PID.store(0, Ordering::SeqCst);
    ENDS_SERVED.store(ENDS_ASKED.load(Ordering::SeqCst), Ordering::SeqCst);
    futex::wake_all(&ENDS_SERVED);
}

/// Requests from the controlling thread to the writer thread. std's lock and condition
/// variable: each session has its own, so a forked child never uses the parent's.
#[derive(Default)]
pub struct WriterControl {
    state: std::sync::Mutex<Requests>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct Requests {
    stop: bool,
    flush_requested: u64,
    flush_done: u64,
    /// Flush requests that also want a complete copy of the profile so far.
    snapshot_requested: u64,
    /// The copy for the latest snapshot request served.
    snapshot: Option<io::Result<Vec<u8>>>,
}

impl WriterControl {
    fn requests(&self) -> std::sync::MutexGuard<'_, Requests> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn request_stop(&self) {
        self.requests().stop = true;
        self.changed.notify_all();
        wake_writer();
    }

    /// Asks for everything sampled so far to reach the file, and waits until it has.
    pub fn flush_and_wait(&self) {
        let mut s = self.requests();
        s.flush_requested += 1;
        let wanted = s.flush_requested;
        self.changed.notify_all();
        wake_writer();
        while s.flush_done < wanted && !s.stop {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Flushes, then returns a complete profile of everything sampled so far (the records
    /// written, then a trailer and the maps as they are now); profiling goes on.
    pub fn snapshot_and_wait(&self) -> io::Result<Vec<u8>> {
        let mut s = self.requests();
        s.flush_requested += 1;
        let wanted = s.flush_requested;
        s.snapshot_requested = wanted;
        self.changed.notify_all();
        wake_writer();
        while s.flush_done < wanted && !s.stop {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match s.snapshot.take() {
            Some(snapshot) if s.flush_done >= wanted => snapshot,
            _ => Err(io::Error::other("the profile stopped before the snapshot was taken")),
        }
    }
}

/// How the profile ended: the bytes in the file, and whether it holds the whole profile.
pub struct Finished {
    pub bytes: u64,
    pub result: io::Result<()>,
    /// The profile's bytes, when it was kept in memory.
    pub held: Option<Vec<u8>>,
    /// The wall-clock profile written beside the CPU profile, if any.
    pub beside: Option<Box<Finished>>,
}

impl Finished {
    /// The file was completed before the writer thread could start (`session::threadless`).
    pub fn completed_elsewhere(bytes: u64) -> Finished {
        Finished::completed_in_place(bytes, None)
    }

    /// The file was completed in place, holding `bytes`, whole unless a write failed
    /// (`failure`: see `threadless::HandedOver::failure`).
    pub fn completed_in_place(bytes: u64, failure: Option<i32>) -> Finished {
        Finished {
            bytes,
            result: match failure {
                None => Ok(()),
                Some(failure) => Err(failure_error(failure)),
            },
            held: None,
            beside: None,
        }
    }
}

/// The error of a write refused in `threadless` (an errno, or its descriptor taken).
fn failure_error(failure: i32) -> io::Error {
    match failure {
        super::threadless::DESCRIPTOR_TAKEN => io::Error::other(
            "its descriptor was closed or replaced by the program; cpuprof abandoned it without using or closing it",
        ),
        errno => io::Error::from_raw_os_error(errno),
    }
}

/// Makes this process the one whose writer runs, before the writer thread reports its id:
/// an `_exit` right after the profile starts must find it.
pub fn claim_process() {
    WRITER_PID.store(std::process::id(), Ordering::SeqCst);
}

/// In a forked child: the parent's writer and its requests are not the child's.
pub fn forget_in_child() {
    WRITER_PID.store(0, Ordering::SeqCst);
    EXITING.store(false, Ordering::SeqCst);
    EXEC_PENDING.store(false, Ordering::SeqCst);
    ENDS_SERVED.store(ENDS_ASKED.load(Ordering::SeqCst), Ordering::SeqCst);
}

/// Moves samples to `out` until asked to stop (or the process exits with `_exit`), then writes
/// what is left, the trailer and the maps, and closes the file. `exit_summary`: the profile's
/// path, if the summary line is to be printed when `_exit` ends the profile (`stop` prints it
/// otherwise).
///
/// Each tick does the duties below in this order; the order matters where a comment says so.
pub fn run(
    state: Arc<SamplerState>,
    out: Output,
    control: Arc<WriterControl>,
    profiling_signal: i32,
    source: SampleSource,
    exit_summary: Option<PathBuf>,
    checkpoint_every: Option<Duration>,
) -> Finished {
    let mut writer = Writer::start(
        state,
        out,
        control,
        profiling_signal,
        source,
        exit_summary,
        checkpoint_every,
    );
    loop {
        writer.wait_for_work();
        let asked = writer.requests();
        if asked.stop || asked.exiting {
            return writer.finish(&asked);
        }
        writer.stop_if_taken_over();
        THREAD_STACKS.resolve_requests();
        writer.check_memory_descriptor();
        writer.follow_threads();
        writer.follow_loaded_objects();
        let harvest = writer.harvest_due();
        let flushing = asked.flush > writer.control.requests().flush_done;
        let ending = asked.ends != ENDS_SERVED.load(Ordering::SeqCst);
        writer.write_records(harvest || flushing || ending, ending);
        writer.checkpoint_if_due(flushing);
        if flushing {
            writer.answer_flush(&asked);
        }
        if ending {
            answer_ends(asked.ends);
        }
    }
}

/// The writer thread's state between ticks.
struct Writer {
    state: Arc<SamplerState>,
    out: Output,
    control: Arc<WriterControl>,
    profiling_signal: i32,
    source: SampleSource,
    exit_summary: Option<PathBuf>,
    checkpoint_every: Option<Duration>,
    /// The program took the profiling signal over; sampling has stopped.
    taken_over: bool,
    harvest_interval: Duration,
    next_harvest: Instant,
    /// The loader's counters when the maps were last recorded.
    objects_seen: (u64, u64),
    /// This thread holds a use of the /proc/self/mem descriptor, released at the end.
    reads_memory: bool,
    next_checkpoint: Instant,
    /// What the last checkpoint held: samples taken and the loader's counters.
    checkpointed: Option<(u64, (u64, u64))>,
    /// A lost /proc/self/mem descriptor was reported (once).
    memory_descriptor_noted: bool,
    tick: Duration,
    last_drain: Instant,
}

/// What was asked of the writer when it woke: by the controlling thread (`control`), and by the
/// process-ending paths (the atomics).
struct Asked {
    stop: bool,
    /// The latest flush request.
    flush: u64,
    /// The latest flush request wants a snapshot too.
    snapshot: bool,
    /// `ENDS_ASKED` as read now.
    ends: u32,
    exiting: bool,
}

impl Writer {
    /// Claims the process, stops at once if the program took the signal over, records the maps
    /// and sets up checkpoints.
    fn start(
        state: Arc<SamplerState>,
        mut out: Output,
        control: Arc<WriterControl>,
        profiling_signal: i32,
        source: SampleSource,
        exit_summary: Option<PathBuf>,
        checkpoint_every: Option<Duration>,
    ) -> Writer {
        WRITER_PID.store(std::process::id(), Ordering::SeqCst);
        // First of all (before the maps and build-ids, which take a while): a writer started
        // because the program took the profiling signal over stops sampling at once.
        let taken_over = timing::taken_over(profiling_signal);
        if taken_over {
            timing::stop_after_takeover(source, profiling_signal);
        }
        let harvest_interval = FIRST_HARVEST;
        let next_harvest = Instant::now() + harvest_interval;
        // The loader's counters before the maps: an object loaded before they are read is in the
        // maps read after, one loaded later changes them. (The program runs meanwhile: maps read
        // by `Session::start`, before this thread ran, could miss a library loaded in between.)
        let objects_seen = loaded_objects_generation();
        // The writer reads mapped ELF images for their build-ids, up to the end of the file,
        // after the session has let go of the /proc/self/mem descriptor: it holds its own use.
        let reads_memory = crate::unwind::safe_read::acquire().is_ok();
        out.record_mappings(&read_self_maps());
        if checkpoint_every.is_some() {
            remember_process_line();
            out.hold_records();
        }
        Writer {
            state,
            out,
            control,
            profiling_signal,
            source,
            exit_summary,
            checkpoint_every,
            taken_over,
            harvest_interval,
            next_harvest,
            objects_seen,
            reads_memory,
            // The first checkpoint at once: a process that ends however it may leaves a
            // complete (maybe empty) profile.
            next_checkpoint: Instant::now(),
            checkpointed: None,
            memory_descriptor_noted: false,
            tick: MIN_TICK,
            last_drain: Instant::now(),
        }
    }

    /// Sleeps for a tick (cut short at an epoch's end), unless a request is waiting already;
    /// any request wakes it.
    fn wait_for_work(&self) {
        let woken = WAKE.load(Ordering::SeqCst);
        let idle = {
            let s = self.control.requests();
            !s.stop && s.flush_done == s.flush_requested
        };
        if idle && ENDS_ASKED.load(Ordering::SeqCst) == ENDS_SERVED.load(Ordering::SeqCst) {
            futex::wait(&WAKE, woken, self.out.wait_at_most(self.tick, SystemTime::now()));
        }
    }

    /// What is asked now: read once per tick, so that the tick answers what it served.
    fn requests(&self) -> Asked {
        let (stop, flush, snapshot) = {
            let s = self.control.requests();
            (s.stop, s.flush_requested, s.snapshot_requested > s.flush_done)
        };
        Asked {
            stop,
            flush,
            snapshot,
            ends: ENDS_ASKED.load(Ordering::SeqCst),
            exiting: EXITING.load(Ordering::SeqCst),
        }
    }

    /// At stop or `_exit`: completes the output, lets go of the /proc/self/mem descriptor,
    /// prints the summary if `_exit` ended the profile, and answers every request.
    fn finish(self, asked: &Asked) -> Finished {
        let finished = self.out.complete(&self.state);
        if self.reads_memory {
            crate::unwind::safe_read::release();
        }
        if let Some(path) = self.exit_summary.filter(|_| asked.exiting && !asked.stop) {
            print_exit_summary(&self.state, &finished, path);
        }
        writer_gone();
        finished
    }

    /// Stops sampling if the program has taken the profiling signal over (rather than feed its
    /// handler our signals).
    fn stop_if_taken_over(&mut self) {
        if !self.taken_over && timing::taken_over(self.profiling_signal) {
            self.taken_over = true;
            timing::stop_after_takeover(self.source, self.profiling_signal);
        }
    }

    /// Reopens the /proc/self/mem descriptor if the program closed or replaced it, saying so
    /// once.
    fn check_memory_descriptor(&mut self) {
        match crate::unwind::safe_read::check() {
            Ok(false) => {}
            _ if self.memory_descriptor_noted => {}
            Ok(true) => {
                self.memory_descriptor_noted = true;
                crate::say!(
                    "cpuprof: the program closed or replaced cpuprof's /proc/self/mem descriptor; opened it again"
                );
            }
            Err(e) => {
                self.memory_descriptor_noted = true;
                crate::say!("cpuprof: the program closed cpuprof's /proc/self/mem descriptor and it cannot be opened again ({e}); stacks outside threads' own stacks are no longer walked");
            }
        }
    }

    /// Walk workspaces for the threads there are, and timers for threads nothing announced.
    fn follow_threads(&self) {
        // Workspaces first: the poll may arm threads that have not yet reached their start.
        if let Some(threads) = crate::sys::procfs::self_thread_count() {
            self.state.ensure_workspaces(threads);
        }
        sampler::thread_timers::sync_with_tasks();
    }

    /// When objects were loaded or unloaded: their maps are recorded and the DWARF unwinder
    /// rebuilt.
    fn follow_loaded_objects(&mut self) {
        let generation = loaded_objects_generation();
        if generation != self.objects_seen {
            self.objects_seen = generation;
            self.out.record_mappings(&read_self_maps());
            sampler::refresh_dwarf();
        }
    }

    /// Whether the table's counts are harvested this tick (at doubling intervals).
    fn harvest_due(&mut self) -> bool {
        let due = Instant::now() >= self.next_harvest;
        if due {
            self.harvest_interval = (self.harvest_interval * 2).min(MAX_HARVEST_INTERVAL);
            self.next_harvest = Instant::now() + self.harvest_interval;
        }
        due
    }

    /// Moves records to the output (the table's counts too when `harvest`), completes it for
    /// an exec that is `ending` the image, rolls epochs, and sets the next tick from the rate
    /// the ring filled at.
    fn write_records(&mut self, harvest: bool, ending: bool) {
        // An exec that failed: the trailer written for it is taken back, records go on.
        if !EXEC_PENDING.load(Ordering::SeqCst) {
            self.out.resume_after_exec();
        }
        let drained = self.out.write_pending(&self.state, harvest);
        if ending && EXEC_PENDING.load(Ordering::SeqCst) {
            self.out.close_for_exec(&self.state);
        }
        if self
            .out
            .roll_if_due(&self.state, SystemTime::now(), EXEC_PENDING.load(Ordering::SeqCst))
        {
            // Each epoch's file gets its first harvested counts after a second, as a single
            // profile does: an epoch cut short by SIGKILL holds recent samples.
            self.harvest_interval = FIRST_HARVEST;
            self.next_harvest = Instant::now() + self.harvest_interval;
        }
        self.tick = next_tick(
            self.tick,
            drained,
            self.last_drain.elapsed(),
            self.state.table.ring_capacity_slots(),
        );
        self.last_drain = Instant::now();
    }

    /// With checkpoints on: one when due and something changed, for a flush, or when too many
    /// records are held.
    fn checkpoint_if_due(&mut self, flushing: bool) {
        if let Some(every) = self.checkpoint_every {
            // What a checkpoint would add: new samples, or code loaded or unloaded.
            let seen = Some((self.state.interrupts.load(Ordering::Relaxed), self.objects_seen));
            let due = Instant::now() >= self.next_checkpoint && seen != self.checkpointed;
            if due || flushing || self.out.held_bytes() > MAX_HELD_BYTES {
                self.out.checkpoint(&self.state);
                self.checkpointed = seen;
                self.next_checkpoint = Instant::now() + every;
            }
        }
    }

    /// Answers the flush (and snapshot) requests read at the start of this tick.
    fn answer_flush(&mut self, asked: &Asked) {
        let copy = asked.snapshot.then(|| self.out.snapshot(&self.state));
        let mut s = self.control.requests();
        if copy.is_some() {
            s.snapshot = copy;
        }
        s.flush_done = asked.flush;
        self.control.changed.notify_all();
    }
}

/// Answers the process-ending paths' requests up to `asked`, which this tick served.
fn answer_ends(asked: u32) {
    ENDS_SERVED.store(asked, Ordering::SeqCst);
    futex::wake_all(&ENDS_SERVED);
}

/// The `PROFILE:` line for a profile that `_exit` ended, written with write(2): the exiting
/// thread may hold the lock of Rust's stderr handle (from a signal handler that interrupted it).
fn print_exit_summary(state: &SamplerState, finished: &Finished, path: PathBuf) {
    let report = super::Summary {
        path: Some(path),
        interrupts: state.interrupts.load(Ordering::Relaxed),
        evictions: state.table.stats.evictions.load(Ordering::Relaxed),
        bytes: finished.bytes,
        lost: state.table.stats.lost.load(Ordering::Relaxed),
        unsampled_threads: 0,
    };
    let line = match finished.result {
        Ok(()) => report.summary_line(),
        Err(_) => report.incomplete_summary_line(),
    } + "\n";
    crate::sys::messages::say_bytes(line.as_bytes());
}

/// Where samples go: one file, or a database of epoch files.
pub enum Output {
    File(OutputFile),
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
    fn complete_current(&mut self, state: &SamplerState) {
        let Some(epoch) = self.current.take() else {
            return;
        };
        self.complete(epoch, state);
    }

    fn complete(&mut self, epoch: Epoch, state: &SamplerState) {
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
            crate::sys::messages::say_bytes(message.as_bytes());
            self.error.get_or_insert(e);
        }
        self.db.apply_budget(SystemTime::now());
    }

    fn open(&mut self, now: SystemTime) -> Option<Epoch> {
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
    /// Counts what `session::threadless` wrote to the file before this writer took it over.
    pub(super) fn note_written_elsewhere(&mut self, handed: super::threadless::HandedOver) {
        if let Output::File(out) = self {
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
            Output::File(out) => out,
            Output::Epochs(EpochOutput {
                current: Some(epoch), ..
            }) => &mut epoch.out,
            Output::Epochs(_) => return,
        };
        out.mappings.record(maps);
        out.mappings.read_build_ids(maps);
    }

    /// From now on records are written at checkpoints only, in every file (epoch files too).
    fn hold_records(&mut self) {
        match self {
            Output::File(out) => out.hold_records(),
            Output::Epochs(e) => {
                e.checkpoints = true;
                if let Some(epoch) = e.current.as_mut() {
                    epoch.out.hold_records();
                }
            }
        }
    }

    /// Records held for the next checkpoint.
    fn held_bytes(&self) -> usize {
        match self {
            Output::File(out) => out.held_bytes(),
            Output::Epochs(EpochOutput {
                current: Some(epoch), ..
            }) => epoch.out.held_bytes(),
            Output::Epochs(_) => 0,
        }
    }

    /// See [`OutputFile::checkpoint`]; in epoch mode, of the current epoch's file.
    fn checkpoint(&mut self, state: &SamplerState) {
        match self {
            Output::File(out) => out.checkpoint(state),
            Output::Epochs(e) => {
                if let Some(epoch) = e.current.as_mut() {
                    epoch.out.checkpoint(state);
                }
            }
        }
    }

    /// See [`OutputFile::write_pending`]; in epoch mode, into the current epoch's file (with
    /// none open, nothing is taken from the table or the ring).
    fn write_pending(&mut self, state: &SamplerState, harvest: bool) -> usize {
        match self {
            Output::File(out) => out.write_pending(state, harvest),
            Output::Epochs(e) => e
                .current
                .as_mut()
                .map_or(0, |epoch| epoch.out.write_pending(state, harvest)),
        }
    }

    /// The writer's wait, cut short to wake at the end of the epoch.
    fn wait_at_most(&self, tick: Duration, now: SystemTime) -> Duration {
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
    fn close_for_exec(&mut self, state: &SamplerState) {
        match self {
            Output::Epochs(e) => e.complete_current(state),
            Output::File(out) => out.complete_for_exec(state),
        }
    }

    /// After an exec that failed: a profile file completed for it goes on taking records.
    fn resume_after_exec(&mut self) {
        if let Output::File(out) = self {
            out.resume_after_exec();
        }
    }

    /// At the end of an epoch: everything counted so far (the table's counts and the ring's
    /// records) goes to the ending epoch's file, which is completed and renamed; the next
    /// epoch's file takes what follows. Also opens a file after a failed exec or open.
    /// Returns whether a new epoch file was opened.
    fn roll_if_due(&mut self, state: &SamplerState, now: SystemTime, exec_pending: bool) -> bool {
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
    fn snapshot(&mut self, state: &SamplerState) -> io::Result<Vec<u8>> {
        match self {
            Output::File(out) => out.snapshot(state),
            Output::Epochs(_) => Err(io::Error::other(
                "a profile database has no single profile to copy: read its epochs",
            )),
        }
    }

    /// At stop or `_exit`: writes what is left and completes the file (in epoch mode, the
    /// current epoch's, the last).
    fn complete(self, state: &SamplerState) -> Finished {
        match self {
            Output::File(mut out) => {
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

/// The `# process` line of this process as it is now: ids, origin, and `/proc/self/cmdline`
/// (no arguments if it cannot be read).
fn process_line() -> String {
    let args = crate::sys::procfs::read_self_cmdline(crate::format::process::MAX_COMMAND_LINE);
    ProcessLine {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        forked: super::children::is_forked_child(),
        args: ProcessLine::args_of_cmdline(&args.unwrap_or_default()),
    }
    .line()
}

/// Records of a checkpoint's tail: the table's counts not harvested yet, numbered after the
/// records in the file (for their contexts).
pub(super) struct TailRecords {
    bytes: Vec<u8>,
    next: u64,
    runs: Vec<(u64, u64, SampleContext)>,
}

impl TailRecords {
    /// None yet, to follow the records of `out`.
    pub(super) fn after(out: &OutputFile) -> TailRecords {
        TailRecords {
            bytes: Vec::new(),
            next: out.writer.records_written(),
            runs: Vec::new(),
        }
    }

    fn put(&mut self, count: u64, pcs: &[u64], context: Option<SampleContext>) {
        let (size, records) = record_size(SlotFormat::NATIVE, count, pcs);
        if records == 0 {
            return;
        }
        let at = self.bytes.len();
        self.bytes.resize(at + size, 0);
        encode_record(SlotFormat::NATIVE, count, pcs, &mut self.bytes[at..]);
        if let Some(context) = context {
            self.runs.push((self.next, records, context));
        }
        self.next += records;
    }
}

/// What follows the trailer: the maps (with build-ids), the samples' signal weights, the
/// process that wrote the profile, the records' contexts, and for a wall-clock profile
/// (`wall`) the wall sampler's missing looks.
fn trailer_text(mappings: &mut SeenMappings, weights: SignalWeights, contexts: &RecordContexts, wall: bool) -> Vec<u8> {
    let maps = read_self_maps();
    // The program may have closed or reused the descriptor since the last tick: read ELF
    // images through one that is ours, not through its file.
    let _ = crate::unwind::safe_read::check();
    mappings.read_build_ids(&maps);
    let mut text = mappings.complete(&maps);
    text.extend_from_slice(weights.line().as_bytes());
    text.extend_from_slice(process_line().as_bytes());
    if wall {
        text.extend_from_slice(super::wall::looks_line().as_bytes());
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
    tail_runs: &[(u64, u64, SampleContext)],
    wall: bool,
) -> Vec<u8> {
    let mut text = mappings.complete(b"");
    text.extend_from_slice(weights.line().as_bytes());
    text.extend_from_slice(checkpoint_process_line().as_bytes());
    if wall {
        text.extend_from_slice(super::wall::looks_line().as_bytes());
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
fn remember_process_line() {
    let args = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let args = &args[..args.len().min(crate::format::process::MAX_COMMAND_LINE)];
    let line = ProcessLine {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        forked: super::children::is_forked_child(),
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

/// The wait before the next drain: the time a quarter of the ring's capacity takes to fill at
/// the rate `drained` slots in `elapsed` suggest, at most twice the last `tick` (so a quiet
/// spell lengthens it gradually), within [MIN_TICK, MAX_TICK].
fn next_tick(tick: Duration, drained: usize, elapsed: Duration, capacity_slots: usize) -> Duration {
    let quarter_fills_in = if drained == 0 {
        MAX_TICK
    } else {
        let per_second = drained as f64 / elapsed.as_secs_f64().max(1e-3);
        Duration::from_secs_f64((capacity_slots as f64 / 4.0 / per_second).min(1.0))
    };
    quarter_fills_in.min(tick * 2).clamp(MIN_TICK, MAX_TICK)
}

impl OutputFile {
    /// Writes the trailer, the maps and the samples' signal weights (unless an error came
    /// first) and closes the file, and the one beside it.
    fn finish(self, state: &SamplerState) -> Finished {
        self.finish_with(state.signal_weights(), state.wall_signal_weights())
    }

    /// `weights`: this file's samples'; `beside_weights`: those of the file beside it.
    fn finish_with(self, weights: SignalWeights, beside_weights: SignalWeights) -> Finished {
        let OutputFile {
            mut writer,
            error,
            mut mappings,
            contexts,
            beside,
            exec_trailer_at,
            wall,
        } = self;
        debug_assert!(exec_trailer_at.is_none(), "taken back by Output::complete");
        // The last write: the held records and the trailer together, over the last tail.
        writer.get_mut().hold_records(false);
        let written = match error {
            Some(e) => Err(e),
            None => writer.write_trailer(&trailer_text(&mut mappings, weights, &contexts, wall)),
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
    fn snapshot(&mut self, state: &SamplerState) -> io::Result<Vec<u8>> {
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
        ));
        Ok(bytes)
    }

    /// Completes the file for an exec (trailer, maps), keeping where its records end: if the
    /// exec fails, [`resume_after_exec`](Self::resume_after_exec) takes the trailer back. A
    /// profile kept in memory goes with the process image and needs none. The wall profile
    /// beside it likewise.
    fn complete_for_exec(&mut self, state: &SamplerState) {
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

    fn complete_for_exec_with(&mut self, weights: SignalWeights) {
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
        let text = trailer_text(&mut self.mappings, weights, &self.contexts, self.wall);
        match self.writer.write_trailer(&text) {
            Ok(()) => self.exec_trailer_at = Some((records_end, written)),
            Err(e) => self.error = Some(e),
        }
    }

    /// Takes back the trailer written for an exec that failed (the file is cut back to its
    /// records), so that records go on after them.
    fn resume_after_exec(&mut self) {
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
    fn hold_records(&mut self) {
        if self.writer.get_ref().descriptor().is_some() {
            self.writer.get_mut().hold_records(true);
        }
        if let Some(beside) = &mut self.beside {
            beside.hold_records();
        }
    }

    fn holds_records(&self) -> bool {
        self.writer.get_ref().holds_records()
    }

    fn held_bytes(&self) -> usize {
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
            let (pcs, context) = super::contexts::split(chain);
            match beside.as_mut().filter(|_| context.is_some()) {
                Some(beside) => beside.put(count, pcs, context),
                None => own.put(count, pcs, context),
            }
        });
        self.checkpoint_with(own, state.signal_weights());
        if let (Some(file), Some(records)) = (self.beside.as_mut(), beside) {
            file.checkpoint_with(records, state.wall_signal_weights());
        }
    }

    /// [`checkpoint`](Self::checkpoint) of this file alone, with `records` in its tail.
    fn checkpoint_with(&mut self, records: TailRecords, weights: SignalWeights) {
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
            let (pcs, context) = super::contexts::split(chain);
            match self.beside.as_mut().filter(|_| context.is_some()) {
                Some(beside) => beside.put(count, pcs, context),
                None => self.put(count, pcs, context),
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

    /// Writes one record, noting its context. After a write error nothing more is written.
    fn put(&mut self, count: u64, pcs: &[u64], context: Option<SampleContext>) {
        if self.error.is_some() {
            return;
        }
        let first = self.writer.records_written();
        match self.writer.write_record(count, pcs) {
            Ok(()) => {
                if let Some(context) = context {
                    self.contexts.name_new_thread(context.tid);
                    self.contexts
                        .note(first, self.writer.records_written() - first, context);
                }
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn flush_records(&mut self) {
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

    #[test]
    fn the_tick_follows_the_eviction_rate() {
        let (second, ring) = (Duration::from_secs(1), 1 << 18);
        // Quiet: doubles up to the maximum.
        assert_eq!(next_tick(MIN_TICK, 0, second, ring), 2 * MIN_TICK);
        assert_eq!(next_tick(MAX_TICK, 1000, second, ring), MAX_TICK);
        // 4 M slots a second fill a quarter of a 256 Ki-slot ring in ~16 ms.
        let fast = next_tick(MAX_TICK, 4 << 20, second, ring);
        assert!(fast > MIN_TICK && fast < Duration::from_millis(20), "{fast:?}");
        assert_eq!(next_tick(MAX_TICK, 1 << 30, second, ring), MIN_TICK);
    }

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
