//! `libcpuprof.so`: gperftools' `profiler.h` C API, and profiling from `CPUPROFILE` when the
//! library is loaded (linked with `-lcpuprof` or preloaded with `LD_PRELOAD`).
//!
//! Only the functions below are exported. Each is a thin adapter over `cpuprof`'s process-wide
//! session; errors are reported on stderr because the C API has no way to return them.

use cpuprof_core::sampler::ThreadFilter;
use cpuprof_core::session::{autostart, global, Options};
use cpuprof_core::unwind::{self, Registers, THREAD_STACKS};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::UNIX_EPOCH;

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
    autostart::start_from_environment();
    // SAFETY: registers a plain function to run at exit.
    unsafe { libc::atexit(at_exit) };
}

extern "C" fn at_exit() {
    autostart::stop_at_exit();
}

fn start(fname: *const c_char, options: Options) -> c_int {
    if fname.is_null() {
        eprintln!("cpuprof: ProfilerStart: file name is NULL");
        return 0;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(fname) }.to_bytes()));
    match global::start(&path, options) {
        Ok(()) => 1,
        Err(e) => {
            eprintln!("cpuprof: ProfilerStart: {e}");
            0
        }
    }
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
        Err(e) => eprintln!("cpuprof: ProfilerStop: {e}"),
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

/// Declares the calling thread to the profiler: its stack range is recorded so that its
/// stack walks need no readability probes.
#[no_mangle]
pub extern "C" fn ProfilerRegisterThread() {
    THREAD_STACKS.register_current_thread();
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
/// # Safety
/// `result` has room for `max_depth` pointers; `uc` is NULL or a valid `ucontext_t`.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn ProfilerGetStackTrace(
    result: *mut *mut c_void,
    max_depth: c_int,
    skip_count: c_int,
    uc: *const c_void,
) -> c_int {
    let (Ok(max_depth), Ok(skip)) = (usize::try_from(max_depth), usize::try_from(skip_count)) else {
        return 0;
    };
    if result.is_null() || max_depth == 0 {
        return 0;
    }
    let regs = if uc.is_null() {
        caller_registers()
    } else {
        cpuprof_core::sampler::interrupted_registers(uc)
    };
    let top = THREAD_STACKS.vouched_top(unwind::thread_pointer(), regs.sp);
    let mut frames = [0u64; 256];
    let wanted = (max_depth + skip).min(frames.len());
    let n = unwind::walk(regs, top, &mut frames[..wanted]);
    let out = std::slice::from_raw_parts_mut(result, max_depth);
    let kept = n.saturating_sub(skip).min(max_depth);
    for (dst, &pc) in out.iter_mut().zip(&frames[skip..skip + kept]) {
        *dst = pc as *mut c_void;
    }
    kept as c_int
}

/// Registers of `ProfilerGetStackTrace`'s caller: its return address as the PC and the
/// caller's frame as the start of the walk (this function keeps a frame pointer).
#[inline(always)]
fn caller_registers() -> Registers {
    let fp: u64;
    // SAFETY: copies rbp, which holds this frame's frame pointer (inline(never) + force-frame-pointers).
    unsafe { std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    // SAFETY: [fp] and [fp + 8] are this function's saved frame pointer and return address.
    let (caller_fp, ret) = unsafe { (*(fp as *const u64), *((fp + 8) as *const u64)) };
    Registers {
        pc: ret,
        sp: fp,
        fp: caller_fp,
    }
}
