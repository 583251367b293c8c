//! Zeroed memory straight from the kernel, for buffers that every profile sets aside but a
//! run may hardly use (the walks' own stacks): a page costs nothing until it is written. A
//! heap allocation of the same size is cleared with `memset` (calloc below its mmap
//! threshold), which made every process started under the profiler fault in and clear a
//! megabyte it mostly never touched.

/// `words` zeroed 8-byte words, mapped on their own.
pub struct ZeroedWords {
    ptr: *mut u64,
    words: usize,
}

// SAFETY: the mapping is owned by this value alone, like a Box.
unsafe impl Send for ZeroedWords {}
unsafe impl Sync for ZeroedWords {}

impl ZeroedWords {
    /// A fresh anonymous mapping of `words` words, or `None` if the kernel refuses it.
    pub fn new(words: usize) -> Option<ZeroedWords> {
        let words = words.max(1);
        // SAFETY: an anonymous private mapping of our own; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(ZeroedWords { ptr: ptr.cast(), words })
    }

    pub fn as_slice(&self) -> &[u64] {
        // SAFETY: the mapping holds `words` readable words for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u64] {
        // SAFETY: as above, and borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.words) }
    }
}

impl Drop for ZeroedWords {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.words * 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_zero_and_writable() {
        let mut w = ZeroedWords::new(10_000).unwrap();
        assert!(w.as_slice().iter().all(|&x| x == 0));
        w.as_mut_slice()[9_999] = 7;
        assert_eq!(w.as_slice()[9_999], 7);
    }
}
