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
//! The releases, `pthread_mutex_unlock`, `pthread_rwlock_unlock`, `sem_post` and
//! `syscall(SYS_futex, FUTEX_WAKE...)`, charge the releaser with what the lock's waiters
//! accrued (the holder's view, `contention::holders`); with no wait tracked each costs a load
//! more than the call.
//!
//! `CPUPROFILE_CONTENTION=path` at load (or `CpuprofStartContention`, include/cpuprof.h) starts
//! a profile written to `path` (the waiters' view) and `path.holders` at exit (or by
//! `CpuprofStopContention`), at `_exit`, `exec` and an ending signal's default action, and at
//! checkpoints ([`checkpoint`]) for `SIGKILL`.

pub mod checkpoint;

use cpuprof_core::contention::{self, holders, View};
use cpuprof_core::in_program::fd::GuardedFd;
use cpuprof_core::in_program::messages;
use cpuprof_core::sampler::default_actions::{self, Completer};
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

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
    MutexUnlock,
    RwlockUnlock,
    SemPost,
}

const NAMES: [&CStr; 14] = [
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
    c"pthread_mutex_unlock",
    c"pthread_rwlock_unlock",
    c"sem_post",
];

static NEXT: [AtomicUsize; 14] = [const { AtomicUsize::new(0) }; 14];

/// Finds the functions passed on to and gives the futex interposer its hooks. At load, before
/// anything can lock.
pub fn resolve() {
    // SAFETY: registers plain functions with the C interposer.
    unsafe { cpuprof_set_futex_hooks(contention_running, futex_arrive, futex_waited, futex_waking, futex_woke) };
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

/// Runs `block` (the blocking call on `lock`) timed, and hands the delay to the profile;
/// `errno` stays as `block` left it. The wait is counted among the lock's waiters while it
/// lasts, for the holder's view.
#[inline(never)]
fn timed<R>(lock: usize, block: impl FnOnce() -> R) -> R {
    let start = contention::now_ns();
    let waiting = Departs(contention::arrive(lock, start));
    let result = block();
    let delay = contention::now_ns().saturating_sub(start);
    drop(waiting);
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    contention::waited(cpuprof_core::arch::calling_registers(), delay, 0);
    checkpoint::after_wait();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    result
}

/// A tracked wait, ended when dropped: also when the thread is cancelled inside the wait
/// (`sem_wait` is a cancellation point), as glibc unwinds it through this frame; else it would
/// stay counted as a waiter, charged to every later release of its lock.
struct Departs(Option<holders::Waiting>);

impl Drop for Departs {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            holders::depart(w);
        }
    }
}

unsafe extern "C" {
    fn cpuprof_set_futex_hooks(
        running: extern "C" fn() -> c_int,
        arrive: extern "C" fn(usize, u64) -> isize,
        waited: extern "C" fn(u64, isize),
        waking: extern "C" fn(usize) -> u64,
        woke: extern "C" fn(u64),
    );
}

/// For the futex interposer (src/variadic.c): whether futex waits are timed.
extern "C" fn contention_running() -> c_int {
    c_int::from(contention::is_running())
}

/// Called by the futex interposer (src/variadic.c) before a futex wait on `futex` starting at
/// `start_ns`: the wait counted among the futex's waiters, for the holder's view. The slot for
/// [`futex_waited`], or -1 (not tracked).
extern "C" fn futex_arrive(futex: usize, start_ns: u64) -> isize {
    contention::arrive(futex, start_ns).map_or(-1, |w| w.slot() as isize)
}

/// Called by the futex interposer (src/variadic.c) after a futex wait of `delay_ns`, with what
/// [`futex_arrive`] answered.
extern "C" fn futex_waited(delay_ns: u64, slot: isize) {
    if let Some(w) = usize::try_from(slot).ok().and_then(holders::Waiting::from_slot) {
        holders::depart(w);
    }
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    contention::waited(cpuprof_core::arch::calling_registers(), delay_ns, 0);
    checkpoint::after_wait();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Called by the futex interposer (src/variadic.c) before a `FUTEX_WAKE` on `futex`: what
/// the futex's waiters accrued, to charge the waker with after the call ([`futex_woke`]); 0
/// if no wait is tracked.
extern "C" fn futex_waking(futex: usize) -> u64 {
    if !contention::is_running() || !holders::anyone_waiting() {
        return 0;
    }
    contention::releasing(futex)
}

/// Called by the futex interposer (src/variadic.c) after a `FUTEX_WAKE` for which
/// [`futex_waking`] answered `delay_ns` > 0.
extern "C" fn futex_woke(delay_ns: u64) {
    charge_holder(delay_ns);
}

/// Charges the releaser of a lock (the calling thread) with `delay_ns`, `errno` kept.
#[inline(never)]
fn charge_holder(delay_ns: u64) {
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    contention::charge_holder(cpuprof_core::arch::calling_registers(), delay_ns, 0);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

type Lock = unsafe extern "C" fn(*mut c_void) -> c_int;
type TimedLock = unsafe extern "C" fn(*mut c_void, *const libc::timespec) -> c_int;
type ClockLock = unsafe extern "C" fn(*mut c_void, libc::clockid_t, *const libc::timespec) -> c_int;

/// A lock call: passed on when no profile runs; tried first, and timed only if the try finds
/// the lock taken (`busy` is the try's answer then).
macro_rules! lock_interposer {
    ($name:ident, $next:expr, $try:expr, $busy:expr, ($($arg:ident: $ty:ty),*), $f:ty) => {
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
            timed(lock as usize, || call(lock $(, $arg)*))
        }
    };
}

lock_interposer!(
    pthread_mutex_lock,
    Next::MutexLock,
    Next::MutexTrylock,
    libc::EBUSY,
    (),
    Lock
);
lock_interposer!(
    pthread_mutex_timedlock,
    Next::MutexTimedlock,
    Next::MutexTrylock,
    libc::EBUSY,
    (deadline: *const libc::timespec),
    TimedLock
);
lock_interposer!(
    pthread_mutex_clocklock,
    Next::MutexClocklock,
    Next::MutexTrylock,
    libc::EBUSY,
    (clock: libc::clockid_t, deadline: *const libc::timespec),
    ClockLock
);
lock_interposer!(
    pthread_rwlock_rdlock,
    Next::RwlockRdlock,
    Next::RwlockTryrdlock,
    libc::EBUSY,
    (),
    Lock
);
lock_interposer!(
    pthread_rwlock_wrlock,
    Next::RwlockWrlock,
    Next::RwlockTrywrlock,
    libc::EBUSY,
    (),
    Lock
);

/// A release (a lock's unlock, a semaphore's post): passed on; while waits are tracked, what
/// the lock's waiters accrued is taken before the release and charged to the releaser after it
/// (the holder's view).
macro_rules! unlock_interposer {
    ($name:ident, $next:expr) => {
        /// Interposed for the contention profile (see the module's documentation).
        ///
        /// # Safety
        /// As the libc function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(lock: *mut c_void) -> c_int {
            let call = next::<Lock>($next);
            if !contention::is_running() || !holders::anyone_waiting() {
                return call(lock);
            }
            let delay = contention::releasing(lock as usize);
            let result = call(lock);
            if delay > 0 {
                charge_holder(delay);
            }
            result
        }
    };
}

unlock_interposer!(pthread_mutex_unlock, Next::MutexUnlock);
unlock_interposer!(pthread_rwlock_unlock, Next::RwlockUnlock);
// A semaphore has no owner: its "holder" is the thread that posts, as a lock's release when it
// serves as one (Python's `threading.Lock`), else the producer the waiter waited for.
unlock_interposer!(sem_post, Next::SemPost);

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
    timed(sem as usize, call)
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
        path.clone()
    };
    match start_with_file(&file, &path, period) {
        Ok(()) => cpuprof_core::say!(
            "cpuprof: contention profile to {file} (waiters) and {file}.holders, a sample per {period} ns waited"
        ),
        Err(e) => cpuprof_core::say!("cpuprof: contention profile: {e}; the program continues without one"),
    }
}

/// `CPUPROFILE_CONTENTION_PERIOD`: nanoseconds, 1 to 10^12.
fn parse_period(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=1_000_000_000_000).contains(n))
}

/// Where a contention profile started with a file goes: the waiters' view to `path`, the
/// holders' to `path.holders`. The files are created when the profile starts (in a child
/// forked from the process, at the fork), so that a process that drops its privileges
/// afterwards (nginx's and postgres' workers) still has them, and written through those
/// descriptors at the end.
struct Output {
    /// The process the files belong to (a vfork'ed child, which shares this memory, does not
    /// write them).
    pid: u32,
    /// The two files, by view ([`View::ALL`]'s order).
    files: [ViewFile; 2],
    /// The name the process tree's files share (`CPUPROFILE_CONTENTION`): a forked child's are
    /// `base_PID` and `base_PID.holders`, as every other process's of the tree.
    base: CString,
    /// Created at a fork: removed again if the child recorded nothing (a shell forks often).
    forked: bool,
}

/// The file of one view.
struct ViewFile {
    view: View,
    path: CString,
    file: GuardedFd,
}

impl Output {
    /// Creates the files of the profile at `path` (`path` and `path.holders`).
    fn create(pid: u32, path: &CStr, base: CString, forked: bool) -> Result<Output, String> {
        let file = |view: View| {
            let mut name = path.to_bytes().to_vec();
            if view == View::Holders {
                name.extend_from_slice(b".holders");
            }
            let name = CString::new(name).expect("no NUL in a C string");
            match create(&name) {
                Ok(file) => Ok(ViewFile { view, path: name, file }),
                Err(e) => Err(format!("cannot create {}: {e}", name.to_string_lossy())),
            }
        };
        Ok(Output {
            pid,
            files: [file(View::Waiters)?, file(View::Holders)?],
            base,
            forked,
        })
    }

    /// Writes both views as at `_exit` (without allocating), each through its descriptor if
    /// still ours, else by its path (the program closed or reused the descriptor: Chromium's
    /// zygote closes every descriptor it did not open). Async-signal-safe.
    fn write_raw(&self) {
        for f in &self.files {
            if f.file.is_still_ours() {
                contention::raw_writer::write(f.file.raw(), f.view);
                continue;
            }
            // SAFETY: opens a NUL-terminated path (the raw writer cuts the file at its end),
            // written and closed here.
            unsafe {
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW;
                let fd = libc::open(f.path.as_ptr(), flags, 0o644);
                if fd >= 0 {
                    contention::raw_writer::write(fd, f.view);
                    libc::close(fd);
                }
            }
        }
    }

    /// Removes both files. Async-signal-safe.
    fn unlink(&self) {
        for f in &self.files {
            // SAFETY: unlinks a NUL-terminated path.
            unsafe { libc::unlink(f.path.as_ptr()) };
        }
    }
}

static OUTPUT: OutputLock = OutputLock {
    held: AtomicBool::new(false),
    holder: AtomicI32::new(0),
    output: std::cell::UnsafeCell::new(None),
};

/// The profile's file behind a try-only lock: held while a checkpoint writes it (a thread of
/// ours), and released by a forked child if that thread held it at the fork
/// (`in_forked_child`), which a `std::sync::Mutex` cannot be. Never waits, so usable from
/// `_exit` in a signal handler.
struct OutputLock {
    held: AtomicBool,
    /// The thread holding it (its kernel id), for [`output_at_end`].
    holder: AtomicI32,
    output: std::cell::UnsafeCell<Option<Output>>,
}

// SAFETY: `output` is reached only through a guard, which `held` makes exclusive.
unsafe impl Sync for OutputLock {}

struct OutputGuard(&'static OutputLock);

impl OutputLock {
    fn try_lock(&'static self) -> Option<OutputGuard> {
        if self.held.swap(true, Ordering::Acquire) {
            return None;
        }
        self.holder.store(this_thread(), Ordering::Relaxed);
        Some(OutputGuard(self))
    }
}

impl std::ops::Deref for OutputGuard {
    type Target = Option<Output>;
    fn deref(&self) -> &Option<Output> {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.0.output.get() }
    }
}

impl std::ops::DerefMut for OutputGuard {
    fn deref_mut(&mut self) -> &mut Option<Output> {
        // SAFETY: the guard holds the lock.
        unsafe { &mut *self.0.output.get() }
    }
}

impl Drop for OutputGuard {
    fn drop(&mut self) {
        self.0.holder.store(0, Ordering::Relaxed);
        self.0.held.store(false, Ordering::Release);
    }
}

/// The calling thread's kernel id. Async-signal-safe.
fn this_thread() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::gettid() }
}

/// The output, once no other thread holds it: tried, with a yield between tries, for a few
/// milliseconds at most (a checkpoint under way). Async-signal-safe.
fn output_briefly() -> Option<OutputGuard> {
    for _ in 0..1000 {
        if let Some(guard) = OUTPUT.try_lock() {
            return Some(guard);
        }
        // SAFETY: no arguments.
        unsafe { libc::sched_yield() };
    }
    None
}

/// The output at the process's end (`_exit`, `exec`, an ending signal's default action): once
/// no other thread writes it, waited for up to 2 s. Ending the process while another thread
/// writes (the checkpoint thread, or a program thread ending too: Chromium's children take
/// SIGTERM on two threads at once at shutdown) would leave the files half written. `None` at
/// once if the calling thread holds it itself (a signal handler that interrupted its write,
/// which cannot go on until the handler returns). Async-signal-safe.
fn output_at_end() -> Option<OutputGuard> {
    let me = this_thread();
    for _ in 0..2000 {
        if let Some(guard) = OUTPUT.try_lock() {
            return Some(guard);
        }
        if OUTPUT.holder.load(Ordering::Relaxed) == me {
            return None;
        }
        let ms = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        // SAFETY: sleeps; no memory is written.
        unsafe { libc::nanosleep(&ms, std::ptr::null_mut()) };
    }
    None
}

/// Creates `path` (truncated, a symbolic link not followed) as a descriptor of ours.
fn create(path: &CStr) -> std::io::Result<GuardedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: opens a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o644,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    GuardedFd::adopt(owned, format!("the contention profile {}", path.to_string_lossy()))
}

/// Creates `path` and starts a profile written there at the end; forked children write
/// `base_PID`.
fn start_with_file(path: &str, base: &str, period: u64) -> Result<(), String> {
    let nul = |p: &str| CString::new(p).map_err(|_| format!("{p:?}: a file name with a NUL byte"));
    let (c_path, base) = (nul(path)?, nul(base)?);
    let output = Output::create(std::process::id(), &c_path, base, false)?;
    contention::start(period).map_err(|e| e.to_string())?;
    *output_briefly().ok_or("a contention profile is being written")? = Some(output);
    checkpoint::start(checkpoint_interval());
    // A process ended by a signal's default action (SIGTERM, SIGINT, a crash) writes the file
    // first, as at `_exit`.
    default_actions::hold(Completer::Contention, before_exit, &[]);
    static FORKS_FOLLOWED: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain function to run in forked children.
    FORKS_FOLLOWED.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_forked_child));
    });
    Ok(())
}

/// In a child forked while a profile with a file runs: its own file, `path_PID`, created now
/// (its profile started empty at the fork: `contention::forget_in_child`).
extern "C" fn in_forked_child() {
    // Only cpuprof's checkpoint thread holds the lock across a fork (the forking thread's own
    // holders do not fork), and that thread is not in the child: released.
    OUTPUT.holder.store(0, Ordering::Relaxed);
    OUTPUT.held.store(false, Ordering::Release);
    let Some(mut output) = OUTPUT.try_lock() else { return };
    let Some(parent) = output.as_ref().filter(|_| contention::is_running()) else {
        return;
    };
    let pid = std::process::id();
    let mut path = parent.base.as_bytes().to_vec();
    path.extend_from_slice(format!("_{pid}").as_bytes());
    let Ok(path) = CString::new(path) else { return };
    let base = parent.base.clone();
    *output = match Output::create(pid, &path, base, true) {
        Ok(output) => Some(output),
        Err(e) => {
            // Said by every process: a worker is rarely the process the user started.
            messages::say_for_tree(format_args!("cpuprof: process {pid}: contention profile: {e}"));
            None
        }
    };
    checkpoint::in_forked_child();
}

/// The end of the process (atexit): the profile's file.
pub fn stop_at_exit() {
    write_file();
}

/// Stops the profile started with a file and writes it, with the build-ids of the code;
/// whether it was written. A forked child that recorded nothing removes its file instead.
///
/// The output stays locked while the files are written, and signals are blocked on this
/// thread meanwhile (`SignalsHeld`, as the CPU profile's end does): an ending signal taken
/// here would end the process with the files half written; taken by another thread, its
/// default action waits for the lock ([`output_at_end`]), then finds the output gone.
fn write_file() -> bool {
    let _blocked = cpuprof_core::session::process_end::SignalsHeld::all();
    let Some(mut guard) = output_briefly() else {
        return false;
    };
    let Some(output) = guard.as_ref().filter(|o| o.pid == std::process::id()) else {
        return false;
    };
    contention::stop();
    default_actions::release(Completer::Contention);
    let written = if output.forked && contention::recorded() == 0 {
        output.unlink();
        true
    } else {
        let [waiters, holders] = &output.files;
        let written = write_view(waiters);
        write_view(holders) && written
    };
    drop(guard.take());
    written
}

/// Writes the profile of one view to its file; whether it was written (if not, said).
fn write_view(f: &ViewFile) -> bool {
    let profile = contention::current(f.view);
    let path = f.path.to_string_lossy().into_owned();
    let text = profile.to_text();
    let written = if f.file.is_still_ours() {
        let fd = f.file.raw();
        // SAFETY: our own descriptor, just checked; writes our own bytes.
        let truncated = unsafe { libc::ftruncate(fd, 0) } == 0;
        truncated && write_all_at(fd, &text)
    } else {
        // The program closed or reused our descriptor: by the path, if it can still be opened.
        std::fs::write(&path, &text).is_ok()
    };
    if !written {
        messages::say_for_tree(format_args!(
            "cpuprof: process {}: cannot write the contention profile {path}: {}",
            std::process::id(),
            std::io::Error::last_os_error()
        ));
        return false;
    }
    if profile.discarded > 0 {
        messages::say_for_tree(format_args!(
            "cpuprof: contention profile: {} sampled waits found the table full and are not in {path}",
            profile.discarded
        ));
    }
    true
}

/// Writes `bytes` to `fd` from offset 0.
fn write_all_at(fd: c_int, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: writes from our own slice.
        let n = unsafe { libc::pwrite(fd, bytes[done..].as_ptr().cast(), bytes.len() - done, done as i64) };
        if n < 0 {
            // SAFETY: the thread's errno.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return false;
        }
        done += n as usize;
    }
    true
}

/// `_exit`, `_Exit`, `quick_exit`, and an ending signal's default action
/// (`sampler::default_actions`): the file written without allocating or locking (the call
/// may come from a signal handler that interrupted `malloc`), with no build-id lines; a forked
/// child that recorded nothing removes its file. Nothing in a vfork'ed child, which shares the
/// parent's memory. Async-signal-safe.
pub fn before_exit() {
    let Some(mut output) = output_at_end() else { return };
    if output.as_ref().is_none_or(|o| o.pid != std::process::id()) {
        return;
    }
    // Forgotten, not dropped: dropping would free its path, and free is not safe here.
    let Some(output) = output.take() else { return };
    contention::stop();
    if output.forked && contention::recorded() == 0 {
        output.unlink();
    } else {
        output.write_raw();
    }
    std::mem::forget(output);
}

/// Before an exec: the file written as at `_exit` (the new program writes its own,
/// `path_PID`), the profile left running in case the exec fails (the file is written again at
/// the end). Async-signal-safe.
pub fn before_exec() {
    let Some(output) = output_at_end() else { return };
    if let Some(o) = output.as_ref().filter(|o| o.pid == std::process::id()) {
        o.write_raw();
    }
}

/// A checkpoint (`checkpoint`'s thread): the profile so far written over the file, as at
/// `_exit`.
fn write_checkpoint() {
    let Some(output) = output_briefly() else { return };
    if let Some(o) = output.as_ref().filter(|o| o.pid == std::process::id()) {
        o.write_raw();
    }
}

/// A checkpoint from the lock path (`checkpoint::after_wait`): as [`write_checkpoint`], if the
/// file is free at the first try; whether it was written. Async-signal-safe.
fn try_write_checkpoint() -> bool {
    let Some(output) = OUTPUT.try_lock() else { return false };
    match output.as_ref().filter(|o| o.pid == std::process::id()) {
        Some(o) => {
            o.write_raw();
            true
        }
        None => false,
    }
}

/// `CPUPROFILE_CHECKPOINT`, as for CPU profiles: seconds between checkpoints (2 by default;
/// `off` or 0: none).
fn checkpoint_interval() -> Option<std::time::Duration> {
    let default = Some(cpuprof_core::session::options::DEFAULT_CHECKPOINT);
    match std::env::var("CPUPROFILE_CHECKPOINT") {
        Err(_) => default,
        Ok(text) => cpuprof_core::session::options::parse_checkpoint(&text).unwrap_or(default),
    }
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
    match start_with_file(&path, &path, period) {
        Ok(()) => 1,
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
