//! A profile taken in a process that has no thread of cpuprof's.
//!
//! Some programs must stay single-threaded for a while: Chromium's zygote checks that
//! `/proc/self/task` holds one thread before it engages its sandbox (and crashes itself if
//! not), `unshare(CLONE_NEWUSER)` refuses a multi-threaded caller (so `unshare -r`, bwrap and
//! container runtimes would fail), and a prefork server's workers are single-threaded event
//! loops. So libcpuprof.so adds no thread to a process that has one: a file profile started in
//! a single-threaded process (at load, in a forked child) keeps its writer thread waiting
//! until the program starts a thread of its own (the `pthread_create` interposer) or a
//! control-plane call needs it (stop, snapshot). Meanwhile the table works as always, and what
//! the writer would do is done here, with only async-signal-safe code and memory set aside at
//! start:
//! * the signal handler writes the evicted records to the file when the ring is half full, and
//!   harvests the table's counts into it after 1 s and then at doubling intervals up to 30 s
//!   ([`after_sample`]), as the writer does: a long single-threaded run loses nothing;
//! * with checkpoints (`CPUPROFILE_CHECKPOINT`, as the writer's), records are always followed
//!   by a tail that completes the profile: the table's counts not harvested yet (copied), the
//!   trailer, `/proc/self/maps` streamed, the signal-weights and process lines; the handler
//!   writes it again, over the last one, at each checkpoint (records go where the records end,
//!   with `pwrite`): a process killed by SIGKILL leaves a complete profile as of then;
//! * `ProfilerFlush` writes the records and the table's counts in place;
//! * `_exit` and `exec`, which may run in a signal handler, complete the file in place
//!   ([`complete`]): records, trailer, `/proc/self/maps` streamed, the signal-weights and
//!   process lines. Without build-id lines (reading them allocates): readers then check
//!   binaries by inode.
//!   `exit` and `ProfilerStop` start the writer, which completes the file as usual.
//!
//! Threads started by raw `clone` (which never pass the interposer) are armed by the handler
//! (`sampler::unannounced`); the program taking the profiling signal over through `sigaction`
//! starts the writer, which notices it; `dlclose` records what is unloaded. Not done until the
//! writer starts: refreshing the unwinder's snapshot after `dlopen` (code loaded meanwhile is
//! walked by frame pointers), harvests while no thread runs (a harvest rides on a sample).
//!
//! Exactly one party writes the file at a time: `OWNER` is taken with a CAS by a handler's
//! drain, an in-place completion or flush, or the hand-over to the writer thread; a handler
//! that finds it taken leaves the ring alone (the taker writes it).

use crate::format::process::{cmdline_args, write_line};
use crate::format::writer::{encode_record, record_size};
use crate::format::{SignalWeights, SlotFormat, TRAILER};
use crate::in_program::fd::identity;
use crate::sampler::SamplerState;
use std::cell::UnsafeCell;
use std::ffi::{c_int, CString};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Bytes of records gathered before one `write`.
const BUFFER: usize = 1 << 16;

/// Nobody writes the file.
const FREE: u32 = 0;
/// A handler, a flush or a completion is writing it.
const BUSY: u32 = 1;
/// The writer thread has it, or it was completed in place: nobody here writes it again.
const GONE: u32 = 2;

/// What the threadless path needs, set aside when the profile starts.
pub struct Threadless {
    pid: u32,
    fd: c_int,
    identity: (u64, u64),
    format: SlotFormat,
    /// The profile's path, to remove or rename it before an `exec` (forked children).
    path: CString,
    buffer: UnsafeCell<Box<[u8]>>,
    scratch: UnsafeCell<Box<[u64]>>,
    /// Bytes in the file, header included: whole records only.
    file_bytes: AtomicU64,
    /// Records and bytes written here.
    records: AtomicU64,
    bytes: AtomicU64,
    /// A write was refused (its samples are counted lost), and why: an errno, or
    /// [`DESCRIPTOR_TAKEN`].
    failed: AtomicBool,
    failure: std::sync::atomic::AtomicI32,
    /// Whether the file was completed here (trailer and maps written).
    completed: AtomicBool,
    /// Whether the `PROFILE:` line is printed when the file is completed here at `_exit`.
    summary: bool,
    /// Bytes after the records that complete the profile (a tail: see the module's comment),
    /// and the bytes in the file in all (the records, and a tail or what is left of one).
    tail_bytes: AtomicU64,
    file_end: AtomicU64,
    /// Nanoseconds between checkpoints (0: none; the tail written at start is then replaced by
    /// the first records), and when the next is due (CLOCK_MONOTONIC ns).
    checkpoint_ns: u64,
    next_checkpoint_ns: AtomicU64,
    /// Where the records ended when the file was completed for an exec ([`complete_for_exec`]),
    /// or 0.
    exec_trailer_at: AtomicU64,
    /// When the handler next harvests the table's counts into the file (CLOCK_MONOTONIC ns),
    /// and the interval after that: 1 s, doubling up to 30 s, as the writer does, so that a
    /// process killed without warning leaves recent samples.
    next_harvest_ns: AtomicU64,
    harvest_interval_ns: AtomicU64,
    /// An event profile's `# event` line (`format::event`), made beforehand; empty otherwise.
    event_line: Box<[u8]>,
}

/// The first harvest's delay, and the longest interval between harvests (as the writer's).
const FIRST_HARVEST_NS: u64 = 1_000_000_000;
const MAX_HARVEST_INTERVAL_NS: u64 = 30_000_000_000;

// SAFETY: the cells are used only by the holder of OWNER.
unsafe impl Sync for Threadless {}
unsafe impl Send for Threadless {}

static CURRENT: AtomicPtr<Threadless> = AtomicPtr::new(std::ptr::null_mut());
static OWNER: AtomicU32 = AtomicU32::new(GONE);
/// Whether the program's thread creation is seen (libcpuprof.so interposes `pthread_create`),
/// so a waiting writer is started with the program's first thread.
static DEFERRAL: AtomicBool = AtomicBool::new(false);

/// Called by libcpuprof.so, whose `pthread_create` starts a waiting writer
/// (`session::start_waiting_writer`): profiles may then start without a thread.
pub fn enable_deferral() {
    DEFERRAL.store(true, Ordering::SeqCst);
}

/// Whether profiles may start without a thread (see [`enable_deferral`]).
pub fn deferral_enabled() -> bool {
    DEFERRAL.load(Ordering::SeqCst)
}

/// The failure of a write refused because the profile's descriptor no longer held the file
/// (the program closed or replaced it).
pub const DESCRIPTOR_TAKEN: i32 = -1;

/// What the threadless path wrote before the writer thread took the file over.
#[derive(Clone, Copy, Debug, Default)]
pub struct HandedOver {
    pub records: u64,
    pub bytes: u64,
    /// A write failed: the file holds the records up to it, and nothing more may be written.
    pub failed: bool,
    /// Why: an errno, or [`DESCRIPTOR_TAKEN`].
    pub failure: i32,
    /// The file was completed in place: the writer has nothing to write.
    pub completed: bool,
    /// Bytes in the file, not counting `tail`.
    pub file_bytes: u64,
    /// Bytes after the records that complete the profile (the writer writes over them).
    pub tail: u64,
}

impl Threadless {
    /// For the profile at `path`, open as `fd` (its header written: `file_bytes`), of chains
    /// up to `max_depth`; `summary`: print the `PROFILE:` line if it is completed at `_exit`;
    /// `checkpoint`: the interval between checkpoints, if any.
    pub fn new(
        path: &std::path::Path,
        fd: c_int,
        file_bytes: u64,
        max_depth: usize,
        summary: bool,
        checkpoint: Option<std::time::Duration>,
        event_line: Option<String>,
    ) -> Option<Box<Threadless>> {
        use std::os::unix::ffi::OsStrExt;
        Some(Box::new(Threadless {
            pid: std::process::id(),
            fd,
            identity: identity(fd)?,
            format: SlotFormat::NATIVE,
            path: CString::new(path.as_os_str().as_bytes()).ok()?,
            buffer: UnsafeCell::new(vec![0; BUFFER].into_boxed_slice()),
            scratch: UnsafeCell::new(vec![0; max_depth.max(1)].into_boxed_slice()),
            file_bytes: AtomicU64::new(file_bytes),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            failure: std::sync::atomic::AtomicI32::new(0),
            completed: AtomicBool::new(false),
            summary,
            tail_bytes: AtomicU64::new(0),
            file_end: AtomicU64::new(file_bytes),
            checkpoint_ns: checkpoint.map_or(0, |d| d.as_nanos().max(1) as u64),
            next_checkpoint_ns: AtomicU64::new(0),
            exec_trailer_at: AtomicU64::new(0),
            next_harvest_ns: AtomicU64::new(monotonic_ns() + FIRST_HARVEST_NS),
            harvest_interval_ns: AtomicU64::new(FIRST_HARVEST_NS),
            event_line: event_line.unwrap_or_default().into_bytes().into_boxed_slice(),
        }))
    }
}

/// Makes `threadless` the way the running profile is written until its writer starts.
///
/// The file is first made a complete, empty profile: the trailer and the maps follow the
/// header (a tail, which the first records written go over). So a process that ends before writing anything, in a way nothing sees (a raw `exit_group`
/// system call, `SIGKILL`: a forked child that only forks again and exits, as daemons and
/// Chromium's launcher do), leaves a valid profile rather than a bare header.
pub fn publish(threadless: Box<Threadless>) {
    threadless.write_tail_with(SignalWeights::default(), None);
    threadless
        .next_checkpoint_ns
        .store(monotonic_ns() + threadless.checkpoint_ns, Ordering::SeqCst);
    let old = CURRENT.swap(Box::into_raw(threadless), Ordering::SeqCst);
    debug_assert!(old.is_null());
    OWNER.store(FREE, Ordering::SeqCst);
}

/// Whether this process's profile is written here (it has no writer thread). Async-signal-safe.
pub fn active() -> bool {
    // SAFETY: a published Threadless is freed only after handlers are done with it (`hand_over`).
    unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }.is_some_and(|t| t.pid == own_pid())
        && OWNER.load(Ordering::SeqCst) != GONE
}

/// Called by the signal handler after each sample: writes the evicted records once the ring
/// is half full. Async-signal-safe.
pub fn after_sample(state: &SamplerState) {
    if CURRENT.load(Ordering::Relaxed).is_null() {
        return;
    }
    with_file(|t| {
        let now = monotonic_ns();
        let checkpoint = t.checkpoint_ns > 0 && now >= t.next_checkpoint_ns.load(Ordering::Relaxed);
        if now >= t.next_harvest_ns.load(Ordering::Relaxed) {
            let interval = (t.harvest_interval_ns.load(Ordering::Relaxed) * 2).min(MAX_HARVEST_INTERVAL_NS);
            t.harvest_interval_ns.store(interval, Ordering::Relaxed);
            t.next_harvest_ns.store(now + interval, Ordering::Relaxed);
            t.write_records(state, true);
        } else if checkpoint || state.table.ring_used_slots() * 2 >= state.table.ring_capacity_slots() {
            t.write_records(state, false);
        }
        // Threads made by raw clone are armed here (no writer polls for them).
        crate::sampler::unannounced::poll();
    });
}

/// Writes the evicted records and the table's counts to the file now (`ProfilerFlush`).
/// Returns false when the profile is not written here. Async-signal-safe.
pub fn flush(state: &SamplerState) -> bool {
    with_file(|t| t.write_records(state, true)).is_some()
}

/// Completes the file in place (records, trailer, maps, signal weights) before `_exit` or a
/// forked child's `exec`; nothing is written here afterwards. Returns false when the profile is
/// not written here. Async-signal-safe.
pub fn complete(state: &SamplerState) -> bool {
    let done = with_file(|t| {
        t.write_records_and_tail(state, true);
        t.completed.store(true, Ordering::SeqCst);
    });
    if done.is_some() {
        OWNER.store(GONE, Ordering::SeqCst);
    }
    done.is_some()
}

/// The bytes in the file written here and, if a write failed, why (an errno or
/// [`DESCRIPTOR_TAKEN`]), for a profile completed in place.
pub fn file_state() -> (u64, Option<i32>) {
    // SAFETY: see `active`.
    unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }.map_or((0, Some(DESCRIPTOR_TAKEN)), |t| {
        (
            t.file_bytes.load(Ordering::SeqCst),
            t.failed
                .load(Ordering::SeqCst)
                .then(|| t.failure.load(Ordering::SeqCst)),
        )
    })
}

/// Prints gperftools' `PROFILE:` line for a profile completed here at `_exit`, if it is to be
/// printed. Async-signal-safe.
pub fn say_summary(state: &SamplerState) {
    // SAFETY: see `active`.
    let Some(t) = (unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }) else {
        return;
    };
    if !t.summary || t.pid != own_pid() {
        return;
    }
    let stats = &state.table.stats;
    let mut line = crate::in_program::messages::FixedLine::default();
    line.text(b"PROFILE: interrupts/evictions/bytes = ")
        .number(state.interrupts.load(Ordering::Relaxed))
        .text(b"/")
        .number(stats.evictions.load(Ordering::Relaxed))
        .text(b"/")
        .number(t.file_bytes.load(Ordering::SeqCst))
        .text(b" (lost samples: ")
        .number(stats.lost.load(Ordering::Relaxed));
    if t.failed.load(Ordering::SeqCst) {
        line.text(b"; INCOMPLETE: the file does not hold the whole profile");
    }
    line.text(b")\n");
    crate::in_program::messages::say_bytes(line.as_bytes());
}

/// Before an `exec` of the process profiling here: completes the file as [`complete`] does,
/// keeping where its records end, so that [`resume_after_failed_exec`] can take the trailer
/// back. Async-signal-safe.
pub fn complete_for_exec(state: &SamplerState) -> bool {
    let done = with_file(|t| {
        t.write_records_and_tail(state, true);
        t.exec_trailer_at
            .store(t.file_bytes.load(Ordering::SeqCst), Ordering::SeqCst);
        t.completed.store(true, Ordering::SeqCst);
    });
    if done.is_some() {
        OWNER.store(GONE, Ordering::SeqCst);
    }
    done.is_some()
}

/// The `exec` failed: the trailer written for it is taken back (the file cut back to its
/// records) and the file is written here again. Async-signal-safe.
pub fn resume_after_failed_exec() {
    // SAFETY: see `active`.
    let Some(t) = (unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }) else {
        return;
    };
    let end = t.exec_trailer_at.swap(0, Ordering::SeqCst);
    if end == 0 || t.pid != own_pid() {
        return;
    }
    // The file stays complete: the next records go over its tail.
    t.completed.store(false, Ordering::SeqCst);
    OWNER.store(FREE, Ordering::SeqCst);
}

/// The path of the file written here, for a forked child to remove or rename it at `exec`.
/// Async-signal-safe.
pub fn path() -> Option<&'static CString> {
    // SAFETY: see `active`; the caller is the process's only user at exec.
    unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }
        .filter(|t| t.pid == own_pid())
        .map(|t| &t.path)
}

/// Hands the file to the writer thread about to start: no handler writes it after this
/// returns. Returns what was written here, or `None` when nothing is written here. Not for
/// signal context: it waits for a handler that is writing, and for handlers to leave.
pub fn hand_over() -> Option<HandedOver> {
    let ptr = CURRENT.load(Ordering::SeqCst);
    if ptr.is_null() {
        return None;
    }
    // A handler or flush writing now finishes first (it takes ~a millisecond at most).
    loop {
        match OWNER.compare_exchange(FREE, GONE, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) | Err(GONE) => break,
            Err(_) => std::thread::yield_now(),
        }
    }
    CURRENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    // The writer's poll arms every thread from now on.
    crate::sampler::unannounced::release();
    // SAFETY: `ptr` came from Box::into_raw in `publish`; unpublished above.
    let t = unsafe { &*ptr };
    // The writer appends records at the descriptor's offset: where the records end, over the
    // tail, which it is told of.
    if identity(t.fd) == Some(t.identity) {
        // SAFETY: moves our own (just checked) descriptor's offset.
        unsafe { libc::lseek(t.fd, t.file_bytes.load(Ordering::SeqCst) as libc::off_t, libc::SEEK_SET) };
    }
    let handed = HandedOver {
        records: t.records.load(Ordering::SeqCst),
        bytes: t.bytes.load(Ordering::SeqCst),
        failed: t.failed.load(Ordering::SeqCst),
        failure: t.failure.load(Ordering::SeqCst),
        completed: t.completed.load(Ordering::SeqCst),
        file_bytes: t.file_bytes.load(Ordering::SeqCst),
        tail: t.tail_bytes.load(Ordering::SeqCst),
    };
    if crate::sampler::wait_for_handlers() {
        // SAFETY: no handler can still hold the pointer.
        drop(unsafe { Box::from_raw(ptr) });
    }
    Some(handed)
}

/// In a forked child: the parent's threadless state (its file, its buffers) is not the
/// child's. Forgotten, never written or freed here.
pub fn forget_in_child() {
    CURRENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    OWNER.store(GONE, Ordering::SeqCst);
}

/// Runs `f` on the published state with the file to itself, if it is this process's and free.
fn with_file<R>(f: impl FnOnce(&Threadless) -> R) -> Option<R> {
    // SAFETY: see `active`.
    let t = unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }?;
    if t.pid != own_pid() {
        return None;
    }
    OWNER
        .compare_exchange(FREE, BUSY, Ordering::SeqCst, Ordering::Relaxed)
        .ok()?;
    let result = f(t);
    // Completion leaves it GONE.
    let _ = OWNER.compare_exchange(BUSY, FREE, Ordering::SeqCst, Ordering::Relaxed);
    Some(result)
}

/// CLOCK_MONOTONIC_COARSE in ns: the harvest schedule needs no precision. Async-signal-safe.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime (vDSO) into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn own_pid() -> u32 {
    // SAFETY: getpid has no preconditions (not cached by glibc: right in a forked child).
    unsafe { libc::getpid() as u32 }
}

impl Threadless {
    /// Writes the ring's records (and with `harvest` the table's counts), then, with
    /// checkpoints, the tail that completes the profile; without, the file is cut to its
    /// records (the tail written at start goes). The caller holds OWNER.
    fn write_records(&self, state: &SamplerState, harvest: bool) {
        let before = self.file_bytes.load(Ordering::SeqCst);
        self.write_records_only(state, harvest);
        if self.checkpoint_ns > 0 {
            self.write_tail_with(state.signal_weights(), Some(state));
            self.next_checkpoint_ns
                .store(monotonic_ns() + self.checkpoint_ns, Ordering::Relaxed);
        } else if self.file_bytes.load(Ordering::SeqCst) != before {
            self.tail_bytes.store(0, Ordering::SeqCst);
            self.cut_to_end();
        }
    }

    /// Writes the records and the table's counts, then the tail (the file's end, before an
    /// `_exit` or `exec`). The caller holds OWNER.
    fn write_records_and_tail(&self, state: &SamplerState, harvest: bool) {
        self.write_records_only(state, harvest);
        self.write_tail_with(state.signal_weights(), Some(state));
    }

    fn write_records_only(&self, state: &SamplerState, harvest: bool) {
        // SAFETY: OWNER gives the caller the cells and the ring's consumer side.
        let (buffer, scratch) = unsafe { (&mut *self.buffer.get(), &mut *self.scratch.get()) };
        let mut batch = Batch::new(self, buffer, false);
        // SAFETY: OWNER makes this the ring's only consumer (no writer thread exists).
        unsafe {
            state
                .table
                .drain_evicted_exclusive(scratch, |count, pcs| batch.put(count, pcs))
        };
        if harvest {
            state.table.harvest_with(scratch, |count, pcs| batch.put(count, pcs));
        }
        batch.write();
        if batch.lost > 0 {
            state.table.count_unwritten(batch.lost);
        }
    }

    /// Writes whole records (`records` of them holding `samples`). Returns the samples lost:
    /// all of them if the write is refused.
    fn write_buffer(&self, bytes: &[u8], (records, samples): (u64, u64)) -> u64 {
        if bytes.is_empty() {
            return 0;
        }
        if self.failed.load(Ordering::Relaxed) {
            return samples;
        }
        // Where the records end, over the tail. A write refused part way (a full disk) keeps
        // the whole records it took, as the writer thread's file does, and no tail.
        let before = self.file_bytes.load(Ordering::SeqCst);
        let (kept, done) = match self.write_at(before, bytes) {
            Ok(()) => (bytes, bytes.len()),
            Err(done) => (&bytes[..whole_records_in(&bytes[..done], self.format)], done),
        };
        let end = before + kept.len() as u64;
        self.file_bytes.store(end, Ordering::SeqCst);
        // What the refused write left past the whole records is cut below with the rest.
        self.file_end.fetch_max(before + done as u64, Ordering::SeqCst);
        if kept.len() < bytes.len() {
            self.tail_bytes.store(0, Ordering::SeqCst);
            self.cut_to_end();
        }
        let (kept_records, kept_samples) = used_records(kept, self.format);
        self.records.fetch_add(kept_records.min(records), Ordering::SeqCst);
        self.bytes.fetch_add(kept.len() as u64, Ordering::SeqCst);
        samples - kept_samples.min(samples)
    }

    /// Cuts the file to the records and their tail, if it held more (what is left of a longer
    /// tail). Async-signal-safe.
    fn cut_to_end(&self) {
        let end = self.file_bytes.load(Ordering::SeqCst) + self.tail_bytes.load(Ordering::SeqCst);
        if self.file_end.load(Ordering::SeqCst) > end && identity(self.fd) == Some(self.identity) {
            // SAFETY: shrinking our own (just checked) file.
            unsafe { libc::ftruncate(self.fd, end as libc::off_t) };
        }
        self.file_end.store(end, Ordering::SeqCst);
    }

    /// Writes `bytes` (a piece of the tail) after the tail written so far, all or nothing: on
    /// a failure the tail is given up (the file is cut back to its records) and false returned.
    fn write_whole(&self, bytes: &[u8]) -> bool {
        // After a refused write nothing more goes in: a later piece could fit in the room
        // freed by cutting the file back, and land after the records without the trailer.
        if self.failed.load(Ordering::SeqCst) {
            return false;
        }
        let tail = self.tail_bytes.load(Ordering::SeqCst);
        let at = self.file_bytes.load(Ordering::SeqCst) + tail;
        match self.write_at(at, bytes) {
            Ok(()) => {
                self.tail_bytes.store(tail + bytes.len() as u64, Ordering::SeqCst);
                self.file_end.fetch_max(at + bytes.len() as u64, Ordering::SeqCst);
                true
            }
            Err(done) => {
                self.file_end.fetch_max(at + done as u64, Ordering::SeqCst);
                self.tail_bytes.store(0, Ordering::SeqCst);
                self.cut_to_end();
                false
            }
        }
    }

    /// Writes `bytes` at `offset` of the file (`pwrite`: the descriptor's offset is left
    /// alone). On a failure, marks the profile failed and returns how many bytes the file
    /// took; the caller cuts it back.
    fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<(), usize> {
        if identity(self.fd) != Some(self.identity) {
            self.fail(DESCRIPTOR_TAKEN);
            return Err(0);
        }
        if would_pass_size_limit(offset + bytes.len() as u64) {
            // What the writer thread, which blocks SIGXFSZ, gets from write(2).
            self.fail(libc::EFBIG);
            return Err(0);
        }
        let mut done = 0;
        while done < bytes.len() {
            let rest = &bytes[done..];
            let at = (offset + done as u64) as libc::off_t;
            // SAFETY: writes a live slice to our own (just checked) descriptor.
            let n = unsafe { libc::pwrite(self.fd, rest.as_ptr().cast(), rest.len(), at) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            // SAFETY: the calling thread's errno.
            let errno = unsafe { *libc::__errno_location() };
            if n < 0 && errno == libc::EINTR {
                continue;
            }
            self.fail(if n == 0 { libc::ENOSPC } else { errno });
            return Err(done);
        }
        Ok(())
    }

    /// Records the first failure, `why`; returns false.
    fn fail(&self, why: i32) -> bool {
        if !self.failed.swap(true, Ordering::SeqCst) {
            self.failure.store(why, Ordering::SeqCst);
        }
        false
    }

    /// Writes the tail after the records, over the last one: the table's counts not harvested
    /// yet (copied from `table`, if given), the trailer, `/proc/self/maps` as it is now, the
    /// signal-weights and process lines; then cuts the file to its new end. Returns whether
    /// all was written. The caller has the buffers to itself (it holds OWNER, or has not
    /// published `self`).
    fn write_tail_with(&self, weights: SignalWeights, table: Option<&SamplerState>) -> bool {
        self.tail_bytes.store(0, Ordering::SeqCst);
        let whole = !self.failed.load(Ordering::Relaxed) && self.write_tail_pieces(weights, table);
        self.cut_to_end();
        whole
    }

    fn write_tail_pieces(&self, weights: SignalWeights, table: Option<&SamplerState>) -> bool {
        if let Some(state) = table {
            // SAFETY: OWNER gives the caller the cells.
            let (buffer, scratch) = unsafe { (&mut *self.buffer.get(), &mut *self.scratch.get()) };
            let mut batch = Batch::new(self, buffer, true);
            state.table.peek_with(scratch, |count, pcs| batch.put(count, pcs));
            batch.write();
            if batch.lost > 0 {
                return false;
            }
        }
        // SAFETY: OWNER gives the caller the buffer.
        let buffer = unsafe { &mut *self.buffer.get() };
        let mut used = 0;
        for slot in TRAILER {
            self.format.put_into(slot, &mut buffer[used..]);
            used += self.format.size;
        }
        if !self.write_whole(&buffer[..used]) {
            return false;
        }
        // SAFETY: open with a constant NUL-terminated path.
        let maps = unsafe { libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if maps >= 0 {
            loop {
                // SAFETY: reads into our own buffer.
                let n = unsafe { libc::read(maps, buffer.as_mut_ptr().cast(), buffer.len()) };
                // SAFETY: the calling thread's errno.
                if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
                    continue;
                }
                if n <= 0 || !self.write_whole(&buffer[..n as usize]) {
                    break;
                }
            }
            // SAFETY: our own descriptor, opened above.
            unsafe { libc::close(maps) };
        }
        let mut line = [0; crate::format::signal_weights::LINE_BYTES];
        let n = weights.write_line(&mut line);
        self.write_whole(&line[..n])
            && self.write_process_line(buffer)
            && (self.event_line.is_empty() || self.write_whole(&self.event_line))
    }

    /// The `# process` line (`format::process`), from `/proc/self/cmdline` read into `buffer`,
    /// written through a small staging array.
    fn write_process_line(&self, buffer: &mut [u8]) -> bool {
        let n = read_file(c"/proc/self/cmdline", buffer);
        let mut stage = [0u8; 512];
        let mut staged = 0;
        let mut whole = true;
        // SAFETY: getpid and getppid have no preconditions.
        let (pid, ppid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
        write_line(
            pid,
            ppid,
            crate::session::children::is_forked_child(),
            cmdline_args(&buffer[..n]),
            &mut |piece: &[u8]| {
                if staged + piece.len() > stage.len() {
                    whole &= self.write_whole(&stage[..staged]);
                    staged = 0;
                }
                if piece.len() > stage.len() {
                    whole &= self.write_whole(piece);
                } else {
                    stage[staged..staged + piece.len()].copy_from_slice(piece);
                    staged += piece.len();
                }
            },
        );
        whole && self.write_whole(&stage[..staged])
    }
}

/// Records gathered in the buffer, written when it is full.
struct Batch<'a> {
    file: &'a Threadless,
    buffer: &'a mut [u8],
    used: usize,
    /// Samples that could not be written.
    lost: u64,
    /// The records go in the tail (copied counts), not with the records.
    tail: bool,
}

impl<'a> Batch<'a> {
    /// None gathered yet in `buffer`; `tail`: the records go in the tail.
    fn new(file: &'a Threadless, buffer: &'a mut [u8], tail: bool) -> Batch<'a> {
        Batch {
            file,
            buffer,
            used: 0,
            lost: 0,
            tail,
        }
    }

    fn put(&mut self, count: u64, pcs: &[u64]) {
        // A label set's marker, from a sample taken before the writer (started by the first
        // label set, `crate::labels`) took the file over: the record is kept, unlabelled.
        let (pcs, _) = crate::format::sample_labels::split(pcs);
        let (size, records) = record_size(self.file.format, count, pcs);
        if records == 0 {
            return;
        }
        if self.used + size > self.buffer.len() {
            self.write();
        }
        if size > self.buffer.len() {
            self.lost += count;
            return;
        }
        self.used += encode_record(self.file.format, count, pcs, &mut self.buffer[self.used..]);
    }

    fn write(&mut self) {
        let bytes = &self.buffer[..self.used];
        if self.tail {
            if !bytes.is_empty() && !self.file.write_whole(bytes) {
                self.lost += used_records(bytes, self.file.format).1;
            }
        } else {
            self.lost += self.file.write_buffer(bytes, used_records(bytes, self.file.format));
        }
        self.used = 0;
    }
}

/// Reads the file at `path` into `buffer` (as much as fits); returns the bytes read.
/// Async-signal-safe.
fn read_file(path: &std::ffi::CStr, buffer: &mut [u8]) -> usize {
    // SAFETY: open, read and close of a file of our own, into our own buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let mut n = 0;
        while n < buffer.len() {
            let r = libc::read(fd, buffer[n..].as_mut_ptr().cast(), buffer.len() - n);
            if r > 0 {
                n += r as usize;
            } else if r < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            } else {
                break;
            }
        }
        libc::close(fd);
        n
    }
}

/// The length of the whole records at the start of `bytes` (records cut by a short write end
/// it).
fn whole_records_in(bytes: &[u8], format: SlotFormat) -> usize {
    let mut at = 0;
    while at + 2 * format.size <= bytes.len() {
        let depth = format.get(&bytes[at + format.size..]) as usize;
        let end = at + (2 + depth) * format.size;
        if end > bytes.len() {
            break;
        }
        at = end;
    }
    at
}

/// The records in whole-record `bytes` and the samples they hold.
fn used_records(bytes: &[u8], format: SlotFormat) -> (u64, u64) {
    let (mut at, mut records, mut samples) = (0, 0, 0);
    while at + 2 * format.size <= bytes.len() {
        let count = format.get(&bytes[at..]);
        let depth = format.get(&bytes[at + format.size..]) as usize;
        records += 1;
        samples += count;
        at += (2 + depth) * format.size;
    }
    (records, samples)
}

/// Whether a file of `size` bytes passes `RLIMIT_FSIZE`: writing past it would send this
/// thread `SIGXFSZ`, whose default action ends the program (the writer thread blocks it and
/// gets `EFBIG`; a signal handler cannot).
fn would_pass_size_limit(size: u64) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a local.
    (unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) }) == 0
        && limit.rlim_cur != libc::RLIM_INFINITY
        && size > limit.rlim_cur
}
