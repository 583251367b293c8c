//! Where threads wait for each other, for the contention profile (`cpuprof_core::contention`):
//! `pthread_mutex_lock` (and its timed forms), `pthread_rwlock_rdlock`/`wrlock`, `sem_wait`
//! and `sem_timedwait`, and, in C (src/variadic.c, since `syscall` is C-variadic), the futex
//! waits of `syscall(SYS_futex, ...)`, which Rust's `std::sync` and `parking_lot` make without
//! pthreads.
//!
//! With no contention profile running each costs one load more than the call it passes on.
//! While one runs, the lock is tried first (`pthread_mutex_trylock`, ...): an uncontended lock
//! costs the try. Only a call that would block is timed (two reads of the vDSO clock), and its
//! delay handed to the profile, which samples it by delay. `errno` is kept as the call left it.
//!
//! glibc's `pthread_cond_wait` re-locks its mutex internally, without calling
//! `pthread_mutex_lock`: that wait is not seen (docs/CONTENTION.md).
//!
//! `CPUPROFILE_CONTENTION=path` at load (or `CpuprofStartContention`, include/cpuprof.h) starts
//! a profile written to `path` at exit (or by `CpuprofStopContention`).

use cpuprof_core::contention::{self, WaitKind};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The functions passed on to, found with `dlsym(RTLD_NEXT)` at load (and at first use, for a
/// call before our constructor).
#[derive(Clone, Copy)]
enum Next {
    MutexLock,
    MutexTrylock,
    MutexTimedlock,
    MutexClocklock,
    RwlockRdlock,
    RwlockTryrdlock,
    RwlockWrlock,
    RwlockTrywrlock,
    SemWait,
    SemTrywait,
    SemTimedwait,
}

const NAMES: [&CStr; 11] = [
    c"pthread_mutex_lock",
    c"pthread_mutex_trylock",
    c"pthread_mutex_timedlock",
    c"pthread_mutex_clocklock",
    c"pthread_rwlock_rdlock",
    c"pthread_rwlock_tryrdlock",
    c"pthread_rwlock_wrlock",
    c"pthread_rwlock_trywrlock",
    c"sem_wait",
    c"sem_trywait",
    c"sem_timedwait",
];

static NEXT: [AtomicUsize; 11] = [const { AtomicUsize::new(0) }; 11];

/// Finds the functions passed on to and gives the futex interposer its hooks. At load, before
/// anything can lock.
pub fn resolve() {
    // SAFETY: registers two plain functions with the C interposer.
    unsafe { cpuprof_set_futex_hooks(contention_running, futex_waited) };
    for (slot, name) in NEXT.iter().zip(NAMES) {
        if slot.load(Ordering::Relaxed) == 0 {
            // SAFETY: dlsym with a constant NUL-terminated name; RTLD_NEXT skips this library.
            slot.store(
                unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize,
                Ordering::Relaxed,
            );
        }
    }
}

/// The next `which`, as a function of type `F`.
///
/// # Safety
/// `F` is the C signature of `which`.
#[inline(always)]
unsafe fn next<F: Copy>(which: Next) -> F {
    let slot = &NEXT[which as usize];
    let mut addr = slot.load(Ordering::Relaxed);
    if addr == 0 {
        resolve();
        addr = slot.load(Ordering::Relaxed);
    }
    assert!(addr != 0, "cpuprof: no {:?} after libcpuprof.so", NAMES[which as usize]);
    // SAFETY: the address of the function named, whose signature is F.
    unsafe { std::mem::transmute_copy::<usize, F>(&addr) }
}

/// Runs `block` (the blocking call) timed, and hands the delay to the profile; `errno` stays
/// as `block` left it.
#[inline(never)]
fn timed<R>(kind: WaitKind, block: impl FnOnce() -> R) -> R {
    let start = contention::now_ns();
    let result = block();
    let delay = contention::now_ns().saturating_sub(start);
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    contention::waited(cpuprof_core::arch::calling_registers(), delay, kind, 0);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    result
}

unsafe extern "C" {
    fn cpuprof_set_futex_hooks(running: extern "C" fn() -> c_int, waited: extern "C" fn(u64));
}

/// For the futex interposer (src/variadic.c): whether futex waits are timed.
extern "C" fn contention_running() -> c_int {
    c_int::from(contention::is_running())
}

/// Called by the futex interposer (src/variadic.c) after a futex wait of `delay_ns`.
extern "C" fn futex_waited(delay_ns: u64) {
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    contention::waited(cpuprof_core::arch::calling_registers(), delay_ns, WaitKind::Lock, 0);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

type Lock = unsafe extern "C" fn(*mut c_void) -> c_int;
type TimedLock = unsafe extern "C" fn(*mut c_void, *const libc::timespec) -> c_int;
type ClockLock = unsafe extern "C" fn(*mut c_void, libc::clockid_t, *const libc::timespec) -> c_int;

/// A lock call: passed on when no profile runs; tried first, and timed only if the try finds
/// the lock taken (`busy` is the try's answer then).
macro_rules! lock_interposer {
    ($name:ident, $next:expr, $try:expr, $busy:expr, $kind:expr, ($($arg:ident: $ty:ty),*), $f:ty) => {
        /// Interposed for the contention profile (see the module's documentation).
        ///
        /// # Safety
        /// As the libc function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(lock: *mut c_void $(, $arg: $ty)*) -> c_int {
            let call = next::<$f>($next);
            if !contention::is_running() {
                return call(lock $(, $arg)*);
            }
            let tried = next::<Lock>($try)(lock);
            if tried != $busy {
                return tried;
            }
            timed($kind, || call(lock $(, $arg)*))
        }
    };
}

lock_interposer!(
    pthread_mutex_lock,
    Next::MutexLock,
    Next::MutexTrylock,
    libc::EBUSY,
    WaitKind::Lock,
    (),
    Lock
);
lock_interposer!(
    pthread_mutex_timedlock,
    Next::MutexTimedlock,
    Next::MutexTrylock,
    libc::EBUSY,
    WaitKind::Lock,
    (deadline: *const libc::timespec),
    TimedLock
);
lock_interposer!(
    pthread_mutex_clocklock,
    Next::MutexClocklock,
    Next::MutexTrylock,
    libc::EBUSY,
    WaitKind::Lock,
    (clock: libc::clockid_t, deadline: *const libc::timespec),
    ClockLock
);
lock_interposer!(
    pthread_rwlock_rdlock,
    Next::RwlockRdlock,
    Next::RwlockTryrdlock,
    libc::EBUSY,
    WaitKind::Lock,
    (),
    Lock
);
lock_interposer!(
    pthread_rwlock_wrlock,
    Next::RwlockWrlock,
    Next::RwlockTrywrlock,
    libc::EBUSY,
    WaitKind::Lock,
    (),
    Lock
);

/// `sem_wait` and `sem_timedwait`: `sem_trywait` first, timed if it fails with `EAGAIN`.
unsafe fn semaphore(sem: *mut c_void, call: impl FnOnce() -> c_int) -> c_int {
    if !contention::is_running() {
        return call();
    }
    // SAFETY: the caller's semaphore.
    if unsafe { next::<Lock>(Next::SemTrywait)(sem) } == 0 {
        return 0;
    }
    // SAFETY: the calling thread's errno.
    if unsafe { *libc::__errno_location() } != libc::EAGAIN {
        return call();
    }
    timed(WaitKind::Semaphore, call)
}

/// Interposed for the contention profile (see the module's documentation).
///
/// # Safety
/// As `sem_wait(3)`.
#[no_mangle]
pub unsafe extern "C" fn sem_wait(sem: *mut c_void) -> c_int {
    let call = next::<Lock>(Next::SemWait);
    semaphore(sem, || call(sem))
}

/// Interposed for the contention profile (see the module's documentation).
///
/// # Safety
/// As `sem_timedwait(3)`.
#[no_mangle]
pub unsafe extern "C" fn sem_timedwait(sem: *mut c_void, deadline: *const libc::timespec) -> c_int {
    let call = next::<TimedLock>(Next::SemTimedwait);
    semaphore(sem, || call(sem, deadline))
}

/// `CPUPROFILE_CONTENTION=path` at load: a contention profile of the whole run, written to
/// `path` at exit (`path_PID` in the programs this one starts).
pub fn start_from_environment() {
    let var = |k: &str| std::env::var(k).ok();
    let Some(path) = var("CPUPROFILE_CONTENTION").filter(|p| !p.is_empty()) else {
        return;
    };
    let period = match var("CPUPROFILE_CONTENTION_PERIOD") {
        None => contention::DEFAULT_PERIOD_NS,
        Some(text) => match parse_period(&text) {
            Some(ns) => ns,
            None => {
                cpuprof_core::say!(
                    "cpuprof: CPUPROFILE_CONTENTION_PERIOD={text:?} is not a number of nanoseconds from 1 to \
                     10^12; the program continues without a contention profile"
                );
                return;
            }
        },
    };
    // Programs this one starts inherit the variable: they write `path_PID` rather than
    // overwrite ours.
    let use_pid = var("CPUPROFILE_CONTENTION_USE_PID").is_some();
    if !use_pid {
        std::env::set_var("CPUPROFILE_CONTENTION_USE_PID", "1");
    }
    let file = if use_pid {
        format!("{path}_{}", std::process::id())
    } else {
        path
    };
    match contention::start(period) {
        Ok(()) => {
            *OUTPUT.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::process::id(), file.clone()));
            cpuprof_core::say!("cpuprof: contention profile to {file}, a sample per {period} ns waited");
        }
        Err(e) => cpuprof_core::say!("cpuprof: contention profile: {e}"),
    }
}

/// `CPUPROFILE_CONTENTION_PERIOD`: nanoseconds, 1 to 10^12.
fn parse_period(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=1_000_000_000_000).contains(n))
}

/// Where the profile started from the environment goes at exit, and the process that started
/// it.
static OUTPUT: std::sync::Mutex<Option<(u32, String)>> = std::sync::Mutex::new(None);

/// The end of the process: the profile's file (`path_PID` in a child forked from the process
/// that started it, whose profile began empty at the fork).
pub fn stop_at_exit() {
    write_file();
}

/// Stops the profile started with a file and writes it; whether it was written.
fn write_file() -> bool {
    // try_lock: in a forked child the lock may have stayed with a parent's thread.
    let Some((started_by, path)) = OUTPUT.try_lock().ok().and_then(|mut o| o.take()) else {
        return false;
    };
    let path = if started_by == std::process::id() {
        path
    } else {
        format!("{path}_{}", std::process::id())
    };
    contention::stop();
    let profile = contention::current(contention::ALL_WAITS);
    if let Err(e) = std::fs::write(&path, profile.to_text()) {
        cpuprof_core::say!("cpuprof: cannot write the contention profile {path}: {e}");
        return false;
    }
    if profile.discarded > 0 {
        cpuprof_core::say!(
            "cpuprof: contention profile: {} sampled waits found the table full and are not in {path}",
            profile.discarded
        );
    }
    true
}

/// `include/cpuprof.h`: a contention profile into `fname`, written by
/// [`CpuprofStopContention`] or at exit.
///
/// # Safety
/// `fname` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn CpuprofStartContention(fname: *const std::ffi::c_char, period_ns: u64) -> c_int {
    if fname.is_null() {
        cpuprof_core::say!("cpuprof: CpuprofStartContention: file name is NULL");
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let path = unsafe { CStr::from_ptr(fname) }.to_string_lossy().into_owned();
    let period = if period_ns == 0 {
        contention::DEFAULT_PERIOD_NS
    } else {
        period_ns
    };
    match contention::start(period) {
        Ok(()) => {
            *OUTPUT.lock().unwrap_or_else(|e| e.into_inner()) = Some((std::process::id(), path));
            1
        }
        Err(e) => {
            cpuprof_core::say!("cpuprof: CpuprofStartContention: {e}");
            0
        }
    }
}

/// `include/cpuprof.h`: stops the contention profile and writes its file.
#[no_mangle]
pub extern "C" fn CpuprofStopContention() -> c_int {
    c_int::from(write_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_nanoseconds() {
        assert_eq!(parse_period("1000000"), Some(1_000_000));
        assert_eq!(parse_period(" 1 "), Some(1));
        for bad in ["0", "-1", "x", "1000000000001"] {
            assert_eq!(parse_period(bad), None, "{bad}");
        }
    }
}
