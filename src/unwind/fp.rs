//! Frame-pointer stack walking that never faults, whatever the frame-pointer register holds.
//!
//! With frame pointers, `[fp]` is the caller's frame pointer and `[fp + 8]` the return address
//! (x86-64's rbp chain and aarch64's frame records `{x29, x30}` alike; aarch64's leaf caller is
//! in LR, see [`crate::arch`]).
//! Code built without them uses the register for anything, so every candidate frame is checked:
//! it must be 8-byte aligned, above the previous one (stacks grow down, so callers live higher),
//! and readable: every word is read through `StackReader`, which copies memory the thread
//! registry does not vouch for through the kernel, so it cannot fault even if unmapped meanwhile.

use super::stack_reader::StackReader;

pub use crate::arch::Registers;
use crate::arch::{frameless_leaf_caller, return_address};

/// Frames further apart than this are treated as garbage: no real frame is 64 MiB.
const MAX_FRAME_SPAN: u64 = 64 << 20;

/// Writes the PC and then return addresses into `out`; returns how many were written.
/// `stack` reads the stack interrupted at `regs.sp`.
/// Async-signal-safe: the only system calls are copies of memory nothing vouches for.
pub fn walk(regs: Registers, stack: &mut StackReader, out: &mut [u64]) -> usize {
    if out.is_empty() || regs.pc == 0 {
        return 0;
    }
    out[0] = regs.pc;
    let mut n = 1;
    if let Some(caller) = frameless_leaf_caller(&regs, stack) {
        if n < out.len() {
            out[n] = caller;
            n += 1;
        }
    }
    let mut fp = regs.fp;
    let mut floor = regs.sp;
    while n < out.len() {
        if fp < floor || fp - floor > MAX_FRAME_SPAN {
            break;
        }
        let (Some(next), Some(ret)) = (stack.read(fp), fp.checked_add(8).and_then(|a| stack.read(a))) else {
            break;
        };
        let ret = return_address(ret);
        if ret < 4096 {
            break;
        }
        out[n] = ret;
        n += 1;
        floor = fp + 16;
        fp = next;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk from `regs` with nothing vouched for (`top`: vouched up to there).
    fn walk_from(regs: Registers, top: Option<u64>, out: &mut [u64]) -> usize {
        let mut window = [0; 64];
        walk(regs, &mut StackReader::new(regs.sp, top, &mut window), out)
    }

    /// Builds a fake stack of frames in `mem`: frame i at index 4*i holds (next fp, return).
    fn chain(mem: &mut [u64], frames: usize) -> Registers {
        let base = mem.as_ptr() as u64;
        for i in 0..frames {
            mem[4 * i] = if i + 1 < frames { base + 32 * (i as u64 + 1) } else { 0 };
            mem[4 * i + 1] = 0x1000 + i as u64;
        }
        Registers::new(0x999, base, base)
    }

    #[test]
    fn follows_a_valid_chain_to_its_end() {
        let _fd = crate::unwind::safe_read::for_tests();
        let mut mem = vec![0u64; 64];
        let regs = chain(&mut mem, 5);
        let mut out = [0u64; 16];
        let n = walk_from(regs, None, &mut out);
        assert_eq!(&out[..n], &[0x999, 0x1000, 0x1001, 0x1002, 0x1003, 0x1004]);
        let top = regs.sp + 8 * 64;
        assert_eq!(walk_from(regs, Some(top), &mut out), 6, "vouched walk agrees");
        assert_eq!(walk_from(regs, None, &mut out[..3]), 3, "depth limit");
    }

    #[test]
    fn stops_at_garbage_without_faulting() {
        let _fd = crate::unwind::safe_read::for_tests();
        let mut mem = vec![0u64; 64];
        let regs = chain(&mut mem, 5);
        let mut out = [0u64; 16];
        for garbage in [1u64, 0xdead_beef_0000, 0x10, u64::MAX - 7, regs.sp - 64, regs.sp + 3] {
            mem[8] = garbage; // frame 2's next pointer
            let n = walk_from(regs, None, &mut out);
            assert!((3..=4).contains(&n), "garbage {garbage:#x} gave {n} frames");
        }
        for fp in [0u64, 8, 0xffff_ffff_ffff_fff8, 0x7fff_0000_0000] {
            let n = walk_from(Registers::new(regs.pc, regs.sp, fp), None, &mut out);
            assert_eq!(n, 1, "fp {fp:#x}");
        }
    }

    #[test]
    fn loops_and_downward_links_end_the_walk() {
        let _fd = crate::unwind::safe_read::for_tests();
        let mut mem = vec![0u64; 64];
        let regs = chain(&mut mem, 5);
        mem[8] = regs.sp; // frame 2 points back to frame 0
        let mut out = [0u64; 16];
        assert_eq!(walk_from(regs, None, &mut out), 4);
    }
}
