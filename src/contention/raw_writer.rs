//! The contention profile written without allocating or locking, for the ends of a process
//! where nothing else may run: `_exit`, `_Exit` and `quick_exit`, which may be called from a
//! signal handler that interrupted `malloc`. The text is `ContentionProfile::write_text`'s,
//! with two differences readers do not mind: a chain recorded twice in the table (see
//! `heap::sites`) is on two lines, and there are no `# build-id` lines (reading them
//! allocates). `/proc/self/maps` is copied as it is.

use super::{table, View, STARTED_NS};
use std::ffi::c_int;
use std::sync::atomic::Ordering;

/// A fixed buffer written to a descriptor as it fills.
struct Out {
    fd: c_int,
    buffer: [u8; 4096],
    len: usize,
    at: i64,
    failed: bool,
}

impl Out {
    fn flush(&mut self) {
        let mut done = 0;
        while done < self.len && !self.failed {
            // SAFETY: writes our own buffer's bytes.
            let n = unsafe { libc::pwrite(self.fd, self.buffer[done..].as_ptr().cast(), self.len - done, self.at) };
            if n < 0 {
                // SAFETY: the thread's errno.
                if unsafe { *libc::__errno_location() } == libc::EINTR {
                    continue;
                }
                self.failed = true;
            } else {
                done += n as usize;
                self.at += n as i64;
            }
        }
        self.len = 0;
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(self.buffer.len()) {
            if self.len + chunk.len() > self.buffer.len() {
                self.flush();
            }
            self.buffer[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
    }

    fn decimal(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.bytes(&digits[i..]);
    }

    fn hex(&mut self, mut n: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(n & 15) as usize];
            n >>= 4;
            if n == 0 {
                break;
            }
        }
        self.bytes(b"0x");
        self.bytes(&digits[i..]);
    }
}

/// Writes the profile of `view` so far to `fd` from offset 0 and cuts the file there; whether
/// all was written. Async-signal-safe.
pub fn write(fd: c_int, view: View) -> bool {
    let mut out = Out {
        fd,
        buffer: [0; 4096],
        len: 0,
        at: 0,
        failed: false,
    };
    out.bytes(b"--- contention:\ncycles/second = 1000000000\nsampling period = 1\nms since reset = ");
    out.decimal(super::now_ns().saturating_sub(STARTED_NS.load(Ordering::Relaxed)) / 1_000_000);
    out.bytes(b"\n");
    if view == View::Holders {
        out.bytes(crate::format::contention::HOLDERS_LINE.as_bytes());
        out.bytes(b"\n");
    }
    if let Some(table) = table(view) {
        table.for_each(|chain, _, counts| {
            if counts.alloc_objects == 0 {
                return;
            }
            out.decimal(counts.alloc_bytes);
            out.bytes(b" ");
            out.decimal(counts.alloc_objects);
            out.bytes(b" @");
            for &pc in chain {
                out.bytes(b" ");
                out.hex(pc);
            }
            out.bytes(b"\n");
        });
    }
    out.bytes(b"--- Memory map: ---\n");
    out.flush();
    // SAFETY: opens a constant NUL-terminated path, read into a local buffer, closed.
    unsafe {
        let maps = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if maps >= 0 {
            loop {
                let n = libc::read(maps, out.buffer.as_mut_ptr().cast(), out.buffer.len());
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                out.len = n as usize;
                out.flush();
            }
            libc::close(maps);
        }
        !out.failed && libc::ftruncate(fd, out.at) == 0
    }
}
