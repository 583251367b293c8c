//! Descriptors cpuprof keeps open inside the program: kept at high numbers, and never used or
//! closed once the program has taken the number over.
//!
//! Programs recycle descriptors behind a library's back: a daemon calls
//! `close_range(3, ~0U, 0)` and reopens its files, which land on the old numbers; a shell's
//! `exec 3>log` `dup2`s over fd 3. A library that still trusts the number then writes into
//! the program's file, or closes it. So a [`GuardedFd`]
//! * lives at a high number, out of the way of the program's lowest-free-number allocation
//!   (see [`high_floor`] for how the number is chosen);
//! * remembers the `st_dev`/`st_ino` of what it opened and compares them with `fstat` before
//!   every read, write or close ([`GuardedFd::is_still_ours`]). A descriptor that fails the
//!   check is abandoned: never used again, never closed (the number is the program's now).
//!
//! The check is a `fstat` and the use a separate call, so a program that swaps the number in
//! between those two calls still wins; it narrows the window from "the rest of the run" to a
//! few hundred nanoseconds.
//!
//! For other descriptors (perf events, the HTTP listener): [`GuardedFd::adopt`] right after
//! creating one. All perf event descriptors share one anonymous inode, so the check tells a
//! perf event from the program's file but not one event from another. Code in signal context
//! cannot lock or format: it can keep the number and [`GuardedFd::recorded_identity`] in
//! atomics and compare them with [`identity`], which only calls `fstat` (as the
//! CPUPROFILESIGNAL handler does). If nothing is free between the floor and the limit (one
//! perf event per thread in a process with thousands of threads), `adopt` keeps the original
//! number, still guarded.

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};

/// Highest number cpuprof asks for, whatever the limit. `F_DUPFD` makes the kernel grow the
/// process's descriptor table to cover the number, and `fork` copies that table: near the top
/// of a 1,048,576 soft limit that is 8 MiB per process and per fork. 8192 costs 64 KiB and is
/// far above what all but the busiest servers hold open.
const HIGHEST: u64 = 8192;
/// Room below the limit for cpuprof's own few descriptors (profile, /proc files, toggle pipe,
/// the HTTP listener), so they stay together and never push the program against its limit
/// before it would have hit it anyway.
const RESERVED: u64 = 64;

/// The number from which cpuprof's descriptors are allocated: `RESERVED` below the soft
/// `RLIMIT_NOFILE` (never past it), at most `HIGHEST`. That is above `FD_SETSIZE` (1024,
/// the `select` limit) whenever the soft limit is above 1088; with the common default of
/// 1024 it is 960, below which a program hits only when it holds ~960 descriptors itself.
pub fn high_floor() -> RawFd {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a local struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    };
    let floor = soft.min(HIGHEST).saturating_sub(RESERVED).max(3);
    floor as RawFd
}

/// How long cpuprof waits, after finding that the program took one of its descriptors over,
/// before it opens a replacement. A program that ran `close_range` or `dup2` is reopening its
/// own files at that moment, and every `open` (or `perf_event_open`) takes the lowest free
/// number for an instant before [`GuardedFd::adopt`] moves it high: opened in the same
/// microseconds, cpuprof's would take the number the program's next `open` is owed.
const AFTER_TAKEOVER: std::time::Duration = std::time::Duration::from_millis(5);

/// Waits `AFTER_TAKEOVER` (on cpuprof's writer thread; at worst once per takeover on a
/// thread's start) so that the program's reopening is over before cpuprof opens anything.
pub fn let_the_program_reopen_first() {
    std::thread::sleep(AFTER_TAKEOVER);
}

/// `(st_dev, st_ino)` of what `fd` refers to, if it is open.
pub fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat fills a local struct; it is async-signal-safe, so this may run in a
    // signal handler.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// A descriptor of cpuprof's own, at a high number, checked before each use.
#[derive(Debug)]
pub struct GuardedFd {
    fd: RawFd,
    dev: u64,
    ino: u64,
    /// What it is, for messages ("the profile 'x.prof'", "/proc/self/maps").
    what: String,
}

impl GuardedFd {
    /// Takes a descriptor just opened: moves it to a high number (closing the original, which
    /// is ours: nothing else has seen it yet) and records its identity. If no high number is
    /// free it stays where it is, still guarded.
    pub fn adopt(fd: OwnedFd, what: impl Into<String>) -> io::Result<GuardedFd> {
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own.
        let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, high_floor()) };
        let fd = if high >= 0 {
            drop(fd);
            high
        } else {
            fd.into_raw_fd()
        };
        match identity(fd) {
            Some((dev, ino)) => Ok(GuardedFd {
                fd,
                dev,
                ino,
                what: what.into(),
            }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: our own descriptor, which fstat could not even inspect.
                unsafe { libc::close(fd) };
                Err(e)
            }
        }
    }

    /// The number, to pass to one system call right after [`is_still_ours`](Self::is_still_ours).
    pub fn raw(&self) -> RawFd {
        self.fd
    }

    /// `(st_dev, st_ino)` recorded at open.
    pub fn recorded_identity(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Whether the number still refers to the file cpuprof opened.
    pub fn is_still_ours(&self) -> bool {
        identity(self.fd) == Some((self.dev, self.ino))
    }

    /// The error to report for a descriptor the program took over.
    pub fn taken_error(&self) -> io::Error {
        io::Error::other(format!(
            "descriptor {} ({}) was closed or replaced by the program; cpuprof abandoned it without using or closing it",
            self.fd, self.what
        ))
    }

    /// Closes the descriptor if it is still ours; returns whether it was.
    pub fn close_if_ours(self) -> bool {
        let ours = self.is_still_ours();
        if ours {
            // SAFETY: verified just above to be the descriptor we opened.
            unsafe { libc::close(self.fd) };
        }
        std::mem::forget(self);
        ours
    }

    /// Gives the number up without closing it (it belongs to the program now).
    pub fn abandon(self) {
        std::mem::forget(self);
    }
}

impl Drop for GuardedFd {
    fn drop(&mut self) {
        if self.is_still_ours() {
            // SAFETY: verified just above to be the descriptor we opened.
            unsafe { libc::close(self.fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn open(path: &str) -> OwnedFd {
        File::open(path).unwrap().into()
    }

    #[test]
    fn adopted_descriptors_sit_high_and_close_only_while_ours() {
        let guarded = GuardedFd::adopt(open("/proc/self/stat"), "test").unwrap();
        let floor = high_floor();
        assert!(guarded.raw() >= floor, "fd {} below {floor}", guarded.raw());
        assert!(guarded.is_still_ours());
        let fd = guarded.raw();
        assert!(guarded.close_if_ours());
        assert!(identity(fd).is_none(), "closed");
    }

    #[test]
    fn a_number_the_program_took_over_is_neither_used_nor_closed() {
        let guarded = GuardedFd::adopt(open("/proc/self/stat"), "test").unwrap();
        let fd = guarded.raw();
        // The program closes the number and puts a file of its own there.
        let theirs = File::open("/proc/self/cmdline").unwrap();
        // SAFETY: dup2 over the test's own descriptor number.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd) }, fd);
        assert!(!guarded.is_still_ours());
        assert!(guarded.taken_error().to_string().contains(&format!("descriptor {fd}")));
        assert!(!guarded.close_if_ours());
        assert_eq!(
            identity(fd),
            identity(theirs.as_raw_fd()),
            "the program's file is still open there"
        );
        // SAFETY: the test's own duplicate.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn the_floor_respects_the_soft_limit() {
        let floor = high_floor() as u64;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills a local struct.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        assert!(floor < limit.rlim_cur && floor <= HIGHEST - RESERVED);
    }
}
