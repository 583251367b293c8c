//! Heap profiles written to files, as gperftools' heap profiler writes them:
//! `HEAPPROFILE=prefix` (or `HeapProfilerStart(prefix)`) writes `prefix.0001.heap`,
//! `prefix.0002.heap`, ... whenever about `HEAP_PROFILE_ALLOCATION_INTERVAL` bytes more were
//! allocated (default 1 GiB), the memory in use grew `HEAP_PROFILE_INUSE_INTERVAL` bytes past
//! its previous high (default 100 MiB), `HEAP_PROFILE_TIME_INTERVAL` seconds passed (default
//! never), on `HeapProfilerDump`, and at the end. A forked child writes its own,
//! `prefix_PID.0001.heap`, ..., and so does a program started by a profiled one (it inherits
//! `HEAPPROFILE`; the first process sets `HEAPPROFILE_USE_PID` for those it starts).
//!
//! The triggers are checked every 100 ms by the heap profile's thread (`poller`; gperftools
//! checks them on every allocation, and writes the file from inside it): bytes are the
//! samples' estimates, and one file may cover several intervals crossed within 100 ms. A
//! single-threaded process (a forked child too) has no such thread until it starts one of
//! its own: meanwhile the triggers are checked at each sampled allocation, and a file due is
//! written there (`when_due_without_thread`).

use super::recorder;
use crate::format::heap::HeapProfile;
use crate::sync::Mutex;
use crate::writer::mappings::SeenMappings;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// When to write the next file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Triggers {
    /// Bytes allocated since the last file (0: never).
    pub allocation: u64,
    /// Growth of the bytes in use past the highest seen in a file (0: never).
    pub inuse: u64,
    /// Time since the last file (None: never).
    pub time: Option<Duration>,
}

impl Default for Triggers {
    /// gperftools' defaults.
    fn default() -> Self {
        Triggers {
            allocation: 1 << 30,
            inuse: 100 << 20,
            time: None,
        }
    }
}

struct Files {
    prefix: PathBuf,
    pid: u32,
    /// Files named `prefix_PID.NNNN.heap` (a process started by a profiled one).
    use_pid: bool,
    written: u32,
    triggers: Triggers,
    allocated_at_last: u64,
    inuse_high: u64,
    last_time: Instant,
    mappings: SeenMappings,
}

static FILES: Mutex<Option<Files>> = Mutex::new(None);
/// Whether files are being written (a load on the sampled path, before any lock).
static WRITING: AtomicBool = AtomicBool::new(false);

/// The file lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &FILES
}

/// Starts a heap profile written to files named from `prefix` (`prefix_PID` with `use_pid`),
/// sampling every `period` bytes.
pub fn start(prefix: &Path, period: u64, triggers: Triggers, use_pid: bool) -> Result<(), String> {
    // Here and below: what a program thread allocates inside cpuprof is not the program's.
    let _own = crate::in_program::thread::own_work();
    let mut files = FILES.lock();
    if files.is_some() || recorder::is_running() {
        return Err("a heap profile is already running".into());
    }
    recorder::start(period).map_err(|e| e.to_string())?;
    *files = Some(Files {
        prefix: prefix.to_path_buf(),
        pid: std::process::id(),
        use_pid,
        written: 0,
        triggers,
        allocated_at_last: 0,
        inuse_high: 0,
        last_time: Instant::now(),
        mappings: SeenMappings::default(),
    });
    WRITING.store(true, Ordering::SeqCst);
    Ok(())
}

/// Writes a file now, saying why on stderr (`reason`); the file's path.
pub fn dump(reason: &str) -> Result<PathBuf, String> {
    let _own = crate::in_program::thread::own_work();
    let mut files = FILES.lock();
    let files = files.as_mut().ok_or("no heap profile is being written to files")?;
    files.write(reason)
}

/// Writes the last file and stops the profile (the end of the process, `HeapProfilerStop`).
pub fn stop() {
    let mut guard = FILES.lock();
    let running = recorder::is_running();
    // First: what the last file's writing allocates is not the program's.
    recorder::stop();
    if let Some(files) = guard.as_mut() {
        if running {
            // A process started or forked by a profiled one that sampled nothing leaves no
            // file (as for CPU profiles): a launcher script's `uname` and `grep` would.
            let descendant = files.use_pid || files.pid != std::process::id();
            if let Err(e) = files.write_unless_empty("at the end", descendant, Refresh::Snapshot) {
                crate::in_program::messages::say_for_tree(format_args!("cpuprof: heap profile: {e}"));
            }
        }
    }
    *guard = None;
    WRITING.store(false, Ordering::SeqCst);
}

/// Whether a profile is being written to files.
pub fn is_writing() -> bool {
    WRITING.load(Ordering::Relaxed)
}

/// Called by the poller: writes a file if one is due. Never waits for the lock (a file is
/// being written).
pub(super) fn when_due() {
    write_if_due(Refresh::Snapshot);
}

/// Called at a sampled allocation, by the allocating thread, in a single-threaded process
/// that has no poller yet (`poller`): writes a file there if one is due, as gperftools
/// writes its files from inside the allocation. The allocator has returned (no lock of its
/// is held), no other thread exists to hold one of ours, and the unwind tables' snapshot is
/// not refreshed (that walks the loader's list, and the program may be inside `dlopen`).
pub(super) fn when_due_without_thread() {
    if super::poller::is_deferred() {
        write_if_due(Refresh::No);
    }
}

/// Whether writing a file refreshes the unwind tables' snapshot first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refresh {
    Snapshot,
    No,
}

fn write_if_due(refresh: Refresh) {
    if !WRITING.load(Ordering::Relaxed) {
        return;
    }
    let Some(mut guard) = FILES.try_lock() else { return };
    let Some(files) = guard.as_mut() else { return };
    if let Some(reason) = files.due() {
        if let Err(e) = files.write_unless_empty(&reason, false, refresh) {
            crate::in_program::messages::say_for_tree(format_args!("cpuprof: heap profile: {e}"));
        }
    }
}

impl Files {
    fn due(&self) -> Option<String> {
        let (allocated, inuse) = recorder::estimated_bytes();
        let t = self.triggers;
        if t.allocation > 0 && allocated >= self.allocated_at_last.saturating_add(t.allocation) {
            return Some(format!("{} MiB allocated cumulatively", allocated >> 20));
        }
        if t.inuse > 0 && inuse >= self.inuse_high.saturating_add(t.inuse) {
            return Some(format!("{} MiB in use", inuse >> 20));
        }
        match t.time {
            Some(every) if self.last_time.elapsed() >= every => Some(format!("{} s since the last", every.as_secs())),
            _ => None,
        }
    }

    fn path(&self) -> PathBuf {
        let mut name = self.prefix.clone().into_os_string();
        let pid = std::process::id();
        if self.use_pid || pid != self.pid {
            name.push(format!("_{pid}"));
        }
        name.push(format!(".{:04}.heap", self.written + 1));
        PathBuf::from(name)
    }

    fn write(&mut self, reason: &str) -> Result<PathBuf, String> {
        self.write_unless_empty(reason, false, Refresh::Snapshot)
    }

    /// Writes the next file (not when `skip_empty` and nothing was sampled); its path. A file
    /// that cannot be written is said in every process (`say_for_tree` by the callers): it is
    /// a loss, and a server's workers are rarely the process the user started.
    fn write_unless_empty(&mut self, reason: &str, skip_empty: bool, refresh: Refresh) -> Result<PathBuf, String> {
        if refresh == Refresh::Snapshot {
            super::walker::refresh_if_stale(super::recorder::WALK_DEPTH);
        }
        let path = self.path();
        let profile = current(&mut self.mappings);
        if skip_empty && profile.records.is_empty() {
            return Ok(path);
        }
        let mut text = Vec::new();
        profile.write_text(&mut text).map_err(|e| e.to_string())?;
        let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(&text));
        written.map_err(|e| format!("process {}: cannot write {}: {e}", std::process::id(), path.display()))?;
        self.written += 1;
        let (allocated, inuse) = recorder::estimated_bytes();
        self.allocated_at_last = allocated;
        self.inuse_high = self.inuse_high.max(inuse);
        self.last_time = Instant::now();
        crate::say!("cpuprof: heap profile {} ({reason})", path.display());
        Ok(path)
    }
}

/// The profile now, its maps with the build-ids of the code in them, and what it lost (a
/// `# heap-losses` line after the maps, which readers skip, and on stderr), if anything.
pub fn current(mappings: &mut SeenMappings) -> HeapProfile {
    let _own = crate::in_program::thread::own_work();
    let maps = crate::in_program::procfs::read_self_maps();
    mappings.read_build_ids(&maps);
    let mut text = mappings.complete(&maps);
    let (no_site, untracked) = recorder::losses();
    if no_site > 0 || untracked > 0 {
        let line = format!(
            "# heap-losses: {no_site} sampled allocations found the site table full (not in the profile); \
             {untracked} sampled blocks found their bucket full (their frees unseen: counted in use)\n"
        );
        crate::say!(
            "cpuprof: heap profile: {}",
            line.trim_start_matches("# heap-losses: ").trim_end()
        );
        text.extend_from_slice(line.as_bytes());
    }
    recorder::profile(text)
}

/// In a forked child: its files are its own, numbered from 1 (see [`Files::path`]), its
/// profile the blocks it inherited and what it allocates from now on.
/// Never waits: a lock the fork handlers could not take stays with a thread that is gone.
pub(crate) fn in_forked_child() {
    super::poller::in_forked_child();
    recorder::in_forked_child();
    if let Some(files) = FILES.try_lock().as_mut().and_then(|g| g.as_mut()) {
        if files.pid != std::process::id() {
            files.written = 0;
            files.allocated_at_last = 0;
            files.inuse_high = 0;
        }
    }
}

/// What `HEAPPROFILE` and its options ask for: the prefix, the sampling period
/// (`HEAP_PROFILE_SAMPLE`, bytes, default 512 KiB) and the triggers
/// (`HEAP_PROFILE_ALLOCATION_INTERVAL`, `HEAP_PROFILE_INUSE_INTERVAL` in bytes,
/// `HEAP_PROFILE_TIME_INTERVAL` in seconds; 0 turns one off). `None` without `HEAPPROFILE`;
/// a value that is not a number is an error naming it.
pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Result<(PathBuf, u64, Triggers), String>> {
    let prefix = var("HEAPPROFILE").filter(|p| !p.trim().is_empty())?;
    let number = |name: &str, default: u64| number_from_env(&var, name, default);
    let parsed = (|| {
        let defaults = Triggers::default();
        let period = number("HEAP_PROFILE_SAMPLE", super::DEFAULT_PERIOD)?;
        let seconds = number("HEAP_PROFILE_TIME_INTERVAL", 0)?;
        let triggers = Triggers {
            allocation: number("HEAP_PROFILE_ALLOCATION_INTERVAL", defaults.allocation)?,
            inuse: number("HEAP_PROFILE_INUSE_INTERVAL", defaults.inuse)?,
            time: (seconds > 0).then(|| Duration::from_secs(seconds)),
        };
        Ok((PathBuf::from(prefix), period, triggers))
    })();
    Some(parsed)
}

/// The whole number `name` holds, `default` when unset or empty.
fn number_from_env(var: &impl Fn(&str) -> Option<String>, name: &str, default: u64) -> Result<u64, String> {
    match var(name) {
        None => Ok(default),
        Some(v) if v.trim().is_empty() => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{name}={v}: not a whole number")),
    }
}

/// Whether to sample the heap without writing files (for the HTTP endpoint): `CPUPROF_HEAP=1`,
/// or `CPUPROF_HTTP` set and `CPUPROF_HEAP` not `0`; then the period (`HEAP_PROFILE_SAMPLE`).
pub fn sampling_from_env(var: impl Fn(&str) -> Option<String>) -> Option<Result<u64, String>> {
    let set = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    let wanted = match set("CPUPROF_HEAP") {
        Some(v) => v.trim() != "0",
        None => set("CPUPROF_HTTP").is_some(),
    };
    wanted.then(|| number_from_env(&var, "HEAP_PROFILE_SAMPLE", super::DEFAULT_PERIOD))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn options_from_the_environment() {
        assert!(from_env(env(&[])).is_none());
        let (prefix, period, t) = from_env(env(&[("HEAPPROFILE", "/tmp/x")])).unwrap().unwrap();
        assert_eq!(
            (prefix, period, t),
            (PathBuf::from("/tmp/x"), 512 * 1024, Triggers::default())
        );
        let (_, period, t) = from_env(env(&[
            ("HEAPPROFILE", "p"),
            ("HEAP_PROFILE_SAMPLE", "4096"),
            ("HEAP_PROFILE_INUSE_INTERVAL", "0"),
            ("HEAP_PROFILE_TIME_INTERVAL", "5"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((period, t.inuse, t.time), (4096, 0, Some(Duration::from_secs(5))));
        let err = from_env(env(&[("HEAPPROFILE", "p"), ("HEAP_PROFILE_SAMPLE", "lots")]))
            .unwrap()
            .unwrap_err();
        assert!(err.contains("HEAP_PROFILE_SAMPLE=lots"), "{err}");
    }

    #[test]
    fn sampling_for_the_endpoint() {
        assert_eq!(sampling_from_env(env(&[])), None);
        assert_eq!(sampling_from_env(env(&[("CPUPROF_HTTP", "0")])), Some(Ok(512 * 1024)));
        assert_eq!(
            sampling_from_env(env(&[("CPUPROF_HTTP", "0"), ("CPUPROF_HEAP", "0")])),
            None
        );
        assert_eq!(
            sampling_from_env(env(&[("CPUPROF_HEAP", "1"), ("HEAP_PROFILE_SAMPLE", "100")])),
            Some(Ok(100))
        );
    }
}
