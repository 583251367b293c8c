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
//! function starts gives it (or `call *rel32(%rip)` through a slot holding it), and its saved
//! rbp is 0 or above it.
//!
//! A function called indirectly (`call *%rbx`: compilers hoist the address of a function
//! called in a loop into a register, as Rust's channels do for `Thread::park`) cannot be proven
//! by its own call site. Its candidate is taken only if the record above it proves the caller:
//! the saved rbp points to a record whose return address follows a direct call of the function
//! that made the indirect call. A stale record rarely survives that: it would need both a
//! plausible indirect call and, above it, a live record of its caller. A function reached
//! through a PLT stub, or called indirectly by a caller without a frame record (libc calling
//! `main`), is not recovered: the walk ends there as before.

use super::stack_reader::StackReader;
use std::ops::Range;

/// How far above the SP the record is looked for: the function's locals and saved registers.
const SCAN_BYTES: u64 = 4096;
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
        crate::elf::eh_frame_hdr::function_start(hdr, *hdr_address, pc)
    }
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
        if ret < 8 || !is_code(ret - 1) {
            continue;
        }
        let proven = match call_before(stack, ret) {
            Call::Direct(target) => target == function,
            Call::Indirect => false,
            Call::None => continue,
        };
        let saved_rbp = stack.read(candidate)?;
        if saved_rbp == 0 && proven {
            return Some((candidate + 16, ret, saved_rbp));
        }
        if saved_rbp <= candidate || saved_rbp % 8 != 0 {
            continue;
        }
        if proven || caller_proven(starts, stack, ret, saved_rbp, &is_code) {
            return Some((candidate + 16, ret, saved_rbp));
        }
    }
    None
}

/// Whether the record at `caller_record` (the caller's saved rbp and return address) returns
/// from a direct call of the function containing `ret`.
fn caller_proven(
    starts: &FunctionStarts,
    stack: &mut StackReader,
    ret: u64,
    caller_record: u64,
    is_code: &impl Fn(u64) -> bool,
) -> bool {
    let Some(caller) = starts.start_of(ret) else {
        return false;
    };
    match stack.read(caller_record + 8) {
        Some(up) if up >= 8 && is_code(up - 1) => call_before(stack, up) == Call::Direct(caller),
        _ => false,
    }
}

/// What the instruction ending at a return address was.
#[derive(Debug, PartialEq)]
enum Call {
    /// A call whose target is known: `call rel32`, or `call *rel32(%rip)` (a GOT slot, as
    /// `-fno-plt` code calls), with the slot read now.
    Direct(u64),
    /// A call through a register or through memory addressed by one (`call *%rbx`,
    /// `call *0x18(%rax)`): any target.
    Indirect,
    /// No call ends there.
    None,
}

/// Decodes the call instruction that `ret` returns from, from the 8 bytes before it.
fn call_before(stack: &mut StackReader, ret: u64) -> Call {
    let Some(bytes) = code_before(stack, ret) else {
        return Call::None;
    };
    let b = |back: usize| bytes[8 - back];
    let rel32 = || i32::from_le_bytes([b(4), b(3), b(2), b(1)]) as i64;
    if b(5) == DIRECT_CALL {
        return Call::Direct(ret.wrapping_add_signed(rel32()));
    }
    if b(6) == 0xff && b(5) == 0x15 {
        return match stack.read(ret.wrapping_add_signed(rel32())) {
            Some(target) => Call::Direct(target),
            None => Call::None,
        };
    }
    // ModRM with reg = 2 (call): mod 11 `call *%reg` (2 bytes, 3 with a REX prefix), mod 00
    // `call *(%reg)` (not the rsp and rbp forms, which are longer), mod 01 `call *disp8(%reg)`,
    // mod 10 `call *disp32(%reg)`.
    let indirect = (b(2) == 0xff && matches!(b(1), 0xd0..=0xd7 | 0x10..=0x13 | 0x16 | 0x17))
        || (b(3) == 0xff && matches!(b(2), 0x50..=0x53 | 0x55..=0x57))
        || (b(6) == 0xff && matches!(b(5), 0x90..=0x93 | 0x95..=0x97));
    if indirect {
        Call::Indirect
    } else {
        Call::None
    }
}

/// The 8 bytes of code before `ret`, read through `stack` (8-byte aligned reads).
fn code_before(stack: &mut StackReader, ret: u64) -> Option<[u8; 8]> {
    let first = ret.checked_sub(8)?;
    let base = first & !7;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&stack.read(base)?.to_le_bytes());
    if ret > base + 8 {
        bytes[8..].copy_from_slice(&stack.read(base + 8)?.to_le_bytes());
    }
    let at = (first - base) as usize;
    bytes[at..at + 8].try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::eh_frame_hdr::tests::header;

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

    #[test]
    fn an_indirect_call_is_taken_when_the_record_above_proves_its_caller() {
        let _fd = crate::unwind::safe_read::for_tests();
        // "Code": C at +0 calls through a register (ending at +12); D at +32 calls C directly
        // (ending at +45) and, earlier, something through a register (ending at +62).
        let mut code = vec![0u8; 128];
        let code_base = code.as_ptr() as u64;
        code[10..12].copy_from_slice(&[0xff, 0xd3]);
        code[40] = DIRECT_CALL;
        let rel = code_base as i64 - (code_base + 45) as i64;
        code[41..45].copy_from_slice(&(rel as i32).to_le_bytes());
        code[61] = 0xd0;
        code[60] = 0xff;
        let (ret_c, ret_d, stale_ret) = (code_base + 12, code_base + 45, code_base + 62);
        let function = code_base + 0x10000;
        let mut starts = FunctionStarts::default();
        starts.add(
            code_base..code_base + 128,
            code_base,
            header(code_base, &[code_base, code_base + 32]),
        );
        starts.add(function..function + 0x1000, function, header(function, &[function]));
        let mut stack = vec![0u64; 32];
        let sp = stack.as_ptr() as u64;
        let c_record = sp + 8 * 10;
        // A stale record of D's indirect call: the record above it proves C, not D.
        stack[2] = c_record;
        stack[3] = stale_ret;
        // The function's record: called from C through a register; C called by D directly.
        stack[6] = c_record;
        stack[7] = ret_c;
        stack[11] = ret_d;
        let is_code = |a: u64| (code_base..code_base + 128).contains(&a);
        let mut window = vec![0u64; 64];
        let mut reader = StackReader::new(sp, None, &mut window);
        assert_eq!(
            find(&starts, function + 0x20, sp, &mut reader, is_code),
            Some((sp + 8 * 6 + 16, ret_c, c_record))
        );
        // Without the proof above it, the indirect call's record is not taken.
        stack[11] = stale_ret;
        let mut reader = StackReader::new(sp, None, &mut window);
        assert_eq!(find(&starts, function + 0x20, sp, &mut reader, is_code), None);
        drop((code, stack));
    }

    #[test]
    fn calls_are_decoded_from_the_bytes_before_the_return_address() {
        let _fd = crate::unwind::safe_read::for_tests();
        let slot = vec![0x1234_5678u64];
        let mut code = vec![0x90u8; 64];
        let base = code.as_ptr() as u64;
        // call *rel32(%rip) through `slot`, ending at +16.
        code[10..12].copy_from_slice(&[0xff, 0x15]);
        let rel = slot.as_ptr() as i64 - (base + 16) as i64;
        code[12..16].copy_from_slice(&(rel as i32).to_le_bytes());
        // call *0x18(%rax), ending at +27; call *%r11 with its REX prefix, ending at +35.
        code[24..27].copy_from_slice(&[0xff, 0x50, 0x18]);
        code[32..35].copy_from_slice(&[0x41, 0xff, 0xd3]);
        let mut window = vec![0u64; 64];
        let mut reader = StackReader::new(base, None, &mut window);
        assert_eq!(call_before(&mut reader, base + 16), Call::Direct(0x1234_5678));
        assert_eq!(call_before(&mut reader, base + 27), Call::Indirect);
        assert_eq!(call_before(&mut reader, base + 35), Call::Indirect);
        assert_eq!(call_before(&mut reader, base + 48), Call::None, "nops");
        drop((code, slot));
    }
}
