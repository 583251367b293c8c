//! Asks the kernel whether memory is readable, without touching it.
//!
//! `rt_sigprocmask` with an invalid `how` copies the new set in before it validates `how`, so
//! it fails with `EFAULT` for an unreadable address and `EINVAL` otherwise (~0.24 µs here;
//! `mincore` gives wrong answers for PROT_NONE guard pages). Async-signal-safe; `errno` is left
//! as it was.

const PAGE: u64 = 4096;

/// Whether the 8 bytes at `addr` can be read.
pub fn readable(addr: u64) -> bool {
    // A NULL set means "no new set" to the kernel and would succeed; page 0 is never mapped.
    if addr < PAGE {
        return false;
    }
    // SAFETY: the kernel only reads `addr`; a bad address yields EFAULT, never a fault here.
    // errno is saved and restored because this runs inside signal handlers.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let r = libc::syscall(libc::SYS_rt_sigprocmask, !0i64, addr as usize, 0usize, 8usize);
        let ok = !(r == -1 && *errno == libc::EFAULT);
        *errno = saved;
        ok
    }
}

/// Pages known readable during one stack walk, so each page is probed at most once.
/// Frames move monotonically up the stack, so one contiguous run of pages suffices.
#[derive(Default)]
pub struct ProbedPages {
    first: u64,
    /// One past the last verified page number; `first == end` means none.
    end: u64,
}

impl ProbedPages {
    /// Whether `[addr, addr + len)` is readable, probing pages not yet verified.
    pub fn check(&mut self, addr: u64, len: u64) -> bool {
        let Some(last_byte) = addr.checked_add(len - 1) else {
            return false;
        };
        for page in addr / PAGE..=last_byte / PAGE {
            if page >= self.first && page < self.end {
                continue;
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
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_mapped_from_unmapped_and_guard_pages() {
        let local = 5u64;
        assert!(readable(&local as *const u64 as u64));
        assert!(!readable(0));
        assert!(!readable(8));
        // SAFETY: plain anonymous mappings owned by this test.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE as usize,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let base = p as u64;
            libc::mprotect((base + PAGE) as *mut _, PAGE as usize, libc::PROT_NONE);
            assert!(readable(base));
            assert!(!readable(base + PAGE), "PROT_NONE guard page must read as unreadable");
            let mut pages = ProbedPages::default();
            assert!(pages.check(base + 8, 16));
            assert!(
                !pages.check(base + PAGE - 8, 16),
                "a range crossing into the guard page"
            );
            libc::munmap(p, 2 * PAGE as usize);
            assert!(!readable(base));
        }
    }
}
