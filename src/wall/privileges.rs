//! The wall sampler's view of the program's threads across a change of credentials.
//!
//! A program started as root that drops to another user (`memcached -u memcache`: `setgid`
//! and `setuid` early in `main`, then its worker threads) stops being dumpable, and its
//! `/proc/self/task/TID/syscall` files become root's and unreadable to it (see
//! [`super::switches`] for what the kernel still allows). libcpuprof.so interposes the calls
//! that make a process non-dumpable (`setuid`, `setgid`, `seteuid`, `setegid`, `setreuid`,
//! `setregid`, `setresuid`, `setresgid`, `setfsuid`, `setfsgid`, and `prctl(PR_SET_DUMPABLE,
//! 0)`; not `setgroups` or `initgroups`, which leave a process dumpable) and, before the real
//! call, while the process can still open them, [`before_credential_change`]:
//! * opens `/proc/self/task/TID/syscall` of every thread of the program and hands the
//!   descriptors to the wall sampler, which reads them for as long as the threads live (the
//!   kernel checks a read against the thread group, not the credentials);
//! * opens context-switch events on every thread ([`super::switches::SwitchEvents`]), which
//!   threads started afterwards inherit: their registers at each switch-out stand in for the
//!   `syscall` file they will never be able to open.
//!
//! Nothing is kept that the program would not have: the process is not made dumpable again
//! and keeps no capability. Calls that change nothing (`setuid` to the current effective
//! user) and calls in a forked child (which has no wall sampler) do nothing here.

use super::switches::SwitchEvents;
use crate::in_program::fd::GuardedFd;
use crate::sync::Mutex;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most `syscall` descriptors handed over at credential changes.
pub const MAX_HANDED: usize = 256;

/// The wall sampler running in this process.
struct Registered {
    pid: u32,
    /// cpuprof's threads that are not in its own list (the writer, the sampler).
    excluded: Vec<libc::pid_t>,
}

static REGISTERED: Mutex<Option<Registered>> = Mutex::new(None);

/// Descriptors opened for the sampler, and the threads they were opened for.
#[derive(Default)]
struct Handed {
    fds: Vec<(libc::pid_t, GuardedFd)>,
    tids: Vec<libc::pid_t>,
}

static HANDED: Mutex<Option<Handed>> = Mutex::new(None);
static HANDED_PENDING: AtomicBool = AtomicBool::new(false);
/// The context-switch events, shared by the interposers (which open them) and the sampler
/// (which drains them).
pub(super) static SWITCHES: Mutex<Option<SwitchEvents>> = Mutex::new(None);
/// Credential changes seen while the sampler ran.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// Called by the wall sampler as it starts. What a parent's sampler left (this process is its
/// forked child) is given up without being touched: its buffers are not mapped here.
pub(super) fn register(excluded: Vec<libc::pid_t>) {
    if let Some(inherited) = SWITCHES.lock().take() {
        if inherited.is_ours() {
            drop(inherited);
        } else {
            std::mem::forget(inherited);
        }
    }
    HANDED.lock().take();
    HANDED_PENDING.store(false, Ordering::SeqCst);
    *REGISTERED.lock() = Some(Registered {
        pid: std::process::id(),
        excluded,
    });
    CHANGES.store(0, Ordering::Relaxed);
}

/// Called by the wall sampler as it stops: closes whatever was opened for it.
pub(super) fn unregister() {
    *REGISTERED.lock() = None;
    HANDED.lock().take();
    HANDED_PENDING.store(false, Ordering::SeqCst);
    if let Some(switches) = SWITCHES.lock().take() {
        if switches.is_ours() {
            drop(switches);
        } else {
            std::mem::forget(switches);
        }
    }
}

/// Credential changes seen since the sampler started.
pub(super) fn changes() -> u64 {
    CHANGES.load(Ordering::Relaxed)
}

/// The descriptors opened since the last call.
pub(super) fn take_handed() -> Vec<(libc::pid_t, GuardedFd)> {
    if !HANDED_PENDING.swap(false, Ordering::SeqCst) {
        return Vec::new();
    }
    HANDED
        .lock()
        .as_mut()
        .map_or_else(Vec::new, |h| std::mem::take(&mut h.fds))
}

/// Whether the process is dumpable now (its `/proc/self/task` files its own).
pub(super) fn dumpable() -> bool {
    // SAFETY: PR_GET_DUMPABLE takes no pointer.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE) == 1 }
}

/// Prepares the wall sampler for a change of credentials that may make the process
/// non-dumpable (see the module's documentation). Called by libcpuprof.so's interposers
/// before the real call, on the thread making it. Does nothing without a wall sampler in this
/// process, or when the process can no longer open the files anyway.
pub fn before_credential_change() {
    let excluded = match REGISTERED.lock().as_ref() {
        Some(r) if r.pid == std::process::id() => r.excluded.clone(),
        _ => return,
    };
    // SAFETY: geteuid has no preconditions.
    if !dumpable() && unsafe { libc::geteuid() } != 0 {
        return;
    }
    CHANGES.fetch_add(1, Ordering::Relaxed);
    let Some(mut tids) = crate::in_program::procfs::self_tids() else {
        return;
    };
    let ours = crate::in_program::thread::own_tids();
    tids.retain(|t| !excluded.contains(t) && !ours.contains(t));
    // The calling thread first: it is the one likely to start the program's threads, which
    // inherit its events.
    let me = crate::sampler::thread_timers::gettid();
    tids.sort_unstable_by_key(|&t| (t != me, t));
    {
        let mut handed = HANDED.lock();
        let handed = handed.get_or_insert_with(Handed::default);
        for &tid in &tids {
            if handed.tids.contains(&tid) || handed.tids.len() >= MAX_HANDED {
                continue;
            }
            let path = format!("/proc/self/task/{tid}/syscall");
            if let Ok(fd) = std::fs::File::open(&path)
                .map(OwnedFd::from)
                .and_then(|f| GuardedFd::adopt(f, path))
            {
                handed.tids.push(tid);
                handed.fds.push((tid, fd));
            }
        }
        HANDED_PENDING.store(true, Ordering::SeqCst);
    }
    let mut switches = SWITCHES.lock();
    if switches.as_ref().is_some_and(|s| !s.is_ours()) {
        // A parent's, before a fork: not mapped here.
        std::mem::forget(switches.take());
    }
    switches.get_or_insert_with(SwitchEvents::new).cover(&tids);
}
