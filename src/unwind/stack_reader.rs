//! The one way stack walks read the interrupted thread's memory: 8-byte aligned words inside
//! the range the thread registry vouches for, or on pages a probe has just shown readable.

use super::probe::ProbedPages;

pub struct StackReader {
    sp: u64,
    vouched_top: u64,
    probed: ProbedPages,
}

impl StackReader {
    /// `vouched_top`: memory in `[sp, vouched_top)` is known mapped and readable.
    pub fn new(sp: u64, vouched_top: Option<u64>) -> Self {
        StackReader {
            sp,
            vouched_top: vouched_top.unwrap_or(0),
            probed: ProbedPages::default(),
        }
    }

    /// The word at `addr`, or `None` if it is misaligned or not known readable.
    /// Async-signal-safe; makes a system call only to probe an unvouched page.
    pub fn read(&mut self, addr: u64) -> Option<u64> {
        if addr % 8 != 0 {
            return None;
        }
        let end = addr.checked_add(8)?;
        let vouched = addr >= self.sp && end <= self.vouched_top;
        if !vouched && !self.probed.check(addr, 8) {
            return None;
        }
        // SAFETY: [addr, addr + 8) is inside the vouched stack range or was just probed readable.
        Some(unsafe { std::ptr::read_volatile(addr as *const u64) })
    }
}
