//! `/proc/self/maps`, `/proc/self/task` and `/proc/self/cmdline`, read through descriptors
//! opened once.
//!
//! The writer thread reads `/proc/self/task` every tick and `/proc/self/maps` whenever code is
//! loaded or a new thread's stack must be found. Opening them each time made a transient
//! descriptor at the lowest free number, so an `open` in the program running at that moment
//! got a higher number than POSIX promises (500 of 1.55 M in one server). Each file is opened
//! once per session (closed at stop by [`close`], so a program that profiled once does not keep
//! them), moved to a high number ([`GuardedFd`]), and re-read from offset 0:
//! `pread` for the maps (seq_file restarts the listing at offset 0), `lseek` + `getdents64`
//! for the task directory. A descriptor the program took over is abandoned with a message and
//! the file reopened (one transient descriptor, once).

use super::fd::GuardedFd;
use crate::sync::Mutex;
use std::os::fd::{OwnedFd, RawFd};

/// A cached descriptor and the process that opened it: after `fork` the child's copy still
/// names the parent's `/proc/<pid>` files.
struct Cached {
    fd: GuardedFd,
    pid: u32,
}

static MAPS: Mutex<Option<Cached>> = Mutex::new(None);
static TASK: Mutex<Option<Cached>> = Mutex::new(None);
static CMDLINE: Mutex<Option<Cached>> = Mutex::new(None);

/// Runs `read` on the cached descriptor of `path`, opening it first if needed.
fn with_cached<R>(slot: &Mutex<Option<Cached>>, path: &str, read: impl FnOnce(RawFd) -> R) -> Option<R> {
    let mut slot = slot.lock();
    let pid = std::process::id();
    if let Some(cached) = slot.take() {
        if cached.pid != pid {
            // Inherited across fork: the child's copy of the parent's file. Closing the copy
            // (if still ours) does not affect the parent.
            drop(cached.fd);
        } else if !cached.fd.is_still_ours() {
            crate::say!("cpuprof: {}; reopening {path}", cached.fd.taken_error());
            cached.fd.abandon();
            super::fd::let_the_program_reopen_first();
        } else {
            *slot = Some(cached);
        }
    }
    if slot.is_none() {
        let file = std::fs::File::open(path).ok()?;
        let fd = GuardedFd::adopt(OwnedFd::from(file), path).ok()?;
        *slot = Some(Cached { fd, pid });
    }
    slot.as_ref().map(|c| read(c.fd.raw()))
}

/// The cached descriptors' locks, held across `fork` (`session::children`).
pub(crate) fn fork_locks() -> [&'static dyn crate::sync::ForkLock; 3] {
    [&MAPS, &TASK, &CMDLINE]
}

/// Closes the descriptors (those still ours); the next read opens them again.
pub fn close() {
    drop(MAPS.lock().take());
    drop(TASK.lock().take());
    drop(CMDLINE.lock().take());
}

/// The text of `/proc/self/maps` (empty if it cannot be read).
pub fn read_self_maps() -> Vec<u8> {
    with_cached(&MAPS, "/proc/self/maps", |fd| read_from_start(fd, usize::MAX)).unwrap_or_default()
}

/// The first `limit` bytes of `/proc/self/cmdline` (the arguments, each followed by a NUL, or
/// the title the program wrote over them); `None` if it cannot be read (out of descriptors).
/// Read when a profile is completed: the descriptor is kept, so that an epoch's end or a
/// snapshot does not open a file while the program runs.
pub fn read_self_cmdline(limit: usize) -> Option<Vec<u8>> {
    with_cached(&CMDLINE, "/proc/self/cmdline", |fd| read_from_start(fd, limit))
}

/// The file of `fd` from offset 0, up to `limit` bytes (those read before an error).
fn read_from_start(fd: RawFd, limit: usize) -> Vec<u8> {
    let mut text: Vec<u8> = Vec::with_capacity(limit.min(1 << 16));
    while text.len() < limit {
        text.reserve((limit - text.len()).min(1 << 16));
        let spare = (text.capacity() - text.len()).min(limit - text.len());
        // SAFETY: reads into the vector's spare capacity, then extends its length by what
        // was read.
        let n = unsafe {
            libc::pread(
                fd,
                text.as_mut_ptr().add(text.len()) as *mut libc::c_void,
                spare,
                text.len() as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => unsafe { text.set_len(text.len() + n as usize) },
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            _ => break,
        }
    }
    text
}

/// How many threads the process has, from one `fstat` of the kept `/proc/self/task`
/// descriptor: the kernel gives that directory a link count of 2 plus the thread count
/// (`proc_task_getattr`), read in constant time. Listing the directory instead costs ~0.95 ms
/// with 1,000 threads (the kernel looks up a dentry per thread) and `/proc/self/stat`'s
/// `num_threads` ~100 us (it sums every thread's times); this costs ~0.7 us at any count
/// (measured here). `None` if the directory cannot be opened (out of descriptors, say). A
/// procfs that kept the link count fixed would give a wrong number: callers must only use it
/// to decide when to list, and list at a bounded interval whatever it says.
pub fn self_thread_count() -> Option<usize> {
    with_cached(&TASK, "/proc/self/task", |fd| {
        // SAFETY: fstat fills a local struct from our own descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) } == 0).then(|| (st.st_nlink as usize).saturating_sub(2))
    })
    .flatten()
}

/// [`self_thread_count`] for a one-off question outside a profile (a heap profile starting
/// at load): one `stat`, no descriptor kept in the program.
pub fn self_thread_count_once() -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    let task = std::fs::metadata("/proc/self/task").ok()?;
    Some((task.nlink() as usize).saturating_sub(2))
}

/// The ids of the process's threads, or `None` if `/proc/self/task` cannot be read (out of
/// descriptors, say), which is not the same as no threads.
pub fn self_tids() -> Option<Vec<libc::pid_t>> {
    with_cached(&TASK, "/proc/self/task", |fd| {
        let mut tids = Vec::new();
        // SAFETY: rewinds our own directory descriptor.
        if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } != 0 {
            return None;
        }
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: getdents64 fills the local buffer with at most its length.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if n < 0 {
                return None;
            }
            if n == 0 {
                break;
            }
            let mut at = 0;
            // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, NUL-terminated name.
            while at + 19 < n as usize {
                let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                let name = &buf[at + 19..at + reclen];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if let Some(tid) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
                    tids.push(tid);
                }
                at += reclen.max(1);
            }
        }
        Some(tids)
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_reread_through_one_descriptor_and_bounded() {
        let whole = std::fs::read("/proc/self/cmdline").unwrap();
        assert_eq!(read_self_cmdline(usize::MAX).as_deref(), Some(&whole[..]));
        let fd = CMDLINE.lock().as_ref().unwrap().fd.raw();
        assert_eq!(read_self_cmdline(3).as_deref(), Some(&whole[..3.min(whole.len())]));
        assert_eq!(CMDLINE.lock().as_ref().unwrap().fd.raw(), fd, "the same descriptor");
    }

    #[test]
    fn maps_and_tasks_are_reread_through_one_descriptor() {
        let first = read_self_maps();
        let fd = MAPS.lock().as_ref().unwrap().fd.raw();
        let again = read_self_maps();
        assert_eq!(MAPS.lock().as_ref().unwrap().fd.raw(), fd, "the same descriptor");
        assert!(first.len() > 100 && again.len() > 100);
        assert_eq!(first.split(|&b| b == b'\n').next(), again.split(|&b| b == b'\n').next());

        let tids = self_tids().unwrap();
        assert!(tids.contains(&unsafe { libc::gettid() }), "{tids:?}");
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = done_rx.recv();
        });
        let new = rx.recv().unwrap();
        assert!(
            self_tids().unwrap().contains(&new),
            "a new thread is listed after a rewind"
        );
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }

    /// The count follows threads as they come and go. Other tests of this binary run threads
    /// too, so it is compared with listings taken around it, retried if a thread came or went
    /// in between.
    #[test]
    fn the_thread_count_is_the_listing_length() {
        let agrees = || {
            (0..100).any(|_| {
                let before = self_tids().unwrap().len();
                let count = self_thread_count().unwrap();
                count == before && self_tids().unwrap().len() == before
            })
        };
        assert!(agrees(), "before");
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let done_rx = std::sync::Arc::new(std::sync::Mutex::new(done_rx));
        let extra: Vec<_> = (0..5)
            .map(|_| {
                let (tx, done_rx) = (tx.clone(), done_rx.clone());
                std::thread::spawn(move || {
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    let _ = done_rx.lock().unwrap().recv();
                })
            })
            .collect();
        let new: Vec<libc::pid_t> = (0..5).map(|_| rx.recv().unwrap()).collect();
        let listed = self_tids().unwrap();
        assert!(new.iter().all(|tid| listed.contains(tid)), "{new:?} in {listed:?}");
        assert!(agrees(), "with 5 more threads");
        drop(done_tx);
        for t in extra {
            t.join().unwrap();
        }
        assert!(agrees(), "after threads came and went");
    }
}
