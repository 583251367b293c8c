//! Ends of the process that `atexit` never sees, for libcpuprof.so's interposers of `_exit`,
//! `_Exit`, `quick_exit` and the `exec` family.
//!
//! Both paths may run in a forked or vfork'ed child (which must not touch the parent's file,
//! nor, for vfork, write the memory it shares with the parent) and in a signal handler (a
//! SIGTERM handler calling `_exit` is common; `execve` is async-signal-safe), where any lock or
//! allocation could deadlock against the interrupted code. So the calling thread only reads
//! the pid of the process whose writer runs, and otherwise uses atomics, futexes, signal-mask
//! calls and locks tried for a bounded time: the writer thread does the work (allocating,
//! reading /proc/self/maps) and the caller waits for it at most [`END_WAIT`]. If the writer is
//! stuck (on a lock the interrupted code holds), the process ends anyway with the records
//! harvested so far, and says so.
//!
//! Not covered, by choice: `abort` and fatal signals (the process state may be corrupt: heap
//! corruption aborts from inside malloc, whose lock the writer would need; the harvested
//! records stay readable as after SIGKILL), and `exit_group` made with `syscall()` directly
//! (no libc entry point to interpose; rare outside runtimes such as Go's, which do not run
//! under LD_PRELOAD profilers anyway).

use super::children;
use crate::sampler::{self, thread_timers, timer};
use crate::writer::{self, threadless, EndRequest};
use std::ffi::c_int;
use std::time::Duration;

/// How long the ending thread waits for the writer: ample for the final harvest, trailer and
/// maps (milliseconds normally), short enough that a stuck writer delays the end little.
pub const END_WAIT: Duration = Duration::from_secs(2);

/// How long the exec path waits for a timer registry's lock. Held only briefly in normal
/// operation (the writer's tick, a thread starting); not free within this, it is held by the
/// code a signal handler interrupted.
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// Before `_exit`: the writer writes everything sampled, the trailer and the maps, and closes
/// the file. Nothing happens in a process whose writer is not its own (forked child).
pub fn before_exit() {
    let errno = save_errno();
    // A fatal signal arriving now (a pool's `terminate` racing its worker's `_exit`) waits:
    // its handler would find the file held by this very thread and give up. It stays blocked
    // (the mask is not restored): the process ends by `_exit` right after, as it did without
    // the profiler, where the exit came first. (In a signal's handler, the handler's return
    // restores the mask, and the signal re-raised takes its default action.)
    std::mem::forget(SignalsHeld::all());
    let deadline = crate::in_program::futex::monotonic_now() + END_WAIT;
    loop {
        if threadless::active() {
            // No writer thread runs: completed here, once the file is free (a handler on
            // another thread may be writing the ring, or a writer starting may be taking it).
            let done = sampler::with_published_state(|state| {
                let done = threadless::complete(state);
                if done {
                    threadless::say_summary(state);
                }
                done
            });
            if done == Some(true) {
                children::child_profile_ended(took_a_sample().unwrap_or(true));
                break;
            }
            if done.is_none() || crate::in_program::futex::monotonic_now() >= deadline {
                say(b"cpuprof: the profile could not be completed before the process ended; it holds the records written so far\n");
                break;
            }
            pause_a_millisecond();
            continue;
        }
        match writer::request_end(true, deadline.saturating_sub(crate::in_program::futex::monotonic_now())) {
            EndRequest::TimedOut => say(b"cpuprof: the profile could not be completed before the process ended; it holds the records written so far\n"),
            EndRequest::Served => children::child_profile_ended(took_a_sample().unwrap_or(true)),
            EndRequest::NoWriter => {}
        }
        break;
    }
    restore_errno(errno);
}

/// Every signal blocked on the calling thread (but those glibc keeps for itself) until this is
/// dropped, which restores the mask it found. Async-signal-safe.
pub struct SignalsHeld(libc::sigset_t);

impl SignalsHeld {
    pub fn all() -> SignalsHeld {
        // SAFETY: plain signal-mask calls on local sets.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsHeld(old)
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask `all` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Whether the running profile has taken a sample; `None` if no state is published any more.
/// Async-signal-safe.
fn took_a_sample() -> Option<bool> {
    sampler::with_published_state(|s| s.interrupts.load(std::sync::atomic::Ordering::Relaxed) > 0)
}

fn pause_a_millisecond() {
    let ms = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: nanosleep with a valid duration; async-signal-safe.
    unsafe { libc::nanosleep(&ms, std::ptr::null_mut()) };
}

/// Before the process ends by the default action of a signal (`sampler::default_actions`),
/// in that signal's handler: as [`before_exit`].
pub fn before_signal_end() {
    before_exit();
}

/// What `before_exec` changed, to undo if the exec fails.
pub struct ExecPrepared {
    thread_timer: Option<thread_timers::PausedThreadTimer>,
    process_timer: Option<timer::PausedTimer>,
    /// The file was completed in place (no writer thread), to take back if the exec fails.
    completed_in_place: bool,
}

/// Before an `exec` of the profiling process: stops the timer that can signal the calling
/// thread (its own per-thread timer, or the process-wide one), takes any profiling signal
/// already queued off the queue (kernels before 6.13 deliver a signal queued during `execve`
/// to the new image, whose default action for it kills), and completes the file with
/// everything sampled so far (records, trailer, maps: the image's profile ends here; the new
/// one, same pid, writes `<path>_<pid>`). If the exec fails, the trailer is taken back and
/// profiling goes on. `exec_pc`: where the taken signals are counted (the exec function).
/// Returns `None`, having done nothing, when this process does not profile (a forked child).
/// The signal mask is as the caller had it when this returns.
pub fn before_exec(exec_pc: u64) -> Option<ExecPrepared> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if !writer::runs_in(pid) && !threadless::active() {
        return None;
    }
    let errno = save_errno();
    // Per-thread timers: the signal is known first and blocked while the timer is stopped.
    // The process timer's is known once it is paused; a signal landing before it is blocked
    // is delivered to the handler as usual.
    let thread_signal = thread_timers::running_signal(LOCK_WAIT);
    let mut old_mask = thread_signal.map(block);
    let thread_timer = thread_signal.and_then(|_| thread_timers::pause_calling_thread(LOCK_WAIT));
    let (process_signal, process_timer) = match thread_signal {
        Some(_) => (None, None),
        None => timer::pause(LOCK_WAIT).unzip(),
    };
    if let Some(signal) = thread_signal.or(process_signal) {
        let old = *old_mask.get_or_insert_with(|| block(signal));
        take_queued(signal, exec_pc);
        // SAFETY: restores the caller's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    let mut completed_in_place = false;
    // As in `before_exit`: a fatal signal waits until the file is complete (the mask is the
    // caller's again before the exec).
    let _quiet = SignalsHeld::all();
    if children::is_profiled_child() {
        end_child_for_exec();
    } else if threadless::active() {
        completed_in_place = sampler::with_published_state(threadless::complete_for_exec).unwrap_or(false);
    } else if writer::request_end(false, END_WAIT) == EndRequest::TimedOut {
        say(b"cpuprof: the samples before exec could not all be written to the profile\n");
    }
    restore_errno(errno);
    Some(ExecPrepared {
        thread_timer,
        process_timer,
        completed_in_place,
    })
}

/// A forked child's `exec`: its profile ends here (the new image, under the same pid, writes
/// its own `<path>_<pid>` if it profiles). A profile without a sample is removed; one with
/// samples is completed and kept as `<path>_<pid>.pre-exec`. If the exec fails, the child's
/// profile stays ended.
fn end_child_for_exec() {
    let sampled = took_a_sample().unwrap_or(false);
    if threadless::active() {
        sampler::with_published_state(threadless::complete);
    } else if writer::request_end(true, END_WAIT) == EndRequest::TimedOut {
        say(b"cpuprof: the samples before exec could not all be written to the profile\n");
    }
    if sampled {
        children::child_profile_completed();
    } else {
        children::child_replaced_by_exec();
    }
    if let Some((path, kept)) = children::profile_paths() {
        // SAFETY: NUL-terminated paths made when the child's profile started.
        unsafe {
            if sampled {
                libc::rename(path.as_ptr(), kept.as_ptr());
            } else {
                libc::unlink(path.as_ptr());
            }
        }
    }
}

impl ExecPrepared {
    /// The exec failed: profiling goes on as before.
    pub fn exec_failed(self) {
        let errno = save_errno();
        if self.completed_in_place {
            threadless::resume_after_failed_exec();
        }
        writer::exec_failed();
        if let Some(paused) = self.thread_timer {
            thread_timers::resume(paused, LOCK_WAIT);
        }
        if let Some(paused) = self.process_timer {
            timer::resume(paused, LOCK_WAIT);
        }
        restore_errno(errno);
    }
}

/// Blocks `signal` in the calling thread; returns the previous mask.
fn block(signal: c_int) -> libc::sigset_t {
    // SAFETY: plain signal-mask calls on locals.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Takes every queued instance of `signal` (blocked by the caller) off the calling thread's and
/// the process's queues, each counted as a sample at `pc`.
///
/// The system call itself, not libc's `sigtimedwait`: in libcpuprof.so that name resolves to
/// the library's own interposer, which takes the profiling signals out of the set, so the
/// queued signal would stay and reach the new image.
fn take_queued(signal: c_int, pc: u64) {
    // The kernel's sigset is 64 bits, not glibc's 1024-bit `sigset_t`.
    const KERNEL_SIGSET_BYTES: libc::c_long = 8;
    // SAFETY: rt_sigtimedwait with a zero timeout on a local set and siginfo; it never blocks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let mut info: libc::siginfo_t = std::mem::zeroed();
        while libc::syscall(
            libc::SYS_rt_sigtimedwait,
            &set as *const libc::sigset_t,
            &mut info as *mut libc::siginfo_t,
            &zero as *const libc::timespec,
            KERNEL_SIGSET_BYTES,
        ) == signal as libc::c_long
        {
            sampler::handler::record_taken_signal(&info, pc);
        }
    }
}

fn save_errno() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

fn restore_errno(errno: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Writes a message to stderr without Rust's stderr lock (the caller may be a signal handler
/// that interrupted its holder), if this process speaks.
fn say(message: &[u8]) {
    crate::in_program::messages::say_bytes(message);
}
