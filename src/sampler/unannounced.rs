//! Threads nobody announces, armed from the signal handler while the process has no writer
//! thread (`writer::threadless`).
//!
//! A thread made by raw `clone` (a minimal runtime's) never passes the `pthread_create`
//! interposer, so it neither starts a waiting writer nor gets a timer; the writer's poll of
//! `/proc/self/task` is what finds such threads, and a single-threaded process has no writer.
//! So the handler looks instead, with system calls only: at most every `LOOK_INTERVAL_NS`
//! (10 ms), it compares the thread count (`fstat` of `/proc/self/task`, opened beforehand)
//! with what it knows, and when it moved, lists the directory (`getdents64` into a buffer set aside), arms
//! a POSIX CPU timer for each thread it has not seen (the `timer_create` system call), and
//! deletes the timers of threads that are gone. When a writer starts, these timers are
//! deleted and its poll arms the threads as it arms any ([`release`]).
//!
//! One handler at a time runs this: the caller holds the threadless file (`OWNER`).

use super::thread_timers::{jittered_first, thread_cpu_clock};
use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// How often the handler checks the thread count, at most.
const LOOK_INTERVAL_NS: u64 = 10_000_000;
/// Threads armed here at most; more wait for the writer.
const SLOTS: usize = 128;

struct Watch {
    dir: AtomicI32,
    signal: AtomicI32,
    period_ns: AtomicU64,
    /// The thread count last seen, and when it was last looked at (CLOCK_MONOTONIC ns).
    count: AtomicU64,
    looked: AtomicU64,
    /// Threads known: the one profiling started with (armed by the registry, slot 0) and those
    /// armed here, with their kernel timer ids.
    tids: [AtomicI32; SLOTS],
    timers: [AtomicI32; SLOTS],
    dirents: UnsafeCell<[u8; 4096]>,
}

// SAFETY: `dirents` is used only by the holder of the threadless file (see the module's doc).
unsafe impl Sync for Watch {}

static WATCH: Watch = Watch {
    dir: AtomicI32::new(-1),
    signal: AtomicI32::new(0),
    period_ns: AtomicU64::new(0),
    count: AtomicU64::new(1),
    looked: AtomicU64::new(0),
    tids: [const { AtomicI32::new(0) }; SLOTS],
    timers: [const { AtomicI32::new(-1) }; SLOTS],
    dirents: UnsafeCell::new([0; 4096]),
};

/// Starts watching for unannounced threads of a single-threaded process whose one thread,
/// `known`, the registry armed, with `signal` every `period_ns` of their CPU time. Not for
/// signal context.
pub fn watch(signal: c_int, period_ns: u64, known: libc::pid_t) {
    release();
    // SAFETY: opens a directory of our own, moved to a high number below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    // SAFETY: F_DUPFD_CLOEXEC of our own descriptor; the original is closed.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, crate::in_program::fd::high_floor()) };
    let fd = if high >= 0 {
        // SAFETY: ours, replaced by `high`.
        unsafe { libc::close(fd) };
        high
    } else {
        fd
    };
    WATCH.signal.store(signal, Ordering::SeqCst);
    WATCH.period_ns.store(period_ns, Ordering::SeqCst);
    WATCH.count.store(1, Ordering::SeqCst);
    WATCH.tids[0].store(known, Ordering::SeqCst);
    WATCH.dir.store(fd, Ordering::SeqCst);
}

/// Deletes the timers armed here and stops watching (a writer starts, whose poll takes over).
/// Not for signal context.
pub fn release() {
    let fd = WATCH.dir.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: our own directory descriptor.
        unsafe { libc::close(fd) };
    }
    for (tid, timer) in WATCH.tids.iter().zip(&WATCH.timers).skip(1) {
        let id = timer.swap(-1, Ordering::SeqCst);
        if id >= 0 {
            // SAFETY: a kernel timer id created here.
            unsafe { libc::syscall(libc::SYS_timer_delete, id as libc::c_long) };
        }
        tid.store(0, Ordering::SeqCst);
    }
}

/// In a forked child: timers are not inherited, and the directory is the parent's.
pub fn forget_in_child() {
    WATCH.dir.store(-1, Ordering::SeqCst);
    for (tid, timer) in WATCH.tids.iter().zip(&WATCH.timers) {
        tid.store(0, Ordering::SeqCst);
        timer.store(-1, Ordering::SeqCst);
    }
}

/// Arms the threads that appeared since the last look and deletes the timers of those gone,
/// if the thread count moved. Async-signal-safe; one caller at a time.
pub fn poll() {
    let fd = WATCH.dir.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let now = monotonic_coarse_ns();
    if now.saturating_sub(WATCH.looked.load(Ordering::Relaxed)) < LOOK_INTERVAL_NS {
        return;
    }
    WATCH.looked.store(now, Ordering::Relaxed);
    // SAFETY: fstat fills a local struct from our own descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return;
    }
    let count = (st.st_nlink as u64).saturating_sub(2);
    if count == WATCH.count.swap(count, Ordering::Relaxed) {
        return;
    }
    forget_gone();
    arm_new(fd);
}

/// Deletes the timers of threads that no longer exist.
fn forget_gone() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for (tid, timer) in WATCH.tids.iter().zip(&WATCH.timers).skip(1) {
        let t = tid.load(Ordering::Relaxed);
        // SAFETY: signal 0 only checks that the thread exists.
        if t > 0 && unsafe { libc::syscall(libc::SYS_tgkill, pid, t, 0) } != 0 {
            let id = timer.swap(-1, Ordering::Relaxed);
            if id >= 0 {
                // SAFETY: a kernel timer id created here.
                unsafe { libc::syscall(libc::SYS_timer_delete, id as libc::c_long) };
            }
            tid.store(0, Ordering::Relaxed);
        }
    }
}

/// Lists `/proc/self/task` and arms each thread not known yet.
fn arm_new(fd: c_int) {
    // SAFETY: the caller is the only user of the buffer (see the module's doc).
    let buffer = unsafe { &mut *WATCH.dirents.get() };
    // SAFETY: rewinds our own directory descriptor.
    unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
    loop {
        // SAFETY: getdents64 into our own buffer.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buffer.as_mut_ptr(), buffer.len()) };
        if n <= 0 {
            return;
        }
        let mut at = 0usize;
        while at + 19 < n as usize {
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
            let reclen = u16::from_ne_bytes([buffer[at + 16], buffer[at + 17]]) as usize;
            if reclen == 0 {
                return;
            }
            let name = &buffer[at + 19..(at + reclen).min(n as usize)];
            if let Some(tid) = parse_tid(name) {
                arm_if_new(tid);
            }
            at += reclen;
        }
    }
}

fn parse_tid(name: &[u8]) -> Option<libc::pid_t> {
    let mut tid: libc::pid_t = 0;
    let mut digits = 0;
    for &b in name.iter().take_while(|&&b| b != 0) {
        if !b.is_ascii_digit() {
            return None;
        }
        tid = tid.checked_mul(10)?.checked_add(libc::pid_t::from(b - b'0'))?;
        digits += 1;
    }
    (digits > 0).then_some(tid)
}

fn arm_if_new(tid: libc::pid_t) {
    if WATCH.tids.iter().any(|t| t.load(Ordering::Relaxed) == tid) {
        return;
    }
    // cpuprof's own threads block every signal: a timer would only keep a signal pending.
    // (None exists in a process without a writer, but for an HTTP or toggle thread.)
    let Some(slot) = WATCH.tids.iter().skip(1).position(|t| t.load(Ordering::Relaxed) == 0) else {
        return;
    };
    let slot = slot + 1;
    let signal = WATCH.signal.load(Ordering::Relaxed);
    let period_ns = WATCH.period_ns.load(Ordering::Relaxed);
    // SAFETY: timer_create and timer_settime system calls with initialised local structures.
    unsafe {
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = signal;
        event.sigev_notify_thread_id = tid;
        let mut id: c_int = -1;
        if libc::syscall(
            libc::SYS_timer_create,
            thread_cpu_clock(tid),
            &mut event as *mut libc::sigevent,
            &mut id as *mut c_int,
        ) != 0
        {
            return;
        }
        let spec = libc::itimerspec {
            it_interval: timespec(period_ns),
            it_value: timespec(jittered_first(period_ns)),
        };
        if libc::syscall(
            libc::SYS_timer_settime,
            id as libc::c_long,
            0,
            &spec as *const libc::itimerspec,
            std::ptr::null_mut::<libc::itimerspec>(),
        ) != 0
        {
            libc::syscall(libc::SYS_timer_delete, id as libc::c_long);
            return;
        }
        WATCH.timers[slot].store(id, Ordering::Relaxed);
    }
    WATCH.tids[slot].store(tid, Ordering::Relaxed);
}

fn timespec(ns: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime (vDSO) into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_directory_names_are_parsed() {
        assert_eq!(parse_tid(b"1234\0\0"), Some(1234));
        assert_eq!(parse_tid(b".\0"), None);
        assert_eq!(parse_tid(b"..\0"), None);
        assert_eq!(parse_tid(b"\0"), None);
        assert_eq!(parse_tid(b"99999999999\0"), None);
    }
}
