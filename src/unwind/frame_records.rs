//! Finding a frame-pointer function's frame record without its rbp (x86-64 specific, like
//! everything it knows), for walks of threads blocked in the kernel.
//!
//! `/proc/self/task/TID/syscall` gives a blocked thread's PC and SP but not its rbp. A function
//! built with frame pointers describes its frame as `CFA = rbp + 16`, so when it called a
//! system call wrapper that does not save rbp itself (glibc's `read`, `nanosleep`, `syscall`),
//! the walk reaches it and cannot go on: its blocked stacks ended there (B 0 of 200 stacks
//! complete in the wall-clock known answer built with -fno-omit-frame-pointer).
//!
//! The record (`saved rbp`, `return address`) lies somewhere above the function's SP at the
//! call. Scanning for it is not enough by itself: uninitialised locals hold stale records of
//! earlier calls. So a candidate is taken only if its return address follows a direct call
//! (`e8 rel32`) whose target is the very function being stepped, as `.eh_frame_hdr`'s table of
//! function starts gives it, and its saved rbp is 0 or above it. A function reached through a
//! PLT stub or an indirect call is not recovered: the walk ends there as before.

use super::stack_reader::StackReader;
use std::ops::Range;

/// How far above the SP the record is looked for: the function's locals and saved registers.
const SCAN_BYTES: u64 = 4096;
/// `.eh_frame_hdr` table encoding: `DW_EH_PE_datarel | DW_EH_PE_sdata4`, what GNU ld and lld
/// write.
const DATAREL_SDATA4: u8 = 0x3b;
const UDATA4: u8 = 0x03;
const DIRECT_CALL: u8 = 0xe8;

/// The function starts of the loaded objects, from copies of their `.eh_frame_hdr` tables.
#[derive(Default)]
pub struct FunctionStarts {
    /// (code range, address of the `.eh_frame_hdr` copy's original, its bytes), sorted.
    objects: Vec<(Range<u64>, u64, Vec<u8>)>,
}

impl FunctionStarts {
    /// Adds an object whose code spans `code` and whose `.eh_frame_hdr` (`hdr`, a copy) was at
    /// `hdr_address`.
    pub fn add(&mut self, code: Range<u64>, hdr_address: u64, hdr: Vec<u8>) {
        let at = self.objects.partition_point(|(r, _, _)| r.start < code.start);
        self.objects.insert(at, (code, hdr_address, hdr));
    }

    /// The start of the function containing `pc`, by its FDE.
    pub fn start_of(&self, pc: u64) -> Option<u64> {
        let i = self.objects.partition_point(|(r, _, _)| r.start <= pc).checked_sub(1)?;
        let (code, hdr_address, hdr) = &self.objects[i];
        if !code.contains(&pc) {
            return None;
        }
        table_lookup(hdr, *hdr_address, pc)
    }
}

/// The greatest initial location at or below `pc` in an `.eh_frame_hdr` search table.
fn table_lookup(hdr: &[u8], hdr_address: u64, pc: u64) -> Option<u64> {
    if hdr.first() != Some(&1) || hdr.get(2) != Some(&UDATA4) || hdr.get(3) != Some(&DATAREL_SDATA4) {
        return None;
    }
    // The pointer to .eh_frame is 4 bytes in every encoding ld writes with this table
    // encoding (pcrel or datarel sdata4, udata4).
    let count = u32::from_le_bytes(hdr.get(8..12)?.try_into().ok()?) as usize;
    let table = hdr.get(12..12 + count.checked_mul(8)?)?;
    let start = |i: usize| {
        let rel = i32::from_le_bytes(table[8 * i..8 * i + 4].try_into().unwrap());
        hdr_address.wrapping_add_signed(rel as i64)
    };
    // The entries are sorted by initial location: the last one at or below `pc`.
    let (mut low, mut high) = (0, count);
    while low < high {
        let mid = (low + high) / 2;
        if start(mid) <= pc {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    Some(start(low.checked_sub(1)?))
}

/// The frame record of the function at `pc`, whose SP at its call was `sp`: (CFA, return
/// address, caller's rbp), or `None` if none is proven. `is_code` tells code addresses.
pub fn find(
    starts: &FunctionStarts,
    pc: u64,
    sp: u64,
    stack: &mut StackReader,
    is_code: impl Fn(u64) -> bool,
) -> Option<(u64, u64, u64)> {
    let function = starts.start_of(pc)?;
    let mut record = sp.checked_add(7)? & !7;
    while record < sp.saturating_add(SCAN_BYTES) {
        let candidate = record;
        record += 8;
        let ret = stack.read(candidate + 8)?;
        if ret < 5 || !is_code(ret - 1) || call_target(stack, ret) != Some(function) {
            continue;
        }
        let saved_rbp = stack.read(candidate)?;
        if saved_rbp == 0 || saved_rbp > candidate {
            return Some((candidate + 16, ret, saved_rbp));
        }
    }
    None
}

/// The target of the direct call that `ret` returns from, if the 5 bytes before it are one.
fn call_target(stack: &mut StackReader, ret: u64) -> Option<u64> {
    let first = ret - 5;
    let base = first & !7;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&stack.read(base)?.to_le_bytes());
    if ret > base + 8 {
        bytes[8..].copy_from_slice(&stack.read(base + 8)?.to_le_bytes());
    }
    let at = (first - base) as usize;
    if bytes[at] != DIRECT_CALL {
        return None;
    }
    let rel = i32::from_le_bytes(bytes[at + 1..at + 5].try_into().ok()?);
    Some(ret.wrapping_add_signed(rel as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `.eh_frame_hdr` at `hdr_address` listing functions at `starts`.
    fn header(hdr_address: u64, starts: &[u64]) -> Vec<u8> {
        let mut hdr = vec![1, 0x1b, UDATA4, DATAREL_SDATA4];
        hdr.extend_from_slice(&0i32.to_le_bytes());
        hdr.extend_from_slice(&(starts.len() as u32).to_le_bytes());
        for &s in starts {
            hdr.extend_from_slice(&((s as i64 - hdr_address as i64) as i32).to_le_bytes());
            hdr.extend_from_slice(&0i32.to_le_bytes());
        }
        hdr
    }

    #[test]
    fn function_starts_come_from_the_table() {
        let mut starts = FunctionStarts::default();
        starts.add(0x1000..0x2000, 0x3000, header(0x3000, &[0x1000, 0x1100, 0x1800]));
        assert_eq!(starts.start_of(0x1000), Some(0x1000));
        assert_eq!(starts.start_of(0x10ff), Some(0x1000));
        assert_eq!(starts.start_of(0x1234), Some(0x1100));
        assert_eq!(starts.start_of(0x1fff), Some(0x1800));
        assert_eq!(starts.start_of(0x2000), None, "outside the object");
        assert_eq!(starts.start_of(0xfff), None);
    }

    #[test]
    fn only_a_record_returning_from_a_direct_call_of_the_function_is_taken() {
        let _fd = crate::unwind::safe_read::for_tests();
        // "Code": a direct call to 0x1100 ending at `ret`, and one to 0x1800 ending at `other`.
        let mut code = vec![0u8; 64];
        let code_base = code.as_ptr() as u64;
        let call = |code: &mut Vec<u8>, at: usize, target: u64| {
            code[at] = DIRECT_CALL;
            let rel = target as i64 - (code_base + at as u64 + 5) as i64;
            code[at + 1..at + 5].copy_from_slice(&(rel as i32).to_le_bytes());
        };
        let function = code_base + 0x10000;
        call(&mut code, 11, function);
        call(&mut code, 30, function + 0x700);
        let (ret, other) = (code_base + 16, code_base + 35);
        let mut starts = FunctionStarts::default();
        starts.add(
            function..function + 0x1000,
            function,
            header(function, &[function, function + 0x700]),
        );
        // A stack: a stale record returning to `other`, then the real one.
        let mut stack = vec![0u64; 32];
        let sp = stack.as_ptr() as u64;
        let caller_frame = sp + 8 * 30;
        stack[2] = caller_frame;
        stack[3] = other;
        stack[6] = caller_frame;
        stack[7] = ret;
        let is_code = |a: u64| (code_base..code_base + 64).contains(&a);
        let mut window = vec![0u64; 64];
        let mut reader = StackReader::new(sp, None, &mut window);
        assert_eq!(
            find(&starts, function + 0x20, sp, &mut reader, is_code),
            Some((sp + 8 * 6 + 16, ret, caller_frame))
        );
        // In the other function, the stale record is the right one.
        let mut reader = StackReader::new(sp, None, &mut window);
        assert_eq!(
            find(&starts, function + 0x720, sp, &mut reader, is_code),
            Some((sp + 8 * 2 + 16, other, caller_frame))
        );
        drop((code, stack));
    }
}
