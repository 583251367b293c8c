//! Forked children, each profiled into its own file.
//!
//! A prefork server (nginx, postgres, Apache, gunicorn, php-fpm) does its work in children it
//! forks without `exec`, and Chromium's zygote forks its renderers: the parent's profile holds
//! none of it. So a child forked from a process whose program profiles gets a profile of its
//! own, `<path>_<pid>` as exec'd children's are, from the fork on: only its own samples (a new
//! table), its own timers (POSIX timers are not inherited), and its own file, completed at its
//! end however it ends (`exit`, `_exit`, `exec`). `CPUPROFILE_FOLLOW_FORK=0` (or
//! `ProfilerBuilder::follow_forks(false)`) turns it off. On-demand profiles (HTTP), profiles kept
//! in memory and `CPUPROFILESIGNAL` toggles are the parent's only.
//!
//! How: `pthread_atfork` handlers. Before the fork, every cpuprof lock is taken (for a bounded
//! time: `fork` may be called from a signal handler that interrupted their holder), so the
//! child's copy of what they guard is consistent and they are free in both processes
//! afterwards. In the child, the parent's session, writer, timers, sampler state and file are
//! forgotten (never stopped, written or freed there: they are the parent's), and the child's
//! profile starts with the parent's options, signal and unwinder, writing without a thread
//! until the child starts one (`threadless`), so a fork costs no thread. A child that `exec`s
//! before taking a sample leaves no file (the new image writes `<path>_<pid>` itself); one that
//! took samples first keeps them in `<path>_<pid>.pre-exec`.
//!
//! Not followed: children made by `vfork`, `posix_spawn` and raw `clone` (no handlers run:
//! they `exec` at once, or are threads), and `_Fork`.
//!
//! A child that ends (exit, or a signal's default action) without having taken a single
//! sample leaves no file: a prefork server's idle workers, a shell's subshells, a pool's
//! helpers that only wait would otherwise leave one empty profile each. A child that stops
//! its profile itself (`ProfilerStop`) keeps it, as the root process always does.
//!
//! The profiled process tree shares one page of counters (mapped shared, inherited across
//! fork): how many children were profiled, finished, ended without a sample and could not be
//! profiled, which the process that started the family reports at its stop.

use super::{global, Session};
use crate::sync::ForkLock;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

/// How long the fork waits for cpuprof's locks, in all: they are held for microseconds, except
/// by a thread that a signal handler calling `fork` interrupted.
const HOLD_LIMIT: Duration = Duration::from_millis(500);

/// The counters a process tree shares.
#[repr(C)]
struct Family {
    /// Children whose profile started.
    started: AtomicU32,
    /// Children whose profile was completed.
    finished: AtomicU32,
    /// Children of a profiling parent that could not be profiled.
    refused: AtomicU32,
    /// Children whose profile ended with the process without a sample, and was removed.
    empty: AtomicU32,
}

static FAMILY: AtomicPtr<Family> = AtomicPtr::new(std::ptr::null_mut());
/// Whether this process is a forked child with a profile of its own, not yet completed.
static PROFILED_CHILD: AtomicBool = AtomicBool::new(false);
/// Whether this process's profile continues a profiled parent's across `fork` (the `forked`
/// field of its `# process` line).
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);
/// Which of [`fork_locks`] the fork handlers hold (bit i: lock i).
static HELD: AtomicU32 = AtomicU32::new(0);

/// Registers the fork handlers, once per process. Called when libcpuprof.so is loaded and
/// when a profile starts.
pub fn install_fork_handlers() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: registers three plain functions.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) };
    });
}

/// How many locks [`fork_locks`] holds: the DWARF unwinder's rbx-CFA cache is x86-64's alone.
const FORK_LOCKS: usize = if cfg!(target_arch = "x86_64") { 14 } else { 13 };

/// Every lock of cpuprof's that the child may take, outermost first.
fn fork_locks() -> [&'static dyn ForkLock; FORK_LOCKS] {
    [
        global::fork_lock(),
        crate::heap::dumps::fork_lock(),
        crate::writer::fork_locks()[0],
        crate::writer::fork_locks()[1],
        crate::sampler::thread_timers::fork_lock(),
        crate::sampler::timer::fork_lock(),
        crate::unwind::safe_read::fork_lock(),
        crate::unwind::THREAD_STACKS.fork_lock(),
        #[cfg(target_arch = "x86_64")]
        crate::arch::x86_64::rbx_cfa::fork_lock(),
        crate::in_program::procfs::fork_locks()[0],
        crate::in_program::procfs::fork_locks()[1],
        crate::in_program::procfs::fork_locks()[2],
        crate::in_program::thread_names::fork_lock(),
        crate::in_program::thread::fork_lock(),
    ]
}

extern "C" fn before_fork() {
    let errno = save_errno();
    let deadline = crate::in_program::futex::monotonic_now() + HOLD_LIMIT;
    let mut held = 0;
    for (i, lock) in fork_locks().iter().enumerate() {
        let left = deadline.saturating_sub(crate::in_program::futex::monotonic_now());
        if lock.hold_for_fork(left) {
            held |= 1 << i;
        }
    }
    HELD.store(held, Ordering::SeqCst);
    restore_errno(errno);
}

fn release_held() -> bool {
    let held = HELD.swap(0, Ordering::SeqCst);
    let locks = fork_locks();
    for (i, lock) in locks.iter().enumerate() {
        if held & (1 << i) != 0 {
            // SAFETY: taken by `before_fork` on this thread (the only one, in the child).
            unsafe { lock.release_after_fork() };
        }
    }
    held == (1 << locks.len()) - 1
}

extern "C" fn in_parent() {
    let errno = save_errno();
    release_held();
    restore_errno(errno);
}

extern "C" fn in_child() {
    let errno = save_errno();
    // Any forked child is not the process the user started: it keeps quiet.
    crate::in_program::messages::became_forked_child();
    let consistent = release_held();
    crate::sampler::signals::release_in_child();
    crate::unwind::safe_read::reopen_in_child();
    crate::heap::dumps::in_forked_child();
    crate::contention::forget_in_child();
    // What runs in the parent does not run here: its writer, its threadless file, its published
    // sampler state (handlers that were running in its other threads at the fork are gone).
    crate::writer::forget_in_child();
    crate::writer::threadless::forget_in_child();
    crate::sampler::forget_in_forked_child();
    crate::sampler::unannounced::forget_in_child();
    super::autostart::forget_in_child();
    crate::sampler::default_actions::forget_in_child();
    // The parent's endpoint sockets: the child has no thread serving them.
    crate::http::in_forked_child();
    PROFILED_CHILD.store(false, Ordering::SeqCst);
    FORKED_CHILD.store(false, Ordering::SeqCst);
    CHILD_PATHS.store(std::ptr::null_mut(), Ordering::SeqCst);
    if !consistent {
        // A lock stayed held by a thread that does not exist here: the state it guards may be
        // half-changed. Nothing of the parent's profile is touched; no profile of its own.
        count(|f| &f.refused);
        restore_errno(errno);
        return;
    }
    crate::sampler::thread_timers::forget_in_child();
    crate::sampler::timer::forget_in_child();
    crate::writer::forget_writers_in_child();
    crate::in_program::thread_names::forget_in_child();
    global::replace_in_forked_child(start_child);
    restore_errno(errno);
}

/// The child's profile, from its parent's, if the parent's follows forks.
fn start_child(parent: &Session) -> Option<Session> {
    if !parent.options.follow_forks || parent.options.in_memory.is_some() {
        return None;
    }
    let (path, options, origin) = parent.child_plan(std::process::id());
    let single_file = options.epochs.is_none();
    match Session::start_as(&path, options, origin) {
        Ok(child) => {
            if single_file {
                remember_paths(&path, child.options.wall_beside.is_none());
            }
            count(|f| &f.started);
            PROFILED_CHILD.store(true, Ordering::SeqCst);
            FORKED_CHILD.store(true, Ordering::SeqCst);
            Some(child)
        }
        Err(_) => {
            count(|f| &f.refused);
            None
        }
    }
}

/// The child's profile path and the name it is kept under if the child `exec`s after taking
/// samples, made when its profile starts (leaked: one per process). Async-signal-safe.
pub fn profile_paths() -> Option<&'static (CString, CString)> {
    // SAFETY: set once per child from a leaked Box, never freed.
    unsafe { CHILD_PATHS.load(Ordering::SeqCst).as_ref() }
}

static CHILD_PATHS: AtomicPtr<(CString, CString)> = AtomicPtr::new(std::ptr::null_mut());
/// Whether the child's one file may be removed when it ends without a sample (not when a wall
/// profile beside it holds the waits of a process that never ran).
static REMOVABLE_WHEN_EMPTY: AtomicBool = AtomicBool::new(false);

fn remember_paths(path: &std::path::Path, removable_when_empty: bool) {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let kept = [bytes, b".pre-exec"].concat();
    if let (Ok(path), Ok(kept)) = (CString::new(bytes), CString::new(kept)) {
        CHILD_PATHS.store(Box::into_raw(Box::new((path, kept))), Ordering::SeqCst);
        REMOVABLE_WHEN_EMPTY.store(removable_when_empty, Ordering::SeqCst);
    }
}

/// Whether this process's profile was started by `fork` from a profiled parent's.
/// Async-signal-safe.
pub fn is_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::SeqCst)
}

/// Whether this process is a forked child whose own profile runs. Async-signal-safe.
pub fn is_profiled_child() -> bool {
    PROFILED_CHILD.load(Ordering::SeqCst)
}

/// The child's profile is complete (at its stop or end). Async-signal-safe.
pub fn child_profile_completed() {
    if PROFILED_CHILD.swap(false, Ordering::SeqCst) {
        count(|f| &f.finished);
    }
}

/// The process is ending (`exit`'s handlers run): a child's profile stopped from now on ends
/// with the process. Async-signal-safe.
pub fn process_is_ending() {
    ENDING.store(true, Ordering::SeqCst);
}

static ENDING: AtomicBool = AtomicBool::new(false);

/// The child's profile was stopped (`sampled`: whether it took a sample): by the program
/// itself, or as the process ends (see [`child_profile_ended`]). Async-signal-safe.
pub fn child_profile_stopped(sampled: bool) {
    if ENDING.load(Ordering::SeqCst) {
        child_profile_ended(sampled);
    } else {
        child_profile_completed();
    }
}

/// The child's profile was completed as the process ends (`sampled`: whether it took a
/// sample): one without a sample is removed and counted. Async-signal-safe.
pub fn child_profile_ended(sampled: bool) {
    if !PROFILED_CHILD.swap(false, Ordering::SeqCst) {
        return;
    }
    count(|f| &f.finished);
    if sampled || !REMOVABLE_WHEN_EMPTY.load(Ordering::SeqCst) {
        return;
    }
    if let Some((path, _)) = profile_paths() {
        // SAFETY: a NUL-terminated path made when the child's profile started.
        if unsafe { libc::unlink(path.as_ptr()) } == 0 {
            count(|f| &f.empty);
        }
    }
}

/// The child `exec`s before taking a sample: its file is removed (the new image writes its
/// own), and it is not counted as a profiled child. Async-signal-safe.
pub fn child_replaced_by_exec() {
    if PROFILED_CHILD.swap(false, Ordering::SeqCst) {
        // SAFETY: the page is never unmapped.
        if let Some(family) = unsafe { FAMILY.load(Ordering::SeqCst).as_ref() } {
            family.started.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A profile that follows forks starts in a process that is not a forked child: it begins a
/// family whose counters its stop reports (a second profile of the same process starts them
/// again).
pub fn begin_family() {
    let family = match unsafe { FAMILY.load(Ordering::SeqCst).as_ref() } {
        Some(family) => family,
        None => {
            // SAFETY: an anonymous shared mapping of one page, zeroed; AtomicU32 is valid as 0.
            let page = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if page == libc::MAP_FAILED {
                return;
            }
            FAMILY.store(page.cast(), Ordering::SeqCst);
            // SAFETY: just mapped, and never unmapped.
            unsafe { &*page.cast::<Family>() }
        }
    };
    for counter in [&family.started, &family.finished, &family.refused, &family.empty] {
        counter.store(0, Ordering::SeqCst);
    }
}

fn count(which: impl Fn(&Family) -> &AtomicU32) {
    // SAFETY: the page is never unmapped.
    if let Some(family) = unsafe { FAMILY.load(Ordering::SeqCst).as_ref() } {
        which(family).fetch_add(1, Ordering::SeqCst);
    }
}

/// At the stop of a family's first profile: how many forked children were profiled (their
/// files are `<base>_<pid>`), how many still run, how many could not be.
pub fn say_at_stop(path: &std::path::Path) {
    // SAFETY: the page is never unmapped.
    let Some(family) = (unsafe { FAMILY.load(Ordering::SeqCst).as_ref() }) else {
        return;
    };
    let started = family.started.load(Ordering::SeqCst);
    let finished = family.finished.load(Ordering::SeqCst);
    let refused = family.refused.load(Ordering::SeqCst);
    let empty = family.empty.load(Ordering::SeqCst);
    if started > 0 {
        let running = started.saturating_sub(finished);
        let still = if running > 0 {
            format!(" ({running} still running: their profiles are completed when they end)")
        } else {
            String::new()
        };
        let no_file = if empty > 0 {
            format!("; {empty} ended without a sample and left no file")
        } else {
            String::new()
        };
        crate::say!(
            "cpuprof: {started} forked child processes profiled, each into {}_<pid>{still}{no_file}",
            super::family_base(path, std::process::id()).display()
        );
    }
    if refused > 0 {
        crate::say!("cpuprof: {refused} forked child processes could not be profiled (their profile could not start)");
    }
}

fn save_errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

fn restore_errno(errno: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
}
