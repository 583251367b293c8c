//! `libcpuprof.so`: gperftools' `profiler.h` C API, and profiling from `CPUPROFILE` when the
//! library is loaded (linked with `-lcpuprof` or preloaded with `LD_PRELOAD`).
//!
//! Only the functions below are exported: the profiler.h API, each a thin adapter over
//! `cpuprof`'s process-wide session (errors go to stderr: the C API cannot return them),
//! `CpuprofServeHttp`, `CpuprofStartDatabase` and the label sets' `CpuprofLabelsIntern` and
//! `CpuprofLabelsSwap` (`include/cpuprof.h`), `pthread_create`, interposed so that every new
//! thread gets its sampling timer as it starts, and `sigaction`, interposed so that our
//! signals wait while the program's handlers run on its small alternate signal stacks
//! (`cpuprof::sampler::signals`). `CPUPROF_HTTP` starts the endpoint at load.
//!
//! The ends of the process that `atexit` does not see are interposed too
//! (`cpuprof::session::process_end`): `_exit`, `_Exit` and `quick_exit` complete the profile
//! first; the exec family (`execve`, `execv`, `execvp`, `execvpe`, `fexecve`, `execveat`)
//! writes what was sampled and makes sure no profiling signal can reach the new image, undoing
//! that if the exec fails. `execl`, `execle` and `execlp`, which are C-variadic (stable Rust
//! cannot define them, and rustc exports no C symbol from a cdylib), are naked Rust functions
//! that jump to C code gathering their arguments for the array forms.
//!
//! The waits that take a signal mask or set (`ppoll`, `pselect`, `epoll_pwait`, `epoll_pwait2`,
//! `sigsuspend`, `sigwait`, `sigwaitinfo`, `sigtimedwait`) and `signalfd` are interposed so that
//! a profiling signal a thread keeps pending neither interrupts the program's wait nor is handed
//! to it as one of its own. Frames of ours that the program's threads can be unwound through
//! (cancellation, `pthread_exit`) are `C-unwind`.
//!
//! The calls that change credentials and so make the process non-dumpable (`setuid`, `setgid`,
//! `seteuid`, `setegid`, `setreuid`, `setregid`, `setresuid`, `setresgid`, `setfsuid`,
//! `setfsgid`, `prctl(PR_SET_DUMPABLE, 0)`) first let a running wall-clock sampler keep what it
//! will no longer be able to open (`cpuprof::wall::before_credential_change`).

mod contention;
mod heap;
mod labels;

use cpuprof_core::in_program::messages;
use cpuprof_core::sampler::{signals, thread_timers, StartChain, ThreadFilter, ROOT_FRAMES};
use cpuprof_core::session::options::{parse_frequency, WallBeside, DEFAULT_FREQUENCY, MAX_WALL_FREQUENCY};
use cpuprof_core::session::{autostart, children, global, process_end, Options};
use cpuprof_core::unwind::{self, StackReader, THREAD_STACKS};
use cpuprof_core::wall;
use cpuprof_core::writer::epochs::{EpochOptions, MIN_EPOCH};
use cpuprof_core::writer::{start_waiting_writer, threadless};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

/// `struct ProfilerOptions` from profiler.h.
#[repr(C)]
pub struct ProfilerOptions {
    pub filter_in_thread: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    pub filter_in_thread_arg: *mut c_void,
}

/// `struct ProfilerState` from profiler.h.
#[repr(C)]
pub struct ProfilerState {
    pub enabled: c_int,
    pub start_time: libc::time_t,
    pub profile_name: [c_char; 1024],
    pub samples_gathered: c_int,
}

#[ctor::ctor(unsafe)]
fn load() {
    resolve_real_functions();
    contention::resolve();
    // Who speaks on stderr, decided before anything is said (`in_program::messages`).
    messages::decide_from_env(|k| std::env::var(k).ok());
    // Before anything can sample or call ProfilerGetStackTrace: stack memory outside the
    // threads' own stacks is read through this descriptor. Without /proc, sessions say so.
    let _ = unwind::safe_read::keep_open();
    // Forked children: their own profiles, and cpuprof's locks free in them.
    children::install_fork_handlers();
    // Our pthread_create (and clone, for threads) starts a waiting writer: a profile may start
    // without a thread.
    // SAFETY: registers a plain function, called by the clone interposer (src/variadic.c).
    unsafe { cpuprof_set_before_thread_clone(before_thread_clone) };
    threadless::enable_deferral();
    autostart::start_from_environment();
    heap::leave_out_own_code();
    heap::start_from_environment();
    cpuprof_core::http::serve_from_env();
    contention::start_from_environment();
    // SAFETY: registers a plain function to run at exit.
    unsafe { libc::atexit(at_exit) };
}

extern "C" fn at_exit() {
    autostart::stop_at_exit();
    heap::stop_at_exit();
    contention::stop_at_exit();
}

fn start(fname: *const c_char, options: Options) -> c_int {
    if fname.is_null() {
        cpuprof_core::say!("cpuprof: ProfilerStart: file name is NULL");
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(fname) }.to_bytes()));
    match global::start(&path, options) {
        Ok(()) => 1,
        Err(e) => {
            cpuprof_core::say!("cpuprof: ProfilerStart: {e}");
            0
        }
    }
}

/// Starts the on-demand HTTP endpoint (`include/cpuprof.h`) on `address` (`port`, `:port` or
/// `host:port`; a bare port binds 127.0.0.1). Returns the port bound, or -1 (reason on stderr).
///
/// # Safety
/// `address` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn CpuprofServeHttp(address: *const c_char) -> c_int {
    if address.is_null() {
        cpuprof_core::say!("cpuprof: CpuprofServeHttp: address is NULL");
        return -1;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let address = unsafe { CStr::from_ptr(address) }.to_string_lossy();
    match cpuprof_core::http::serve(&address) {
        Ok(bound) => {
            cpuprof_core::say!("cpuprof: serving profiles on http://{bound}/pprof/profile");
            c_int::from(bound.port())
        }
        Err(e) => {
            cpuprof_core::say!("cpuprof: CpuprofServeHttp({address}): cannot listen: {e}");
            -1
        }
    }
}

/// Starts epoch mode into the database `dir` (`include/cpuprof.h`); returns 1 on success, 0 if
/// already running or on error.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn CpuprofStartDatabase(dir: *const c_char, epoch_seconds: f64) -> c_int {
    let var = |k: &str| std::env::var(k).ok();
    let mut o = Options::from_env(var);
    let mut epochs = EpochOptions::from_env(var);
    if epoch_seconds > 0.0 && epoch_seconds.is_finite() {
        epochs.length = Duration::from_secs_f64(epoch_seconds.min(1e12)).max(MIN_EPOCH);
    }
    o.epochs = Some(epochs);
    start(dir, o)
}

/// Starts a wall-clock profile of every thread into `wall_fname` at `frequency` samples per
/// second of wall time (<= 0: `CPUPROFILE_WALL_FREQUENCY`, else 100; at most 1000) and, when
/// `cpu_fname` is not NULL, the CPU profile into it in the same run. Stopped by
/// `ProfilerStop`. Returns 1 on success, 0 if already profiling or on error (on stderr).
///
/// # Safety
/// `wall_fname` is a NUL-terminated string; `cpu_fname` NULL or one.
#[no_mangle]
pub unsafe extern "C" fn CpuprofStartWall(
    wall_fname: *const c_char,
    frequency: c_int,
    cpu_fname: *const c_char,
) -> c_int {
    let var = |k: &str| std::env::var(k).ok();
    let mut o = Options::from_env(var);
    let hz = match frequency {
        hz if hz > 0 => hz as u32,
        _ => var("CPUPROFILE_WALL_FREQUENCY").map_or(DEFAULT_FREQUENCY, |hz| parse_frequency(&hz)),
    }
    .min(MAX_WALL_FREQUENCY);
    if cpu_fname.is_null() {
        o.wall = true;
        o.frequency = hz;
        return start(wall_fname, o);
    }
    if wall_fname.is_null() {
        cpuprof_core::say!("cpuprof: CpuprofStartWall: no file name for the wall-clock profile");
        return 0;
    }
    o.wall_beside = Some(WallBeside {
        path: PathBuf::from(std::ffi::OsStr::from_bytes(CStr::from_ptr(wall_fname).to_bytes())),
        frequency: hz,
    });
    start(cpu_fname, o)
}

/// Starts profiling into `fname`; returns 1 on success, 0 if already running or on error.
#[no_mangle]
pub extern "C" fn ProfilerStart(fname: *const c_char) -> c_int {
    start(fname, Options::from_env(|k| std::env::var(k).ok()))
}

/// As `ProfilerStart`, with a `filter_in_thread` callback run in the signal handler.
///
/// # Safety
/// `options` is NULL or points to a valid `ProfilerOptions`.
#[no_mangle]
pub unsafe extern "C" fn ProfilerStartWithOptions(fname: *const c_char, options: *const ProfilerOptions) -> c_int {
    let mut o = Options::from_env(|k| std::env::var(k).ok());
    if let Some(opts) = options.as_ref() {
        o.filter = opts.filter_in_thread.map(|func| ThreadFilter {
            func,
            arg: opts.filter_in_thread_arg,
        });
    }
    start(fname, o)
}

/// Stops profiling and writes the trailer and the maps.
#[no_mangle]
pub extern "C" fn ProfilerStop() {
    match global::stop() {
        Ok(_) | Err(cpuprof_core::Error::NotRunning) => {}
        Err(e) => cpuprof_core::say!("cpuprof: ProfilerStop: {e}"),
    }
}

/// Writes what has been sampled so far to the file.
#[no_mangle]
pub extern "C" fn ProfilerFlush() {
    let _ = global::flush();
}

/// Deprecated no-op, as upstream.
#[no_mangle]
pub extern "C" fn ProfilerEnable() {}

/// Deprecated no-op, as upstream.
#[no_mangle]
pub extern "C" fn ProfilerDisable() {}

/// 1 while a process-wide timer samples every thread.
#[no_mangle]
pub extern "C" fn ProfilingIsEnabledForAllThreads() -> c_int {
    global::info().is_some() as c_int
}

/// Declares the calling thread to the profiler: it gets its per-thread timer now (every
/// thread is sampled anyway, this only closes the gap before the writer's next poll), and its
/// stack range is recorded so that its walks need no readability probes.
#[no_mangle]
pub extern "C" fn ProfilerRegisterThread() {
    thread_timers::on_thread_start(None);
    THREAD_STACKS.register_current_thread();
}

/// Interposes `sigaction(2)`: see `cpuprof::sampler::signals::application_sigaction`.
///
/// # Safety
/// The arguments of `sigaction(2)`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    signals::application_sigaction(signal, act, old)
}

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// Interposes `dlclose(3)`: in a process without a writer thread yet, the objects' mappings
/// and build-ids are recorded first, so code unloaded before the profile ends is still named
/// (`writer::before_unload`). (Not `dlopen`: glibc finds the library from the calling
/// object's run path, which an interposer would replace with its own.)
///
/// # Safety
/// As `dlclose(3)`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    cpuprof_core::writer::before_unload();
    match real::<DlcloseFn>(Real::Dlclose) {
        Some(f) => f(handle),
        None => -1,
    }
}

/// Interposes `signal(3)`: glibc's sets the disposition through its internal `sigaction`,
/// which the interposed one would never see (see `signals::application_signal`).
///
/// # Safety
/// The arguments of `signal(3)`.
#[no_mangle]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    signals::application_signal(signal, handler)
}

/// The program's start routine. `C-unwind`: a thread cancelled or ending with `pthread_exit`
/// is unwound from inside it, through [`start_thread`], up to glibc's thread start.
type StartRoutine = extern "C-unwind" fn(*mut c_void) -> *mut c_void;
type PthreadCreate =
    unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartRoutine, *mut c_void) -> c_int;

/// glibc's `pthread_create`, found once with `dlsym(RTLD_NEXT)`.
fn real_pthread_create() -> Option<PthreadCreate> {
    static REAL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym with a constant NUL-terminated name; RTLD_NEXT skips this library.
    let addr = *REAL.get_or_init(|| unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) } as usize);
    // SAFETY: a non-null result is glibc's pthread_create, which has this signature.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, PthreadCreate>(addr) })
}

/// Interposes thread creation: the new thread arms its own sampling timer before running
/// the application's start routine, and deletes it when it exits (see
/// `cpuprof::sampler::thread_timers`).
///
/// # Safety
/// The arguments of `pthread_create(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartRoutine,
    arg: *mut c_void,
) -> c_int {
    let Some(real) = real_pthread_create() else {
        return libc::EAGAIN;
    };
    before_thread_clone();
    let call = Box::into_raw(Box::new((start, arg)));
    let rc = real(thread, attr, start_thread, call as *mut c_void);
    if rc != 0 {
        drop(Box::from_raw(call));
    }
    rc
}

/// The start routine glibc runs for a thread made through our `pthread_create`. `C-unwind`, as
/// the program's: cancellation and `pthread_exit` unwind through this frame (nothing of ours
/// runs after `start` returns, and nothing here has a destructor left to run by then).
extern "C-unwind" fn start_thread(call: *mut c_void) -> *mut c_void {
    // SAFETY: `call` is the box made by our pthread_create for this thread.
    let (start, arg) = *unsafe { Box::from_raw(call as *mut (StartRoutine, *mut c_void)) };
    let mut callers = [0u64; ROOT_FRAMES];
    let n = own_callers(&mut callers);
    thread_timers::on_thread_start(Some(&StartChain::new(start as usize as u64, &callers[..n])));
    start(arg)
}

/// The call chain of the calling function (a return address inside it, then its callers),
/// walked as samples are: a thread's start wrapper records it once, so that what the thread
/// owes at exit is charged above the same frames as its other samples.
#[inline(never)]
fn own_callers(out: &mut [u64; ROOT_FRAMES]) -> usize {
    // The walk starts inside this function: its own frame is dropped.
    let mut frames = [0u64; ROOT_FRAMES + 1];
    let n = cpuprof_core::sampler::walk_outside_handler(cpuprof_core::sampler::calling_registers(), &mut frames);
    let kept = n.saturating_sub(1);
    out[..kept].copy_from_slice(&frames[1..n.max(1)]);
    kept
}

/// The glibc functions interposed on process ends, in [`REAL`].
#[derive(Clone, Copy)]
enum Real {
    Exit,
    UpperExit,
    QuickExit,
    Execve,
    Execv,
    Execvp,
    Execvpe,
    Fexecve,
    Execveat,
    Ppoll,
    Pselect,
    EpollPwait,
    EpollPwait2,
    Sigsuspend,
    Sigwait,
    Sigwaitinfo,
    Sigtimedwait,
    Signalfd,
    Dlclose,
    Setuid,
    Setgid,
    Seteuid,
    Setegid,
    Setreuid,
    Setregid,
    Setresuid,
    Setresgid,
    Setfsuid,
    Setfsgid,
    Prctl,
}

const REAL_NAMES: [&CStr; 30] = [
    c"_exit",
    c"_Exit",
    c"quick_exit",
    c"execve",
    c"execv",
    c"execvp",
    c"execvpe",
    c"fexecve",
    c"execveat",
    c"ppoll",
    c"pselect",
    c"epoll_pwait",
    c"epoll_pwait2",
    c"sigsuspend",
    c"sigwait",
    c"sigwaitinfo",
    c"sigtimedwait",
    c"signalfd",
    c"dlclose",
    c"setuid",
    c"setgid",
    c"seteuid",
    c"setegid",
    c"setreuid",
    c"setregid",
    c"setresuid",
    c"setresgid",
    c"setfsuid",
    c"setfsgid",
    c"prctl",
];

/// Their addresses, found once at load: dlsym takes the loader's lock and may allocate, and
/// these are called from signal handlers and vfork children.
static REAL: [AtomicUsize; 30] = [const { AtomicUsize::new(0) }; 30];

fn resolve_real_functions() {
    for (slot, name) in REAL.iter().zip(REAL_NAMES) {
        // SAFETY: dlsym with a constant NUL-terminated name; RTLD_NEXT skips this library.
        slot.store(
            unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize,
            Ordering::Relaxed,
        );
    }
}

/// glibc's `which`, as a function of type `F` (the caller names the right one), or `None` if
/// glibc has none (execveat before 2.34).
///
/// # Safety
/// `F` is the C signature of `which`.
unsafe fn real<F: Copy>(which: Real) -> Option<F> {
    let slot = &REAL[which as usize];
    let mut addr = slot.load(Ordering::Relaxed);
    if addr == 0 {
        // Called before our constructor ran (from another library's): look it up now.
        resolve_real_functions();
        addr = slot.load(Ordering::Relaxed);
    }
    // SAFETY: a non-null address of the function named, which has signature F.
    (addr != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&addr) })
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// Ends the process with glibc's `which` (an `_exit`-like function), or the system call.
unsafe fn end_with(which: Real, status: c_int) -> ! {
    if let Some(end) = real::<ExitFn>(which) {
        end(status)
    }
    loop {
        libc::syscall(libc::SYS_exit_group, status);
    }
}

/// `_exit`: completes the profile (records, trailer, maps), then ends the process. In a forked
/// or vfork'ed child it only reads one word before ending.
///
/// # Safety
/// As `_exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    process_end::before_exit();
    contention::before_exit();
    end_with(Real::Exit, status)
}

/// `_Exit`: as `_exit`.
///
/// # Safety
/// As `_Exit(3)`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    process_end::before_exit();
    contention::before_exit();
    end_with(Real::UpperExit, status)
}

/// `quick_exit`: completes the profile, then runs the `at_quick_exit` handlers and ends.
///
/// # Safety
/// As `quick_exit(3)`.
#[no_mangle]
pub unsafe extern "C" fn quick_exit(status: c_int) -> ! {
    process_end::before_exit();
    contention::before_exit();
    end_with(Real::QuickExit, status)
}

type Argv = *const *const c_char;

/// Runs the exec `call` of the glibc function at `real`: prepares the profiler (see the
/// module's comment), and restores profiling if the exec fails (errno kept).
unsafe fn exec_with(real: usize, call: impl FnOnce() -> c_int) -> c_int {
    let prepared = process_end::before_exec(real as u64);
    contention::before_exec();
    let rc = call();
    if let Some(prepared) = prepared {
        prepared.exec_failed();
    }
    rc
}

fn enosys() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

// The C-variadic exec functions: naked functions that jump, with the caller's registers and
// stack untouched, to their C implementations (src/variadic.c), which gather the
// arguments and call the interposed array forms above and below.
macro_rules! variadic_exec {
    ($name:ident, $shim:ident) => {
        unsafe extern "C" {
            fn $shim();
        }
        /// Interposed: gathers the arguments (in C) and calls the array form, prepared for
        /// like every exec.
        ///
        /// # Safety
        /// The arguments of the libc function of the same name.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {}", sym $shim);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {}", sym $shim);
        }
    };
}

variadic_exec!(execl, cpuprof_execl);
variadic_exec!(execlp, cpuprof_execlp);
variadic_exec!(execle, cpuprof_execle);
// Not an exec, but C-variadic too: a thread made by glibc's clone wrapper starts a waiting
// writer first, as pthread_create does (src/variadic.c).
variadic_exec!(clone, cpuprof_clone);
// C-variadic too: futex waits timed for the contention profile (src/variadic.c).
variadic_exec!(syscall, cpuprof_syscall);

unsafe extern "C" {
    fn cpuprof_set_before_thread_clone(hook: extern "C" fn());
}

/// The program is about to start a thread (`pthread_create`, or `clone` for a thread): a
/// profile that started without a thread of its own (`writer::threadless`) gets its writer
/// now, a heap profile its thread (`heap::poller`), and a contention profile its checkpoints
/// (`contention::checkpoint`).
extern "C" fn before_thread_clone() {
    start_waiting_writer();
    cpuprof_core::heap::start_if_deferred();
    contention::checkpoint::start_if_deferred();
}

/// # Safety
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    type F = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
    match real::<F>(Real::Execve) {
        Some(f) => exec_with(f as usize, || f(path, argv, envp)),
        None => exec_with(execve as *const () as usize, || {
            libc::syscall(libc::SYS_execve, path, argv, envp) as c_int
        }),
    }
}

/// # Safety
/// As `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    type F = unsafe extern "C" fn(*const c_char, Argv) -> c_int;
    match real::<F>(Real::Execv) {
        Some(f) => exec_with(f as usize, || f(path, argv)),
        None => enosys(),
    }
}

/// # Safety
/// As `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    type F = unsafe extern "C" fn(*const c_char, Argv) -> c_int;
    match real::<F>(Real::Execvp) {
        Some(f) => exec_with(f as usize, || f(file, argv)),
        None => enosys(),
    }
}

/// # Safety
/// As `execvpe(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    type F = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
    match real::<F>(Real::Execvpe) {
        Some(f) => exec_with(f as usize, || f(file, argv, envp)),
        None => enosys(),
    }
}

/// # Safety
/// As `fexecve(3)`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    type F = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
    match real::<F>(Real::Fexecve) {
        Some(f) => exec_with(f as usize, || f(fd, argv, envp)),
        None => enosys(),
    }
}

/// # Safety
/// As `execveat(2)`.
#[no_mangle]
pub unsafe extern "C" fn execveat(dirfd: c_int, path: *const c_char, argv: Argv, envp: Argv, flags: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int;
    match real::<F>(Real::Execveat) {
        Some(f) => exec_with(f as usize, || f(dirfd, path, argv, envp, flags)),
        None => exec_with(execveat as *const () as usize, || {
            libc::syscall(libc::SYS_execveat, dirfd, path, argv, envp, flags) as c_int
        }),
    }
}

/// Fills `state` with the current profiling state.
///
/// # Safety
/// `state` is NULL or points to a writable `ProfilerState`.
#[no_mangle]
pub unsafe extern "C" fn ProfilerGetCurrentState(state: *mut ProfilerState) {
    let Some(state) = state.as_mut() else { return };
    state.profile_name = [0; 1024];
    match global::info() {
        Some(info) => {
            state.enabled = 1;
            state.start_time = info
                .start_time
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as libc::time_t);
            state.samples_gathered = info.samples.min(c_int::MAX as u64) as c_int;
            let name = info.path.as_os_str().as_encoded_bytes();
            for (dst, &src) in state.profile_name.iter_mut().zip(name.iter().take(1023)) {
                *dst = src as c_char;
            }
        }
        None => {
            state.enabled = 0;
            state.start_time = 0;
            state.samples_gathered = 0;
        }
    }
}

/// Walks the stack of the caller (or of the context `uc`, a `ucontext_t*` from a signal
/// handler) into `result`, skipping `skip_count` frames; returns the number stored.
/// Async-signal-safe.
///
/// Naked: the walk starts from the caller's registers as they are at the call (return address,
/// stack pointer, frame pointer), read before any code of this library runs. A library built
/// without frame pointers uses rbp (x29) for anything, so registers read later, inside a Rust
/// function, would start the walk from whatever it put there.
///
/// # Safety
/// `result` has room for `max_depth` pointers; `uc` is NULL or a valid `ucontext_t`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn ProfilerGetStackTrace(
    result: *mut *mut c_void,
    max_depth: c_int,
    skip_count: c_int,
    uc: *const c_void,
) -> c_int {
    // Arguments 5 and 6 (7): where the return address is and the caller's rbp; on aarch64 the
    // return address, the stack pointer and the caller's x29.
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("mov r8, rsp", "mov r9, rbp", "jmp {}", sym stack_trace_from_call);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("mov x4, x30", "mov x5, sp", "mov x6, x29", "b {}", sym stack_trace_from_call);
}

/// [`ProfilerGetStackTrace`] with the caller's registers at the call: `at_call` is the stack
/// pointer at the call instruction's target (the return address on top).
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn stack_trace_from_call(
    result: *mut *mut c_void,
    max_depth: c_int,
    skip_count: c_int,
    uc: *const c_void,
    at_call: *const u64,
    fp: u64,
) -> c_int {
    let caller = unwind::Registers::new(*at_call, at_call as u64 + 8, fp);
    stack_trace(result, max_depth, skip_count, uc, caller)
}

/// [`ProfilerGetStackTrace`] with the caller's registers at the call.
#[cfg(target_arch = "aarch64")]
unsafe extern "C" fn stack_trace_from_call(
    result: *mut *mut c_void,
    max_depth: c_int,
    skip_count: c_int,
    uc: *const c_void,
    pc: u64,
    sp: u64,
    fp: u64,
) -> c_int {
    stack_trace(result, max_depth, skip_count, uc, unwind::Registers::new(pc, sp, fp))
}

/// The walk of [`ProfilerGetStackTrace`]: from `uc` if given, else from `caller`, the caller's
/// registers at the call.
unsafe fn stack_trace(
    result: *mut *mut c_void,
    max_depth: c_int,
    skip_count: c_int,
    uc: *const c_void,
    caller: unwind::Registers,
) -> c_int {
    let (Ok(max_depth), Ok(skip)) = (usize::try_from(max_depth), usize::try_from(skip_count)) else {
        return 0;
    };
    if result.is_null() || max_depth == 0 {
        return 0;
    }
    let regs = if uc.is_null() {
        caller
    } else {
        cpuprof_core::sampler::interrupted_registers(uc)
    };
    let top = THREAD_STACKS.vouched_top(unwind::thread_pointer(), regs.sp);
    let mut frames = [0u64; 256];
    let wanted = (max_depth + skip).min(frames.len());
    // Small: this runs on the caller's stack, possibly a signal handler's.
    let mut window = [0u64; 32];
    let n = unwind::walk(
        regs,
        &mut StackReader::new(regs.sp, top, &mut window),
        &mut frames[..wanted],
    );
    let out = std::slice::from_raw_parts_mut(result, max_depth);
    let kept = n.saturating_sub(skip).min(max_depth);
    for (dst, &pc) in out.iter_mut().zip(&frames[skip..skip + kept]) {
        *dst = pc as *mut c_void;
    }
    kept as c_int
}
/// Waits whose signal mask would unblock the profiling signal keep it blocked
/// (`signals::keep_profiling_signals_blocked`): a signal left pending by a thread that blocks it
/// while running must not interrupt the program's wait. Without glibc's function (epoll_pwait2
/// before 2.35) the program could not have called it: ENOSYS.
///
/// These waits and the sigwait family are cancellation points: glibc cancels a thread blocked
/// in one by unwinding it from inside glibc's function, through the interposer's frame. So the
/// interposers and glibc's functions are `C-unwind`, and nothing runs after the call (there is
/// nothing to undo: the mask or set given to glibc is a copy on the stack).
macro_rules! masked_wait {
    ($name:ident, $which:ident, ($($arg:ident: $ty:ty),*), $mask:ident) => {
        /// Interposed: the program's call, with the profiling signals kept blocked in its mask.
        ///
        /// # Safety
        /// The arguments of the libc function of the same name.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty,)* $mask: *const libc::sigset_t) -> c_int {
            type F = unsafe extern "C-unwind" fn($($ty,)* *const libc::sigset_t) -> c_int;
            let mut copy: libc::sigset_t = std::mem::zeroed();
            let mask = signals::keep_profiling_signals_blocked($mask, &mut copy);
            match real::<F>(Real::$which) {
                Some(f) => f($($arg,)* mask),
                None => {
                    *libc::__errno_location() = libc::ENOSYS;
                    -1
                }
            }
        }
    };
}

masked_wait!(ppoll, Ppoll, (fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: *const libc::timespec), mask);
masked_wait!(pselect, Pselect, (nfds: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *const libc::timespec), mask);
masked_wait!(epoll_pwait, EpollPwait, (epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int), mask);
masked_wait!(epoll_pwait2, EpollPwait2, (epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: *const libc::timespec), mask);
masked_wait!(sigsuspend, Sigsuspend, (), mask);

/// Waits for a set of signals never take the profiling signals (see
/// `signals::without_profiling_signals`).
macro_rules! signal_wait {
    ($name:ident, $which:ident, ($($arg:ident: $ty:ty),*), $ret:expr) => {
        /// Interposed: the program's call, with the profiling signals taken out of its set.
        ///
        /// # Safety
        /// The arguments of the libc function of the same name.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(set: *const libc::sigset_t, $($arg: $ty),*) -> c_int {
            type F = unsafe extern "C-unwind" fn(*const libc::sigset_t, $($ty),*) -> c_int;
            let mut copy: libc::sigset_t = std::mem::zeroed();
            let set = signals::without_profiling_signals(set, &mut copy);
            match real::<F>(Real::$which) {
                Some(f) => f(set, $($arg),*),
                None => $ret,
            }
        }
    };
}

signal_wait!(sigwait, Sigwait, (sig: *mut c_int), libc::ENOSYS);
signal_wait!(sigwaitinfo, Sigwaitinfo, (info: *mut libc::siginfo_t), {
    *libc::__errno_location() = libc::ENOSYS;
    -1
});
signal_wait!(sigtimedwait, Sigtimedwait, (info: *mut libc::siginfo_t, timeout: *const libc::timespec), {
    *libc::__errno_location() = libc::ENOSYS;
    -1
});

/// Interposes `signalfd(2)`: the program's call, with the profiling signals taken out of its
/// mask (`signals::without_profiling_signals`), for a new signalfd and for a new mask of an
/// existing one. A daemon that blocks every signal and reads them all from a signalfd would
/// otherwise read the profiling signal its threads keep pending as one of its own. Not a
/// cancellation point.
///
/// # Safety
/// The arguments of `signalfd(2)`.
#[no_mangle]
pub unsafe extern "C" fn signalfd(fd: c_int, mask: *const libc::sigset_t, flags: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_int, *const libc::sigset_t, c_int) -> c_int;
    let mut copy: libc::sigset_t = std::mem::zeroed();
    let mask = signals::without_profiling_signals(mask, &mut copy);
    match real::<F>(Real::Signalfd) {
        Some(f) => f(fd, mask, flags),
        None => enosys(),
    }
}

/// Whether a call setting the effective (or filesystem) id to `id` changes it from `current`:
/// only then does the kernel make the process non-dumpable. `-1` leaves an id unchanged.
fn changes_id(id: u32, current: u32) -> bool {
    id != u32::MAX && id != current
}

/// Runs glibc's `which` through `call`, or fails with ENOSYS if it has none.
unsafe fn credential_call<F: Copy>(which: Real, call: impl FnOnce(F) -> c_int) -> c_int {
    match real::<F>(which) {
        Some(f) => call(f),
        None => enosys(),
    }
}

type SetId = unsafe extern "C" fn(u32) -> c_int;
type SetTwoIds = unsafe extern "C" fn(u32, u32) -> c_int;
type SetThreeIds = unsafe extern "C" fn(u32, u32, u32) -> c_int;

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setuid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setuid(uid: libc::uid_t) -> c_int {
    if changes_id(uid, libc::geteuid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Setuid, |f| f(uid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setgid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setgid(gid: libc::gid_t) -> c_int {
    if changes_id(gid, libc::getegid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Setgid, |f| f(gid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `seteuid(2)`.
#[no_mangle]
pub unsafe extern "C" fn seteuid(euid: libc::uid_t) -> c_int {
    if changes_id(euid, libc::geteuid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Seteuid, |f| f(euid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setegid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setegid(egid: libc::gid_t) -> c_int {
    if changes_id(egid, libc::getegid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Setegid, |f| f(egid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setreuid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setreuid(ruid: libc::uid_t, euid: libc::uid_t) -> c_int {
    if changes_id(euid, libc::geteuid()) {
        wall::before_credential_change();
    }
    credential_call::<SetTwoIds>(Real::Setreuid, |f| f(ruid, euid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setregid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setregid(rgid: libc::gid_t, egid: libc::gid_t) -> c_int {
    if changes_id(egid, libc::getegid()) {
        wall::before_credential_change();
    }
    credential_call::<SetTwoIds>(Real::Setregid, |f| f(rgid, egid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setresuid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int {
    if changes_id(euid, libc::geteuid()) {
        wall::before_credential_change();
    }
    credential_call::<SetThreeIds>(Real::Setresuid, |f| f(ruid, euid, suid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setresgid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t) -> c_int {
    if changes_id(egid, libc::getegid()) {
        wall::before_credential_change();
    }
    credential_call::<SetThreeIds>(Real::Setresgid, |f| f(rgid, egid, sgid))
}

/// Interposed: see the module's documentation on credential changes. (`setfsuid(-1)` only asks.)
///
/// # Safety
/// As `setfsuid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setfsuid(fsuid: libc::uid_t) -> c_int {
    if changes_id(fsuid, libc::geteuid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Setfsuid, |f| f(fsuid))
}

/// Interposed: see the module's documentation on credential changes.
///
/// # Safety
/// As `setfsgid(2)`.
#[no_mangle]
pub unsafe extern "C" fn setfsgid(fsgid: libc::gid_t) -> c_int {
    if changes_id(fsgid, libc::getegid()) {
        wall::before_credential_change();
    }
    credential_call::<SetId>(Real::Setfsgid, |f| f(fsgid))
}

/// Interposed for `PR_SET_DUMPABLE` 0 (see the module's documentation on credential changes);
/// every other option goes straight to glibc. glibc's `prctl` is C-variadic and reads its four
/// further arguments whatever the option, as integers in the registers where this function
/// receives them (x86-64 and aarch64 pass variadic integers as fixed ones), so passing them
/// on is what the program's call would have done.
///
/// # Safety
/// As `prctl(2)`.
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: c_int,
    arg2: libc::c_ulong,
    arg3: libc::c_ulong,
    arg4: libc::c_ulong,
    arg5: libc::c_ulong,
) -> c_int {
    if option == libc::PR_SET_DUMPABLE && arg2 == 0 {
        wall::before_credential_change();
    }
    type F = unsafe extern "C" fn(c_int, ...) -> c_int;
    match real::<F>(Real::Prctl) {
        Some(f) => f(option, arg2, arg3, arg4, arg5),
        None => libc::syscall(libc::SYS_prctl, option, arg2, arg3, arg4, arg5) as c_int,
    }
}
