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
//! Code that ends the process without `atexit` (`_exit`, `exec`; see `process_end`) may run in
//! a signal handler, so it cannot take the locks of [`WriterControl`]: it asks through the
//! atomics below, wakes the writer with a futex, and waits on another, for a bounded time.

use super::timing;
use super::OutputFile;
use crate::sampler::{self, SampleSource, SamplerState};
use crate::sync::{Condvar, Mutex};
use crate::sys::futex;
use crate::sys::procfs::read_self_maps;
use crate::unwind::dwarf::loaded_objects_generation;
use crate::unwind::THREAD_STACKS;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest tick: a library loaded with dlopen is unwound through, and a thread nothing
/// announced is armed, within this.
const MAX_TICK: Duration = Duration::from_millis(50);
const MIN_TICK: Duration = Duration::from_millis(5);
const FIRST_HARVEST: Duration = Duration::from_secs(1);
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

/// Requests from the controlling thread to the writer thread.
#[derive(Default)]
pub struct WriterControl {
    state: Mutex<Requests>,
    changed: Condvar,
}

#[derive(Default)]
struct Requests {
    stop: bool,
    flush_requested: u64,
    flush_done: u64,
}

impl WriterControl {
    pub fn request_stop(&self) {
        self.state.lock().stop = true;
        self.changed.notify_all();
        wake_writer();
    }

    /// Asks for everything sampled so far to reach the file, and waits until it has.
    pub fn flush_and_wait(&self) {
        let mut s = self.state.lock();
        s.flush_requested += 1;
        let wanted = s.flush_requested;
        self.changed.notify_all();
        wake_writer();
        while s.flush_done < wanted && !s.stop {
            self.changed.wait(&mut s);
        }
    }
}

/// How the profile ended: the bytes in the file, and whether it holds the whole profile.
pub struct Finished {
    pub bytes: u64,
    pub result: io::Result<()>,
}

/// Moves samples to `out` until asked to stop (or the process exits with `_exit`), then writes
/// what is left, the trailer and the maps, and closes the file. `exit_summary`: the profile's
/// path, if the summary line is to be printed when `_exit` ends the profile (`stop` prints it
/// otherwise).
pub fn run(
    state: Arc<SamplerState>,
    mut out: OutputFile,
    control: Arc<WriterControl>,
    profiling_signal: i32,
    source: SampleSource,
    exit_summary: Option<PathBuf>,
) -> Finished {
    WRITER_PID.store(std::process::id(), Ordering::SeqCst);
    let mut harvest_interval = FIRST_HARVEST;
    let mut next_harvest = Instant::now() + harvest_interval;
    // The loader's counters before the maps: an object loaded before they are read is in the
    // maps read after, one loaded later changes them. (The program runs meanwhile: maps read
    // by `Session::start`, before this thread ran, could miss a library loaded in between.)
    let mut objects_seen = loaded_objects_generation();
    // The writer reads mapped ELF images for their build-ids, up to the end of the file,
    // after the session has let go of the /proc/self/mem descriptor: it holds its own use.
    let reads_memory = crate::unwind::safe_read::acquire().is_ok();
    let maps = read_self_maps();
    out.mappings.record(&maps);
    out.mappings.read_build_ids(&maps);
    let mut taken_over = false;
    let mut memory_descriptor_noted = false;
    let mut tick = MIN_TICK;
    let mut last_drain = Instant::now();
    loop {
        let woken = WAKE.load(Ordering::SeqCst);
        let idle = {
            let s = control.state.lock();
            !s.stop && s.flush_done == s.flush_requested
        };
        if idle && ENDS_ASKED.load(Ordering::SeqCst) == ENDS_SERVED.load(Ordering::SeqCst) {
            futex::wait(&WAKE, woken, tick);
        }
        let (stop, flush) = {
            let s = control.state.lock();
            (s.stop, s.flush_requested)
        };
        let ends_asked = ENDS_ASKED.load(Ordering::SeqCst);
        let exiting = EXITING.load(Ordering::SeqCst);
        if stop || exiting {
            out.write_pending(&state, true);
            let finished = out.finish(&state);
            if reads_memory {
                crate::unwind::safe_read::release();
            }
            if let Some(path) = exit_summary.filter(|_| exiting && !stop) {
                print_exit_summary(&state, &finished, path);
            }
            writer_gone();
            return finished;
        }
        if !taken_over && timing::taken_over(profiling_signal) {
            taken_over = true;
            timing::stop_after_takeover(source, profiling_signal);
        }
        THREAD_STACKS.resolve_requests();
        match crate::unwind::safe_read::check() {
            Ok(false) => {}
            _ if memory_descriptor_noted => {}
            Ok(true) => {
                memory_descriptor_noted = true;
                eprintln!(
                    "cpuprof: the program closed or replaced cpuprof's /proc/self/mem descriptor; opened it again"
                );
            }
            Err(e) => {
                memory_descriptor_noted = true;
                eprintln!("cpuprof: the program closed cpuprof's /proc/self/mem descriptor and it cannot be opened again ({e}); stacks outside threads' own stacks are no longer walked");
            }
        }
        sampler::thread_timers::sync_with_tasks();
        let generation = loaded_objects_generation();
        if generation != objects_seen {
            objects_seen = generation;
            let maps = read_self_maps();
            out.mappings.record(&maps);
            out.mappings.read_build_ids(&maps);
            sampler::refresh_dwarf();
        }
        let due = Instant::now() >= next_harvest;
        if due {
            harvest_interval = (harvest_interval * 2).min(MAX_HARVEST_INTERVAL);
            next_harvest = Instant::now() + harvest_interval;
        }
        let flushing = flush > control.state.lock().flush_done;
        let ending = ends_asked != ENDS_SERVED.load(Ordering::SeqCst);
        let drained = out.write_pending(&state, due || flushing || ending);
        tick = next_tick(tick, drained, last_drain.elapsed(), state.table.ring_capacity_slots());
        last_drain = Instant::now();
        if flushing {
            control.state.lock().flush_done = flush;
            control.changed.notify_all();
        }
        if ending {
            ENDS_SERVED.store(ends_asked, Ordering::SeqCst);
            futex::wake_all(&ENDS_SERVED);
        }
    }
}

/// The `PROFILE:` line for a profile that `_exit` ended, written with write(2): the exiting
/// thread may hold the lock of Rust's stderr handle (from a signal handler that interrupted it).
fn print_exit_summary(state: &SamplerState, finished: &Finished, path: PathBuf) {
    let report = super::Report {
        path,
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
    // SAFETY: writes a live buffer to stderr; a short write loses part of the line only.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
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

impl OutputFile {
    /// Writes the trailer, the maps and the samples' signal weights (unless an error came
    /// first) and closes the file.
    fn finish(self, state: &SamplerState) -> Finished {
        let OutputFile {
            mut writer,
            error,
            mut mappings,
        } = self;
        let written = match error {
            Some(e) => Err(e),
            None => {
                let maps = read_self_maps();
                // The program may have closed or reused the descriptor since the last tick:
                // read ELF images through one that is ours, not through its file.
                let _ = crate::unwind::safe_read::check();
                mappings.read_build_ids(&maps);
                let mut text = mappings.complete(&maps);
                text.extend_from_slice(state.signal_weights().line().as_bytes());
                writer.write_trailer(&text)
            }
        };
        let file = writer.into_inner();
        let bytes = file.bytes_in_file();
        let closed = file.close();
        Finished {
            bytes,
            result: written.and(closed),
        }
    }

    /// Writes evicted records and, when `harvest`, the table's counts, then flushes to the
    /// file; returns the ring slots drained. After a write error nothing more is written (a
    /// partial record would corrupt the file); the error is kept for `stop` to report.
    pub fn write_pending(&mut self, state: &SamplerState, harvest: bool) -> usize {
        let failed_before = self.error.is_some();
        let mut result: io::Result<()> = Ok(());
        let mut drained = 0;
        let mut write = |count: u64, pcs: &[u64]| {
            if !failed_before && result.is_ok() {
                result = self.writer.write_record(count, pcs);
            }
        };
        state.table.drain_evicted(|count, pcs| {
            drained += pcs.len() + 2;
            write(count, pcs)
        });
        if harvest {
            state.table.harvest(&mut write);
        }
        if failed_before {
            return drained;
        }
        if let Err(e) = result.and_then(|()| self.writer.flush()) {
            self.error.get_or_insert(e);
        }
        drained
    }
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
