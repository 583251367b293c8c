//! The Rust front end: start a profile and get a guard that completes it when dropped, or
//! that gives it back as a [`Report`].

use crate::error::Error;
use crate::report::Report;
use crate::sampler::{Clock, UnwinderChoice};
use crate::session::options::{
    clamp_depth, TimerChoice, WallBeside, DEFAULT_MEMORY_LIMIT, MAX_TABLE_ENTRIES, MIN_TABLE_ENTRIES,
};
use crate::session::{global, Options, Summary};
use crate::writer::epochs::{EpochOptions, DEFAULT_EPOCH_SECONDS};
use std::path::Path;
use std::time::Duration;

/// Entry point of the Rust API.
pub struct Profiler;

impl Profiler {
    /// Starts profiling into `path` with gperftools' defaults (100 Hz, CPU time, depth 254).
    pub fn start(path: impl AsRef<Path>) -> Result<ProfilerGuard, Error> {
        Profiler::builder().start(path)
    }

    /// Options for a profile, starting from gperftools' defaults; finish with
    /// [`ProfilerBuilder::start`] or [`ProfilerBuilder::start_in_memory`].
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cpuprof::Error> {
    /// let guard = cpuprof::Profiler::builder()
    ///     .frequency(250)
    ///     .max_depth(64)
    ///     .start("out.prof")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder {
            options: Options::default(),
            thread_labels: None,
            report_on_stderr: None,
            memory_limit: DEFAULT_MEMORY_LIMIT,
        }
    }
}

/// Options for a profile; finish with [`ProfilerBuilder::start`].
#[derive(Clone, Debug)]
pub struct ProfilerBuilder {
    options: Options,
    /// Set by [`ProfilerBuilder::thread_labels`]; otherwise the default of how it starts.
    thread_labels: Option<bool>,
    /// Set by [`ProfilerBuilder::report_on_stderr`]; likewise.
    report_on_stderr: Option<bool>,
    memory_limit: usize,
}

/// What errors call a profile kept in memory, where they would name its file.
const IN_MEMORY: &str = "(in memory)";

impl ProfilerBuilder {
    /// Samples per CPU-second, 1 to 4000.
    pub fn frequency(mut self, hz: u32) -> Self {
        self.options.frequency = hz.clamp(1, crate::session::options::MAX_FREQUENCY);
        self
    }

    /// Longest call chain recorded, PC included (1 to 4096).
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.options.table.max_depth = clamp_depth(depth);
        self
    }

    /// Call chains the in-memory table holds before evicting to the file (default 4096, as
    /// gperftools; 64 to 1,048,576). Memory reserved is about `entries * (max_depth + 2) * 8`
    /// bytes plus an eviction ring of a quarter of that at the default depth: ~10 MiB by
    /// default. A smaller table costs more evictions (more bytes written), not samples.
    pub fn table_entries(mut self, entries: usize) -> Self {
        let entries = entries.clamp(MIN_TABLE_ENTRIES, MAX_TABLE_ENTRIES);
        self.options.table = self.options.table.with_entries(entries);
        self
    }

    /// Stack walker: [`UnwinderChoice::Auto`] (DWARF CFI, frame pointers where there is none;
    /// the default) or [`UnwinderChoice::FramePointer`].
    pub fn unwinder(mut self, unwinder: UnwinderChoice) -> Self {
        self.options.unwinder = unwinder;
        self
    }

    /// Timer driving the samples (default [`TimerChoice::Auto`]: perf events, else per-thread
    /// CPU timers, else a process-wide CPU timer).
    ///
    /// Per-thread timers reach threads started after `start` through the writer thread's
    /// poll of `/proc/self/task` (at least every 50 ms): a thread that lives less than that may go
    /// unsampled. Programs run under libcpuprof.so (LD_PRELOAD or `-lcpuprof`) arm threads
    /// as they start instead, through its `pthread_create` interposer.
    pub fn timer(mut self, timer: TimerChoice) -> Self {
        self.options.timer = timer;
        self
    }

    /// Sample wall-clock time instead of CPU time (`SIGALRM`).
    pub fn real_time(mut self, on: bool) -> Self {
        self.options.clock = if on { Clock::Real } else { Clock::ProcessCpu };
        self
    }

    /// Wall-clock mode (`CPUPROFILE_WALL`): the profile `start` writes samples every thread
    /// `hz` times per second of wall time (1 to 1000), running, runnable or blocked, each
    /// sample labelled with its thread and state; blocked threads are never signalled. Needs
    /// per-thread timers (not [`TimerChoice::Itimer`] nor [`real_time`](Self::real_time)).
    pub fn wall(mut self, hz: u32) -> Self {
        self.options.wall = true;
        self.options.frequency = hz.clamp(1, crate::session::options::MAX_WALL_FREQUENCY);
        self
    }

    /// An event profile (`CPUPROFILE_EVENT`, `CPUPROFILE_EVENT_PERIOD`): a sample every
    /// `period` occurrences (`None`: the event's default) of the hardware or software event
    /// `name` in each thread, as `perf list` names them (`cycles`, `instructions`,
    /// `cache-misses`, `page-faults`, `context-switches`, ...) or a raw code `rNNNN`, instead
    /// of CPU time. `start` fails with [`Error::Event`] and the reason when the name is
    /// unknown or the machine cannot count the event (most virtual machines have no hardware
    /// counters; the software events work everywhere perf events do).
    pub fn event(mut self, name: &str, period: Option<u64>) -> Self {
        let period = period.map(|p| p.to_string());
        match crate::sampler::events::parse(name, period.as_deref()) {
            Ok(event) => {
                self.options.event = Some(event);
                self.options.event_refused = None;
            }
            Err(why) => self.options.event_refused = Some(format!("event {name}: {why}")),
        }
        self
    }

    /// Takes a wall-clock profile of every thread into `path` beside the CPU profile `start`
    /// writes, in the same run (`CPUPROFILE` with `CPUPROFILE_WALL`), at `hz` samples per
    /// second of wall time (1 to 1000).
    pub fn wall_beside(mut self, path: impl AsRef<Path>, hz: u32) -> Self {
        self.options.wall_beside = Some(WallBeside {
            path: path.as_ref().to_path_buf(),
            frequency: hz.clamp(1, crate::session::options::MAX_WALL_FREQUENCY),
        });
        self
    }

    /// Labels every sample with its thread (`CPUPROFILE_THREADS=1`): reports and pprof
    /// files then split the profile by thread, with the threads' names. The default for
    /// [`start_in_memory`](Self::start_in_memory); off for files, whose call-chain table then
    /// holds each chain once per thread that ran it. Wall-clock profiles always have threads.
    pub fn thread_labels(mut self, on: bool) -> Self {
        self.thread_labels = Some(on);
        self
    }

    /// Whether children the program forks (without exec) get profiles of their own,
    /// `<path>_<pid>` (default: they do; `CPUPROFILE_FOLLOW_FORK=0`). Profiles kept in memory
    /// are never followed.
    pub fn follow_forks(mut self, on: bool) -> Self {
        self.options.follow_forks = on;
        self
    }

    /// How often the file is made a complete profile of everything sampled so far, so that a
    /// process killed by SIGKILL (or the OOM killer) leaves a readable, named profile losing at
    /// most this long; `None` writes the file's end only when the profile stops, as gperftools
    /// does (`CPUPROFILE_CHECKPOINT`, default 2 s). Profiles kept in memory have no file.
    pub fn checkpoint(mut self, every: Option<std::time::Duration>) -> Self {
        self.options.checkpoint = every;
        self
    }

    /// The most memory a profile kept in memory ([`start_in_memory`](Self::start_in_memory))
    /// may take, in bytes (default 256 MiB, at least 1 MiB): past it, samples are no longer
    /// recorded, and the summary and report say the profile is incomplete.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = bytes.max(1 << 20);
        self
    }

    /// Whether to print gperftools' `PROFILE: ...` line on stderr at stop (default: yes for
    /// a file; no for a profile kept in memory, whose [`Report::summary`] has the numbers and
    /// whose top table says what was lost).
    pub fn report_on_stderr(mut self, on: bool) -> Self {
        self.report_on_stderr = Some(on);
        self
    }

    /// Epoch mode: `start`'s path is a profile database directory, and every `length` the
    /// samples of the epoch just ended become one complete profile in it,
    /// `DIR/<epoch start, UTC>/<program>.<pid>.prof` (see `CPUPROFILE_DB` in the README).
    /// Epochs shorter than 10 ms are taken as 10 ms.
    pub fn epochs(mut self, length: Duration) -> Self {
        let budget = self.options.epochs.take();
        let mut epochs = EpochOptions::new(length);
        if let Some(b) = budget {
            (epochs.max_bytes, epochs.max_age) = (b.max_bytes, b.max_age);
        }
        self.options.epochs = Some(epochs);
        self
    }

    /// Epoch mode's budget: the oldest complete epochs are removed while the database holds
    /// more than `max_bytes`, or once they started longer than `max_age` ago (`None`: no
    /// limit). Turns epoch mode on (with 600-s epochs) if `epochs` was not called.
    pub fn database_budget(mut self, max_bytes: Option<u64>, max_age: Option<Duration>) -> Self {
        let epochs = self
            .options
            .epochs
            .get_or_insert_with(|| EpochOptions::new(Duration::from_secs_f64(DEFAULT_EPOCH_SECONDS)));
        (epochs.max_bytes, epochs.max_age) = (max_bytes, max_age);
        self
    }

    /// Starts profiling into the file at `path` (a database directory in epoch mode).
    pub fn start(mut self, path: impl AsRef<Path>) -> Result<ProfilerGuard, Error> {
        self.options.thread_labels = self.thread_labels.unwrap_or(false);
        self.options.report_on_stderr = self.report_on_stderr.unwrap_or(true);
        global::start(path.as_ref(), self.options)?;
        Ok(ProfilerGuard { stopped: false })
    }

    /// Starts a profile that stays in memory: no file is created, and
    /// [`ProfilerGuard::report`] gives it back named, to print or write in any format.
    /// Samples carry their threads unless [`thread_labels`](Self::thread_labels) says no.
    /// Not with [`epochs`](Self::epochs) nor [`wall_beside`](Self::wall_beside).
    ///
    /// ```
    /// # fn main() -> Result<(), cpuprof::Error> {
    /// let guard = cpuprof::Profiler::builder().start_in_memory()?;
    /// // ... work ...
    /// let report = guard.report()?;
    /// println!("{} samples", report.total_samples());
    /// # Ok(())
    /// # }
    /// ```
    pub fn start_in_memory(mut self) -> Result<ProfilerGuard, Error> {
        self.options.thread_labels = self.thread_labels.unwrap_or(true);
        self.options.report_on_stderr = self.report_on_stderr.unwrap_or(false);
        self.options.in_memory = Some(self.memory_limit);
        global::start(Path::new(IN_MEMORY), self.options)?;
        Ok(ProfilerGuard { stopped: false })
    }
}

/// Stops the profile and writes the file when dropped (errors then go to stderr);
/// call [`ProfilerGuard::stop`] to get them as a `Result`.
#[must_use = "profiling stops when the guard is dropped"]
pub struct ProfilerGuard {
    stopped: bool,
}

impl ProfilerGuard {
    /// Writes everything sampled so far to the file, without ending the profile.
    pub fn flush(&self) -> Result<(), Error> {
        global::flush()
    }

    /// Signals handled so far in this profile (gperftools' `samples_gathered`).
    pub fn samples(&self) -> u64 {
        global::info().map_or(0, |i| i.samples)
    }

    /// Stops profiling and completes the file.
    pub fn stop(mut self) -> Result<Summary, Error> {
        self.stopped = true;
        global::stop()
    }

    /// Stops profiling and gives the profile back named ([`Report`]): from memory after
    /// [`ProfilerBuilder::start_in_memory`], else read back from the file just completed.
    pub fn report(mut self) -> Result<Report, Error> {
        self.stopped = true;
        let (summary, held) = global::stop_keeping()?;
        let raw = match (held, &summary.path) {
            (Some(bytes), _) => bytes,
            (None, Some(path)) => std::fs::read(path).map_err(|source| Error::Write {
                path: path.clone(),
                source,
            })?,
            (None, None) => return Err(Error::Read("the profile kept no bytes".into())),
        };
        Report::build(raw, Some(summary))
    }

    /// Everything sampled so far, named, while profiling goes on (not in epoch mode).
    pub fn snapshot(&self) -> Result<Report, Error> {
        Report::build(global::snapshot()?, None)
    }
}

impl Drop for ProfilerGuard {
    fn drop(&mut self) {
        if !self.stopped {
            if let Err(e) = global::stop() {
                crate::say!("cpuprof: {e}");
            }
        }
    }
}
