//! Zeroed anonymous memory for the heap profiler's tables: mapped once when a profile starts
//! (never from the allocation path, and never from the allocator the profile is watching),
//! read as atomics. Pages are committed as they are first written; reading an untouched page
//! costs no memory.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicU8};

pub struct Mapped<T: 'static> {
    slice: &'static [T],
}

/// Types for which all-zero memory is a valid value.
///
/// # Safety
/// Implementors are valid when zeroed and have an alignment a page satisfies.
pub unsafe trait Zeroed {}
// SAFETY: atomics of integers are valid for any bit pattern.
unsafe impl Zeroed for AtomicU64 {}
// SAFETY: as above.
unsafe impl Zeroed for AtomicU8 {}

impl<T: Zeroed> Mapped<T> {
    /// `len` zeroed values; `None` if the memory cannot be mapped.
    pub fn new(len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        // SAFETY: an anonymous private mapping; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: the mapping is `bytes` long, zeroed (valid for `T: Zeroed`), page-aligned and
        // never unmapped: it lives as long as the process.
        let slice = unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) };
        Some(Mapped { slice })
    }

    /// Zeroes the memory by giving its pages back (they read as zero again). Concurrent
    /// atomic operations stay sound: they act on the old page or the new zero one.
    pub fn clear(&self) {
        let bytes = std::mem::size_of_val(self.slice);
        // SAFETY: the range is this mapping, private and anonymous.
        unsafe { libc::madvise(self.slice.as_ptr() as *mut libc::c_void, bytes, libc::MADV_DONTNEED) };
    }
}

impl<T> Deref for Mapped<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}
