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
//! (`writer::sink`). Nothing is written while nothing was sampled or loaded.
//!
//! Code that ends the process without `atexit` (`_exit`, `exec`; see `process_end`) may run in
//! a signal handler, so it cannot take the locks of [`WriterControl`]: it asks through the
//! atomics below, wakes the writer with a futex, and waits on another, for a bounded time.

mod contexts;
pub mod epochs;
mod launch;
pub(crate) mod mappings;
mod output;
mod profile;
mod sink;
pub mod threadless;

pub use launch::{before_unload, start_waiting_writer};
pub(crate) use launch::{
    can_start_threadless, forget_writers_in_child, fork_locks, start_writer, take_late_writer, writer_notices_takeover,
    PendingWriter,
};
pub use output::{EpochOutput, Output};
pub use profile::ProfileOutput;

use crate::in_program::futex;
use crate::in_program::procfs::read_self_maps;
use crate::sampler::{self, SampleSource, SamplerState};
use crate::session::timing;
use crate::unwind::dwarf::loaded_objects_generation;
use crate::unwind::THREAD_STACKS;
use profile::remember_process_line;
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
    /// The file was completed before the writer thread could start (`writer::threadless`).
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
        threadless::DESCRIPTOR_TAKEN => io::Error::other(
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
        if let Some(threads) = crate::in_program::procfs::self_thread_count() {
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
    let report = crate::session::Summary {
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
    crate::in_program::messages::say_bytes(line.as_bytes());
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
