//! Reading memory nothing vouches for, without ever faulting: the kernel copies the words or
//! fails, atomically, so a page unmapped by another thread at any moment cannot hurt us.
//!
//! Stack words inside the range the thread registry vouches for are plain loads (no system
//! call). Everything else — sigaltstacks, coroutine stacks, threads not yet registered,
//! frame-pointer registers holding heap pointers — is copied with `pread` from
//! `/proc/self/mem`. A readability probe followed by a plain load is not enough: another
//! thread can unmap the page between the two (the walker crashed 6 runs of 6 that way at
//! 4 kHz). Candidates, per 8-byte read on this machine (2 vCPU VM, kernel 6.18):
//!
//! | primitive | cost | why not / why |
//! |---|---|---|
//! | `rt_sigprocmask` probe + load | 0.16 µs | not atomic: the race above |
//! | write+read through a pipe | 0.81 µs | one pipe per concurrent handler (up to 128 fds), stale bytes if a read fails |
//! | `process_vm_readv` on our own pid | 1.2 µs | in seccomp's `@debug` set, which systemd's `@system-service` lacks: the process would be killed |
//! | `pread` of `/proc/self/mem` | 1.3 µs | read-class calls only; the descriptor is opened once per session |
//!
//! `pread` it is, made with a raw system call: glibc's wrapper is a cancellation point and
//! could act on a pending `pthread_cancel` inside our handler. A copy costs the same for 8
//! bytes or a page, so the handler copies up to a page at a time into its workspace
//! (`StackReader`): a walk 50 frames deep on a coroutine stack costs 4.4 µs per sample above
//! an empty handler with frame pointers, 6.6-7.7 µs with DWARF (probe-then-load: 0.9 and
//! 2.0 µs); walks inside vouched thread stacks make no system call and cost what they did. `/proc/self/mem` reads with `FOLL_FORCE`, which would copy
//! `PROT_NONE` pages (and populate untouched ones): each page is first probed with
//! `rt_sigprocmask` (an invalid `how` makes the kernel copy the set in and fail with `EFAULT`
//! on unreadable memory, `EINVAL` otherwise), once per page per walk. A page made `PROT_NONE`
//! between probe and copy is still copied, harmlessly.
//!
//! The descriptor is opened at a high number (programs expect the low ones) by each session
//! (`acquire`), and for the life of the process by libcpuprof.so at load (`keep_open`, so that
//! `ProfilerGetStackTrace` works without a session), and remembered with its device and
//! inode: the writer thread checks that the number still names it (`check`) and opens a new
//! one if the program closed or replaced it. It is bound to the address space it was opened
//! in: a forked child opens its own (`reopen_in_child`, from a `pthread_atfork` handler, or
//! at its first `acquire`); until then it would read its parent's memory, not its own. If the number was taken by another file meanwhile, handlers read that file at stack
//! addresses for at most one tick: garbage frames, never a fault, and the program's file
//! position is untouched (`pread`). Without the descriptor (no `/proc`, or a security module
//! refusing it) unvouched memory is not read: walks stop there, and `acquire` says why.

use crate::in_program::fd::{high_floor, identity};
use crate::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

const PAGE: u64 = 4096;

/// The `/proc/self/mem` descriptor handlers read through; -1 when there is none.
static MEM_FD: AtomicI32 = AtomicI32::new(-1);

struct Opened {
    fd: i32,
    pid: u32,
    dev: u64,
    ino: u64,
    users: usize,
}

static OPENED: Mutex<Option<Opened>> = Mutex::new(None);

/// Whether the descriptor stays open with no session using it (`keep_open`).
static KEEP_OPEN: AtomicBool = AtomicBool::new(false);

impl Opened {
    /// Whether `fd` is still the descriptor this process opened.
    fn is_intact(&self) -> bool {
        self.pid == std::process::id() && identity(self.fd) == Some((self.dev, self.ino))
    }
}

fn open_mem() -> std::io::Result<(i32, u64, u64)> {
    // SAFETY: plain open/fcntl/close of descriptors we own.
    unsafe {
        let fd = libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, high_floor());
        let fd = if high >= 0 {
            libc::close(fd);
            high
        } else {
            fd
        };
        let (dev, ino) = identity(fd).ok_or_else(std::io::Error::last_os_error)?;
        Ok((fd, dev, ino))
    }
}

/// Opens the descriptor (or counts one more user of it). Not for signal context.
/// On failure, unvouched memory is not read until a later `acquire` or `check` succeeds.
pub fn acquire() -> std::io::Result<()> {
    let mut opened = OPENED.lock();
    if let Some(o) = opened.as_mut().filter(|o| o.is_intact()) {
        o.users += 1;
        return Ok(());
    }
    let users = reopen(&mut opened)?;
    if let Some(o) = opened.as_mut() {
        o.users = users + 1;
    }
    Ok(())
}

/// Opens the descriptor for good: it stays open when no session uses it. Not for signal
/// context.
pub fn keep_open() -> std::io::Result<()> {
    KEEP_OPEN.store(true, Ordering::SeqCst);
    let mut opened = OPENED.lock();
    if opened.as_ref().is_some_and(Opened::is_intact) {
        return Ok(());
    }
    reopen(&mut opened).map(drop)
}

/// The descriptor's lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &OPENED
}

/// In a forked child (a `pthread_atfork` child handler): replaces the inherited descriptor,
/// which reads the parent's memory, with one of the child's own. Without the lock (a parent
/// thread held it at the fork) unvouched memory is not read until the child's next `acquire`.
pub fn reopen_in_child() {
    MEM_FD.store(-1, Ordering::SeqCst);
    if let Some(mut opened) = OPENED.try_lock() {
        if opened.is_some() {
            let _ = reopen(&mut opened);
        }
    }
}

/// Replaces a descriptor that is no longer ours (closed or replaced by the program, or
/// inherited across fork and so bound to the parent's memory). Returns its user count,
/// which a child does not inherit (its copies of the parent's sessions never release).
fn reopen(opened: &mut Option<Opened>) -> std::io::Result<usize> {
    let users = opened
        .as_ref()
        .filter(|o| o.pid == std::process::id())
        .map_or(0, |o| o.users);
    if let Some(old) = opened.take() {
        MEM_FD.store(-1, Ordering::SeqCst);
        // A descriptor inherited across fork is still ours to close; a number the program
        // reused is not.
        if identity(old.fd) == Some((old.dev, old.ino)) {
            // SAFETY: the number still names the file we opened.
            unsafe { libc::close(old.fd) };
        }
    }
    let (fd, dev, ino) = open_mem()?;
    *opened = Some(Opened {
        fd,
        pid: std::process::id(),
        dev,
        ino,
        users,
    });
    MEM_FD.store(fd, Ordering::SeqCst);
    Ok(users)
}

/// Drops one user; the last one closes the descriptor. Call only once no handler can be
/// reading through it (after `sampler::unpublish` succeeded). Not for signal context.
pub fn release() {
    let mut opened = OPENED.lock();
    let Some(o) = opened.as_mut() else { return };
    o.users = o.users.saturating_sub(1);
    if o.users == 0 && !KEEP_OPEN.load(Ordering::SeqCst) {
        MEM_FD.store(-1, Ordering::SeqCst);
        if o.is_intact() {
            // SAFETY: the number still names the file this process opened.
            unsafe { libc::close(o.fd) };
        }
        *opened = None;
    }
}

/// Reopens the descriptor if the program closed or replaced it (`Ok(true)`); `Err` if it
/// did and no new one could be opened. For the writer thread's tick.
pub fn check() -> std::io::Result<bool> {
    let mut opened = OPENED.lock();
    match opened.as_ref() {
        Some(o) if !o.is_intact() => {
            crate::in_program::fd::let_the_program_reopen_first();
            reopen(&mut opened).map(|_| true)
        }
        _ => Ok(false),
    }
}

/// Copies the words at `addr..` into `buf` through the kernel; returns how many were
/// copied (0 if `addr` is unmapped or there is no descriptor). Never faults, whatever
/// happens to the memory meanwhile. Async-signal-safe; `errno` is left as it was.
pub fn copy_words(addr: u64, buf: &mut [u64]) -> usize {
    // SAFETY: `buf` is valid for `buf.len() * 8` bytes.
    unsafe { pread_mem(addr, buf.as_mut_ptr().cast(), buf.len() * 8) / 8 }
}

/// [`copy_words`] for bytes: how many of `buf`'s bytes were copied from `addr..`.
/// Async-signal-safe; `errno` is left as it was.
pub fn copy_bytes_in_handler(addr: u64, buf: &mut [u8]) -> usize {
    // SAFETY: `buf` is valid for `buf.len()` bytes.
    unsafe { pread_mem(addr, buf.as_mut_ptr(), buf.len()) }
}

/// Copies `len` bytes at `addr` into `to` with a raw `pread` of the descriptor (not glibc's,
/// a cancellation point); returns how many were copied.
///
/// # Safety
/// `to` must be valid for writes of `len` bytes.
unsafe fn pread_mem(addr: u64, to: *mut u8, len: usize) -> usize {
    let fd = MEM_FD.load(Ordering::Acquire);
    if fd < 0 || addr > i64::MAX as u64 {
        return 0;
    }
    // SAFETY: the kernel writes at most `len` bytes at `to`; errno is restored for the
    // interrupted code.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let r = libc::syscall(libc::SYS_pread64, fd, to, len, addr as i64);
        *errno = saved;
        usize::try_from(r).unwrap_or(0)
    }
}

/// Copies the bytes at `addr..` into `buf` through the kernel; returns how many were copied
/// (0 without the descriptor). For the writer thread, which reads ELF headers of mapped
/// objects that another thread may unmap at any moment. Not for signal context.
pub fn copy_bytes(addr: u64, buf: &mut [u8]) -> usize {
    let fd = MEM_FD.load(Ordering::Acquire);
    if fd < 0 || addr > i64::MAX as u64 {
        return 0;
    }
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let r = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), addr as i64) };
    usize::try_from(r).unwrap_or(0)
}

/// Whether the 8 bytes at `addr` were readable when asked (no `PROT_NONE`, mapped).
/// Async-signal-safe; `errno` is left as it was.
pub fn readable(addr: u64) -> bool {
    // A NULL set means "no new set" to the kernel and would succeed; page 0 is never mapped.
    if addr < PAGE {
        return false;
    }
    // SAFETY: the kernel only reads `addr`; a bad address yields EFAULT, never a fault here.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let r = libc::syscall(libc::SYS_rt_sigprocmask, !0i64, addr as usize, 0usize, 8usize);
        let ok = !(r == -1 && *errno == libc::EFAULT);
        *errno = saved;
        ok
    }
}

/// Pages found readable during one stack walk, so each page is probed at most once.
/// Frames move monotonically up the stack, so one contiguous run of pages suffices.
#[derive(Default)]
pub struct ProbedPages {
    first: u64,
    /// One past the last verified page number; `first == end` means none.
    end: u64,
}

impl ProbedPages {
    /// Whether the page holding `addr` is readable, probing it if not yet verified.
    pub fn check(&mut self, addr: u64) -> bool {
        let page = addr / PAGE;
        if page >= self.first && page < self.end {
            return true;
        }
        if !readable(page * PAGE) {
            return false;
        }
        if page == self.end {
            self.end += 1;
        } else {
            self.first = page;
            self.end = page + 1;
        }
        true
    }
}

/// Serialises lib tests that read through the descriptor with the one that replaces it.
#[cfg(test)]
static TEST_DESCRIPTOR: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// For lib tests that walk unvouched memory: opens the descriptor and keeps it in place.
#[cfg(test)]
pub fn for_tests() -> std::sync::RwLockReadGuard<'static, ()> {
    acquire().unwrap();
    TEST_DESCRIPTOR.read().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One word through the probe and the kernel copy, as `StackReader` reads it.
    fn read(addr: u64) -> Option<u64> {
        let mut word = [0u64];
        (ProbedPages::default().check(addr) && copy_words(addr, &mut word) == 1).then_some(word[0])
    }

    #[test]
    fn reads_mapped_words_and_refuses_unmapped_and_guard_pages() {
        let _fd = for_tests();
        let local = 0x5eed_u64;
        assert_eq!(read(&local as *const u64 as u64), Some(0x5eed));
        assert_eq!(read(0), None);
        assert_eq!(read(8), None);
        assert_eq!(read(0xffff_8000_0000_0000), None, "kernel addresses");
        // SAFETY: plain anonymous mappings owned by this test.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let base = p as u64;
            *((base + 16) as *mut u64) = 0x1234_5678_9abc_def0;
            *((base + PAGE) as *mut u64) = 7;
            libc::mprotect((base + PAGE) as *mut _, PAGE as usize, libc::PROT_NONE);
            assert_eq!(read(base + 16), Some(0x1234_5678_9abc_def0));
            assert_eq!(read(base + PAGE), None, "PROT_NONE guard page");
            let mut two = [0u64; 2];
            assert_eq!(copy_words(base + 8, &mut two), 2);
            assert_eq!(two, [0, 0x1234_5678_9abc_def0]);
            libc::munmap(p, 2 * PAGE as usize);
            assert_eq!(read(base + 16), None, "unmapped page");
            assert_eq!(copy_words(base + 16, &mut two), 0, "unmapped page, even unprobed");
        }
    }

    #[test]
    fn a_replaced_descriptor_is_noticed_and_reopened() {
        acquire().unwrap();
        let _exclusive = TEST_DESCRIPTOR.write().unwrap_or_else(|e| e.into_inner());
        let fd = MEM_FD.load(Ordering::SeqCst);
        assert!(fd >= 3);
        // The program closes our number and something else takes it: a pipe (pread on it
        // fails with ESPIPE and consumes nothing).
        // SAFETY: descriptors of this test; `fd` is ours, replaced on purpose.
        unsafe {
            let mut pipe = [0; 2];
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
            assert_eq!(libc::dup2(pipe[0], fd), fd);
            let local = 1u64;
            let mut word = [0u64];
            assert_eq!(copy_words(&local as *const u64 as u64, &mut word), 0);
            assert!(check().unwrap());
            let new = MEM_FD.load(Ordering::SeqCst);
            assert!(new >= 0 && new != fd, "reopened at {new}");
            assert_eq!(copy_words(&local as *const u64 as u64, &mut word), 1);
            assert_eq!(
                identity(fd),
                identity(pipe[0]),
                "the program's descriptor was left alone"
            );
            libc::close(fd);
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
    }
}
