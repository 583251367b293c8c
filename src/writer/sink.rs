//! Where one profile's bytes land ([`OutputSink`], the bottom layer of the writer's output: see
//! `output`): the profile file, opened without blocking or following links, kept at a high descriptor
//! number, checked to still be ours before every write, and never left ending mid-record.
//! Or, for a profile that never touches the file system, the same bytes held in memory, up to
//! a limit that acts as a full disk does.
//!
//! Only the writer thread writes it (it blocks every signal, SIGXFSZ included, so a file that
//! reaches `RLIMIT_FSIZE` gives `EFBIG` there instead of killing the program). Writes are
//! buffered whole records at a time: each `write` call of [`ProfileWriter`] hands over one
//! whole record (or the header, or trailer and maps), and the buffer remembers where each
//! ends. When the file system refuses part of a buffer (full disk, `EFBIG`), the file is cut
//! back to the last whole record, so readers see whole records only, and nothing more is
//! written.
//!
//! Checkpoints (`CPUPROFILE_CHECKPOINT`, see `writer`): records are then held in the
//! buffer and written only by [`OutputSink::checkpoint`], together with a tail that completes
//! the profile (the counts still in the table, the trailer, the maps), in one `write` at the end
//! of the records, over the previous tail; the file is then cut to its new end. So the file is
//! a complete profile at every moment but during that one write, and a process killed by
//! SIGKILL leaves what its last checkpoint held. The next write starts where the records end.
//!
//! [`ProfileWriter`]: crate::format::ProfileWriter

use crate::in_program::fd::GuardedFd;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Bytes buffered before they are written.
const BUFFER: usize = 1 << 16;

/// Where one profile's bytes land: a file, or memory.
pub struct OutputSink {
    target: Target,
    buffer: Vec<u8>,
    /// Offsets in `buffer` where a whole record ends.
    record_ends: Vec<usize>,
    /// Bytes in the file, all whole records.
    written: u64,
    /// Set by the first failure: nothing is written after it.
    failed: bool,
    /// Bytes after the records that complete the profile (a checkpoint's tail), written over
    /// by the next write.
    tail_in_file: u64,
    /// Records are held in the buffer until the next checkpoint.
    holding: bool,
}

/// Where the bytes go.
enum Target {
    File {
        fd: GuardedFd,
        path: PathBuf,
        regular: bool,
    },
    /// The whole profile in memory, refused past `limit` bytes.
    Memory { held: Vec<u8>, limit: usize },
}

impl OutputSink {
    /// Creates (or truncates) a regular file at `path`, or opens `/dev/null`. Any other kind
    /// of file is refused: opening never blocks (a FIFO without a reader would wait forever
    /// before `main`), symbolic links are not followed, and a terminal never becomes the
    /// controlling one.
    pub fn create(path: &Path) -> io::Result<OutputSink> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
        // SAFETY: open with a NUL-terminated path; a non-negative result is a descriptor we own.
        let raw = unsafe { libc::open(c_path.as_ptr(), flags, 0o666 as libc::c_uint) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ELOOP) => io::Error::other("it is a symbolic link, which cpuprof does not follow"),
                Some(libc::ENXIO) => io::Error::other(NOT_REGULAR),
                _ => e,
            });
        }
        // SAFETY: `raw` was just opened by us and is owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fstat fills a local struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let kind = st.st_mode & libc::S_IFMT;
        let regular = kind == libc::S_IFREG;
        let dev_null = kind == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3);
        if !regular && !dev_null {
            return Err(io::Error::other(NOT_REGULAR));
        }
        if regular {
            // Truncated only now that it is known to be a regular file; O_TRUNC at open
            // would have applied to whatever was there.
            // SAFETY: fcntl/ftruncate on our own descriptor.
            unsafe {
                libc::fcntl(raw, libc::F_SETFL, libc::fcntl(raw, libc::F_GETFL) & !libc::O_NONBLOCK);
                if libc::ftruncate(raw, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        let fd = GuardedFd::adopt(owned, format!("the profile '{}'", path.display()))?;
        Ok(OutputSink::new(Target::File {
            fd,
            path: path.to_path_buf(),
            regular,
        }))
    }

    /// A profile held in memory, at most `limit` bytes of whole records: past that, writes
    /// fail as on a full disk, and the profile says it is incomplete.
    pub fn in_memory(limit: usize) -> OutputSink {
        OutputSink::new(Target::Memory {
            held: Vec::new(),
            limit,
        })
    }

    fn new(target: Target) -> OutputSink {
        OutputSink {
            target,
            buffer: Vec::with_capacity(BUFFER),
            record_ends: Vec::new(),
            written: 0,
            failed: false,
            tail_in_file: 0,
            holding: false,
        }
    }

    /// From now on, records are written only with a checkpoint's tail (see the module's
    /// comment), or once holding ends.
    pub fn hold_records(&mut self, on: bool) {
        self.holding = on;
    }

    /// Whether records are held for checkpoints.
    pub fn holds_records(&self) -> bool {
        self.holding
    }

    /// Bytes of records held for the next checkpoint.
    pub fn held_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Writes the held records and then `tail` (which completes the profile) in one write
    /// where the records end, over the previous tail, and cuts the file to the new end. A
    /// profile kept in memory takes the records only (it is complete whenever it is read).
    pub fn checkpoint(&mut self, tail: &[u8]) -> io::Result<()> {
        if matches!(self.target, Target::Memory { .. }) {
            return self.write_buffer();
        }
        self.buffer.extend_from_slice(tail);
        self.deliver_records_and_tail(tail.len())
    }

    /// Notes a tail that was written after the records without this object (by
    /// `writer::threadless`): the next write goes over it.
    pub fn adopt_tail(&mut self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Target::File { fd, .. } = &self.target {
            // SAFETY: moves our own descriptor's offset to where the records end.
            unsafe { libc::lseek(fd.raw(), self.written as libc::off_t, libc::SEEK_SET) };
        }
        self.tail_in_file = bytes;
    }

    /// The bytes of whole records written so far (call after a flush): a copy of the memory
    /// profile, or the file read back through the profile's own descriptor.
    pub fn read_back(&self) -> io::Result<Vec<u8>> {
        match &self.target {
            Target::Memory { held, .. } => Ok(held.clone()),
            Target::File { fd, .. } => {
                if !fd.is_still_ours() {
                    return Err(fd.taken_error());
                }
                // The profile's descriptor is write-only: the same file opened again for
                // reading, through the descriptor (not the path, which may name another file).
                let mut bytes = Vec::with_capacity(self.written as usize);
                std::fs::File::open(format!("/proc/self/fd/{}", fd.raw()))?
                    .take(self.written)
                    .read_to_end(&mut bytes)?;
                if bytes.len() as u64 != self.written {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                Ok(bytes)
            }
        }
    }

    /// Bytes in the file, whole records only.
    pub fn bytes_in_file(&self) -> u64 {
        self.written
    }

    /// The descriptor of a file profile (`None` in memory), for the records a single-threaded
    /// process writes without this object (`writer::threadless`): call after a flush.
    pub fn descriptor(&self) -> Option<std::os::fd::RawFd> {
        match &self.target {
            Target::File { fd, .. } => Some(fd.raw()),
            Target::Memory { .. } => None,
        }
    }

    /// Cuts the file back to `bytes` (a trailer written for an exec that failed) and appends
    /// from there. Call after a flush.
    pub fn truncate_to(&mut self, bytes: u64) -> io::Result<()> {
        if let Target::File { fd, regular: true, .. } = &self.target {
            if !fd.is_still_ours() {
                return Err(fd.taken_error());
            }
            // SAFETY: shrinking our own (just checked) file and moving its offset to the end.
            unsafe {
                if libc::ftruncate(fd.raw(), bytes as libc::off_t) != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::lseek(fd.raw(), bytes as libc::off_t, libc::SEEK_SET);
            }
        }
        self.written = bytes;
        Ok(())
    }

    /// Counts `bytes` of whole records that reached the file without this object; `failed`:
    /// a write of theirs failed, so nothing more may be written.
    pub fn note_written_elsewhere(&mut self, bytes: u64, failed: bool) {
        self.written += bytes;
        self.failed |= failed;
    }

    /// Closes the file (if it is still ours) after checking that it is still reachable:
    /// a file whose directory was deleted while profiling has no links left, and its data is
    /// gone with the last descriptor. A memory profile gives up its bytes (a file, none).
    pub fn close(self) -> io::Result<Option<Vec<u8>>> {
        let (fd, path) = match self.target {
            Target::Memory { held, .. } => return Ok(Some(held)),
            Target::File { fd, path, .. } => (fd, path),
        };
        if !fd.is_still_ours() {
            let e = fd.taken_error();
            fd.abandon();
            return Err(e);
        }
        // SAFETY: fstat fills a local struct for our own descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let deleted = unsafe { libc::fstat(fd.raw(), &mut st) } == 0 && st.st_nlink == 0;
        fd.close_if_ours();
        if deleted {
            return Err(io::Error::other(format!(
                "'{}' (or its directory) was deleted while profiling; the profile is lost",
                path.display()
            )));
        }
        Ok(None)
    }

    fn write_buffer(&mut self) -> io::Result<()> {
        self.deliver_records_and_tail(0)
    }

    /// Delivers the buffer, whose last `tail` bytes are not records but complete the profile;
    /// the file is cut to its new end if the tail it held before went further.
    fn deliver_records_and_tail(&mut self, tail: usize) -> io::Result<()> {
        if self.failed {
            self.buffer.clear();
            self.record_ends.clear();
            return Err(io::Error::other("an earlier write failed"));
        }
        let old_end = self.written + self.tail_in_file;
        let (done, result) = self.deliver();
        if let Err(e) = result {
            self.failed = true;
            let whole = self
                .record_ends
                .iter()
                .copied()
                .take_while(|&end| end <= done)
                .last()
                .unwrap_or(0);
            let keep = self.written + whole as u64;
            self.tail_in_file = 0;
            match &mut self.target {
                Target::File { fd, regular: true, .. } if (whole < done || keep < old_end) && fd.is_still_ours() => {
                    // SAFETY: ftruncate of our own (just checked) descriptor, shrinking only.
                    unsafe { libc::ftruncate(fd.raw(), keep as libc::off_t) };
                }
                Target::Memory { held, .. } => held.truncate(keep as usize),
                Target::File { .. } => {}
            }
            self.written = keep;
            self.buffer.clear();
            self.record_ends.clear();
            return Err(e);
        }
        self.written += (done - tail) as u64;
        self.tail_in_file = tail as u64;
        if let Target::File { fd, regular: true, .. } = &self.target {
            let end = self.written + tail as u64;
            // SAFETY: shrinking our own file (checked by `deliver`) to what was just written,
            // and moving its offset back to where the records end, for the next write.
            unsafe {
                if end < old_end {
                    libc::ftruncate(fd.raw(), end as libc::off_t);
                }
                if tail > 0 {
                    libc::lseek(fd.raw(), self.written as libc::off_t, libc::SEEK_SET);
                }
            }
        }
        self.buffer.clear();
        self.record_ends.clear();
        Ok(())
    }

    /// Hands the buffer to the target: the bytes it took, and why it stopped short.
    fn deliver(&mut self) -> (usize, io::Result<()>) {
        let fd = match &mut self.target {
            Target::Memory { held, limit } => {
                let took = self.buffer.len().min(limit.saturating_sub(held.len()));
                held.extend_from_slice(&self.buffer[..took]);
                if took < self.buffer.len() {
                    let e = io::Error::other(format!(
                        "the in-memory profile reached its limit of {} MiB",
                        *limit >> 20
                    ));
                    return (took, Err(e));
                }
                return (took, Ok(()));
            }
            Target::File { fd, .. } => fd,
        };
        let mut done = 0;
        while done < self.buffer.len() {
            if !fd.is_still_ours() {
                return (done, Err(fd.taken_error()));
            }
            let rest = &self.buffer[done..];
            // SAFETY: writes from a live slice to our own (just checked) descriptor.
            let n = unsafe { libc::write(fd.raw(), rest.as_ptr() as *const libc::c_void, rest.len()) };
            match n {
                n if n > 0 => done += n as usize,
                0 => return (done, Err(io::Error::from(io::ErrorKind::WriteZero))),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return (done, Err(e));
                    }
                }
            }
        }
        (done, Ok(()))
    }
}

const NOT_REGULAR: &str =
    "it is not a regular file (a FIFO, socket or device); cpuprof writes profiles only to regular files or /dev/null";

impl Write for OutputSink {
    /// Takes all of `buf`, which must be one whole record (see the module's comment).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other("an earlier write failed"));
        }
        self.buffer.extend_from_slice(buf);
        self.record_ends.push(self.buffer.len());
        if self.buffer.len() >= BUFFER && !self.holding {
            self.write_buffer()?;
        }
        Ok(buf.len())
    }

    /// Writes the buffer, unless records are held for the next checkpoint.
    fn flush(&mut self) -> io::Result<()> {
        if self.holding {
            return Ok(());
        }
        self.write_buffer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cpuprof-profile-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_and_dev_null_is_accepted() {
        let dir = scratch("fifo");
        let fifo = dir.join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = OutputSink::create(&fifo).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // With a reader the open succeeds, and the check after it refuses.
        let _reader = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let e = OutputSink::create(&fifo).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let mut null = OutputSink::create(Path::new("/dev/null")).unwrap();
        null.write_all(b"record").unwrap();
        null.flush().unwrap();
        null.close().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stolen_descriptor_is_not_written_and_a_deleted_file_is_reported() {
        let dir = scratch("stolen");
        let mut file = OutputSink::create(&dir.join("p")).unwrap();
        let theirs = std::fs::File::create(dir.join("theirs")).unwrap();
        // SAFETY: dup2 over the profile's number, as a program recycling descriptors does.
        unsafe { libc::dup2(theirs.as_raw_fd(), file.raw_fd()) };
        file.write_all(b"record").unwrap();
        let e = file.flush().unwrap_err();
        assert!(e.to_string().contains("replaced by the program"), "{e}");
        assert_eq!(std::fs::read(dir.join("theirs")).unwrap(), b"");
        let taken = file.raw_fd();
        assert!(file.close().is_err());
        assert!(
            crate::in_program::fd::identity(taken).is_some(),
            "the program's descriptor stays open"
        );
        // SAFETY: closes the test's own duplicate.
        unsafe { libc::close(taken) };

        let file = OutputSink::create(&dir.join("q")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let e = file.close().unwrap_err();
        assert!(e.to_string().contains("deleted while profiling"), "{e}");
    }

    impl OutputSink {
        fn raw_fd(&self) -> i32 {
            self.descriptor().expect("a file profile")
        }
    }

    #[test]
    fn a_memory_profile_keeps_whole_records_up_to_its_limit() {
        let mut memory = OutputSink::in_memory(10);
        memory.write_all(b"abcd").unwrap();
        memory.write_all(b"efgh").unwrap();
        memory.flush().unwrap();
        assert_eq!(memory.read_back().unwrap(), b"abcdefgh");
        // The next two records pass the limit together: neither half of the second is kept,
        // and nothing is taken after the failure.
        memory.write_all(b"ij").unwrap();
        memory.write_all(b"klm").unwrap();
        let e = memory.flush().unwrap_err();
        assert!(e.to_string().contains("in-memory profile reached its limit"), "{e}");
        assert_eq!(memory.bytes_in_file(), 10);
        assert!(memory.write_all(b"n").is_err());
        assert_eq!(memory.close().unwrap().unwrap(), b"abcdefghij");
    }

    #[test]
    fn checkpoints_write_records_and_a_tail_that_the_next_write_replaces() {
        let dir = scratch("checkpoint");
        let path = dir.join("p");
        let mut file = OutputSink::create(&path).unwrap();
        file.write_all(b"H").unwrap();
        file.flush().unwrap();
        file.hold_records(true);
        file.write_all(b"r1").unwrap();
        file.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"H", "held until the checkpoint");
        assert_eq!(file.held_bytes(), 2);
        file.checkpoint(b"<long tail>").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"Hr1<long tail>");
        assert_eq!(file.bytes_in_file(), 3);
        // The next checkpoint goes over the tail, and what is left of the longer one is cut.
        file.write_all(b"r2").unwrap();
        file.checkpoint(b"<t>").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"Hr1r2<t>");
        assert_eq!(file.read_back().unwrap(), b"Hr1r2");
        // The end: records and trailer in one write, over the tail.
        file.hold_records(false);
        file.write_all(b"r3").unwrap();
        file.write_all(b"T").unwrap();
        file.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"Hr1r2r3T");
        assert_eq!(file.close().unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_is_read_back_through_its_own_descriptor() {
        let dir = scratch("read_back");
        let mut file = OutputSink::create(&dir.join("p")).unwrap();
        file.write_all(b"header").unwrap();
        file.write_all(b"record").unwrap();
        file.flush().unwrap();
        assert_eq!(file.read_back().unwrap(), b"headerrecord");
        assert_eq!(file.close().unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
