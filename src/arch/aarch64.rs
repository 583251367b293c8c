//! aarch64: registers from the ucontext's `regs` (FP = x29, LR = x30), the thread pointer in
//! `tpidr_el0`, frame records `{x29, x30}` at the frame pointer, return addresses that may
//! carry pointer-authentication bits, and a leaf function's caller in LR.

use crate::unwind::safe_read::{copy_words, readable};
use crate::unwind::StackReader;
use std::ffi::c_void;

/// Registers a walk starts from.
#[derive(Clone, Copy, Debug)]
pub struct Registers {
    pub pc: u64,
    pub sp: u64,
    /// x29.
    pub fp: u64,
    /// x30, the link register: the return address until a function saves it in its frame
    /// record; `None` where the caller cannot know it.
    pub lr: Option<u64>,
}

impl Registers {
    /// PC, SP and frame pointer only (what `/proc/PID/task/TID/syscall` or a test gives).
    pub const fn new(pc: u64, sp: u64, fp: u64) -> Self {
        Registers { pc, sp, fp, lr: None }
    }
}

/// Registers of the interrupted code. Async-signal-safe.
///
/// # Safety
/// `uc` must be the third argument of an `SA_SIGINFO` handler.
pub unsafe fn interrupted_registers(uc: *const c_void) -> Registers {
    let mc = &(*(uc as *const libc::ucontext_t)).uc_mcontext;
    Registers {
        pc: mc.pc,
        sp: mc.sp,
        fp: mc.regs[29],
        lr: Some(mc.regs[30]),
    }
}

/// The registers of the function this is inlined into, as they are where it calls the
/// assembly below: the PC is the return address inside that function (from x30), the SP its
/// stack pointer (a call pushes nothing on aarch64), and the FP whatever x29 holds. LR is left
/// unknown: the caller has saved its own return address, having made a call.
#[inline(always)]
pub fn calling_registers() -> Registers {
    let mut out = [0u64; 3];
    // SAFETY: the routine writes three u64s through its first argument and touches nothing else
    // (no stack, x29 unchanged; x9 is a scratch register of the C ABI).
    unsafe { cpuprof_calling_registers(&mut out) };
    Registers::new(out[0], out[1], out[2])
}

extern "C" {
    fn cpuprof_calling_registers(out: *mut [u64; 3]);
}

// [x0] = x30 (a PC in the caller), [x0+8] = sp, [x0+16] = x29 as the caller left it. Hidden:
// each copy of the crate keeps its own.
std::arch::global_asm!(
    ".pushsection .text.cpuprof_calling_registers,\"ax\",@progbits",
    ".globl cpuprof_calling_registers",
    ".hidden cpuprof_calling_registers",
    ".type cpuprof_calling_registers,@function",
    "cpuprof_calling_registers:",
    ".cfi_startproc",
    "str x30, [x0]",
    "mov x9, sp",
    "str x9, [x0, #8]",
    "str x29, [x0, #16]",
    "ret",
    ".cfi_endproc",
    ".size cpuprof_calling_registers, .-cpuprof_calling_registers",
    ".popsection",
);

/// The calling thread's thread pointer (`tpidr_el0`). glibc's `struct pthread` lies just below
/// it (TLS variant I), in the same mapping: on a glibc thread stack, `[stack, thread pointer)`
/// is mapped as on x86-64. Async-signal-safe: one instruction.
#[inline(always)]
pub fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the EL0 thread ID register.
    unsafe { std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags)) };
    tp
}

/// Where a thread's static TLS blocks lie, given its thread pointer and the static TLS size
/// (`_dl_get_tls_static_info`): above the thread pointer (TLS variant I).
pub fn static_tls(tp: u64, size: u64) -> std::ops::Range<u64> {
    tp..tp.saturating_add(size)
}

// The calling thread's label set (`crate::labels`), as on x86-64 (see there why in assembly).
std::arch::global_asm!(
    ".pushsection .tbss.cpuprof_thread_labels,\"awT\",%nobits",
    ".globl cpuprof_thread_labels",
    ".hidden cpuprof_thread_labels",
    ".type cpuprof_thread_labels,%object",
    ".p2align 2",
    "cpuprof_thread_labels:",
    ".zero 4",
    ".size cpuprof_thread_labels, 4",
    ".popsection",
);

/// The calling thread's address of `$symbol`, a hidden initial-exec TLS variable of this
/// object: `tpidr_el0` plus the variable's offset, from the GOT slot the dynamic linker filled
/// (R_AARCH64_TLS_TPREL64), as on x86-64. Async-signal-safe: no call, nothing allocated.
#[doc(hidden)]
#[macro_export]
macro_rules! initial_exec_address {
    ($symbol:literal) => {{
        let p: usize;
        // SAFETY: reads the thread pointer and a GOT slot; writes only `p` and a scratch
        // register.
        unsafe {
            ::std::arch::asm!(
                "mrs {p}, tpidr_el0",
                concat!("adrp {t}, :gottprel:", $symbol),
                concat!("ldr {t}, [{t}, :gottprel_lo12:", $symbol, "]"),
                "add {p}, {p}, {t}",
                p = out(reg) p,
                t = out(reg) _,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        p
    }};
}

/// The calling thread's label-set slot. Async-signal-safe: no call.
#[inline(always)]
pub fn thread_labels() -> *const std::sync::atomic::AtomicU32 {
    crate::initial_exec_address!("cpuprof_thread_labels") as *const std::sync::atomic::AtomicU32
}

/// The stack pointer where this is inlined.
#[inline(always)]
pub fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: copies the stack pointer register.
    unsafe { std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

/// Calls `f(arg)` with the stack pointer at `top` (16-byte aligned, the top of a stack of ours),
/// and returns on the caller's stack. Async-signal-safe.
///
/// # Safety
/// `top` must be the 16-byte aligned top of writable memory large enough for `f`.
#[inline(always)]
pub unsafe fn call_on_stack(top: usize, f: extern "C" fn(*mut c_void), arg: *mut c_void) {
    // Switches sp to `top` (16-byte aligned, as the ABI requires at every instruction that uses
    // sp), calls the C-ABI function, and restores sp from x20, which the callee preserves. The
    // compiler saves x20 for us (declared clobbered); x30 is among clobber_abi("C").
    std::arch::asm!(
        "mov x20, sp",
        "mov sp, {top}",
        "blr {f}",
        "mov sp, x20",
        top = in(reg) top,
        f = in(reg) f,
        in("x0") arg,
        out("x20") _,
        clobber_abi("C"),
    );
}

/// A return address as stored in a frame record or LR, its pointer-authentication code (if
/// the code was built with `-mbranch-protection=pac-ret` and the CPU signs) stripped by
/// `xpaclri`, which sits in the hint space: a no-op on CPUs without pointer authentication,
/// where no address carries such bits.
#[inline(always)]
pub fn return_address(stored: u64) -> u64 {
    let mut lr = stored;
    // SAFETY: xpaclri (hint #7) only rewrites x30.
    unsafe { std::arch::asm!("hint #7", inout("x30") lr, options(nomem, nostack, preserves_flags)) };
    lr
}

/// The caller of an interrupted function that has no frame record yet (a leaf, which gcc
/// builds without one even with `-fno-omit-frame-pointer`, or a function in its prologue or
/// epilogue): its return address is still in LR, while x29 is its caller's frame, whose record
/// holds the caller's own return address. A frame-pointer walk would skip the caller.
///
/// LR is the caller only if the interrupted function has not called anything since its frame
/// was made, which the stack cannot tell: a function with a frame that called another and got
/// its LR back looks the same. So the code decides, where a direct `bl` made the calls: LR is
/// taken when the instruction before it is `bl T` with T at or below PC, LR not in [T, PC],
/// and the frame record's return address (unless it is LR itself: then the function's frame
/// is made) was not made by a `bl` to an entry between T and PC: the interrupted function is
/// then the one T starts, not the owner of the frame record. Calls through the PLT or a
/// function pointer are not followed: the caller is then skipped, as on x86-64.
/// Async-signal-safe: reads code through the kernel (`safe_read`), never faulting.
pub fn frameless_leaf_caller(regs: &Registers, stack: &mut StackReader) -> Option<u64> {
    let lr = return_address(regs.lr?);
    let saved = (regs.fp >= regs.sp && regs.fp % 8 == 0)
        .then(|| stack.read(regs.fp.checked_add(8)?))
        .flatten()
        .map(return_address);
    if saved == Some(lr) || lr < 4096 {
        return None;
    }
    let target = bl_target(lr.checked_sub(4)?)?;
    if target > regs.pc || (target <= lr && lr <= regs.pc) {
        return None;
    }
    if let Some(owner) = saved.and_then(|ret| bl_target(ret.checked_sub(4)?)) {
        if target < owner && owner <= regs.pc {
            return None;
        }
    }
    Some(lr)
}

/// The target of the `bl` instruction at `at`, if it is one.
fn bl_target(at: u64) -> Option<u64> {
    let insn = code_word(at)?;
    if insn & 0xfc00_0000 != 0x9400_0000 {
        return None;
    }
    // imm26, in instructions, sign-extended.
    let offset = (((insn & 0x03ff_ffff) << 6) as i32 >> 6) as i64 * 4;
    at.checked_add_signed(offset)
}

/// The 4-byte instruction at `at`, copied by the kernel. Async-signal-safe.
fn code_word(at: u64) -> Option<u32> {
    if at % 4 != 0 {
        return None;
    }
    let word = at & !7;
    if !readable(word) {
        return None;
    }
    let mut buf = [0u64; 1];
    if copy_words(word, &mut buf) != 1 {
        return None;
    }
    // Little-endian: the lower half is the instruction at the lower address.
    Some((buf[0] >> (8 * (at - word))) as u32)
}

/// framehop's unwinder, its cache and register set for this architecture.
pub mod dwarf {
    use framehop::aarch64::PtrAuthMask;
    pub use framehop::aarch64::{CacheAarch64 as Cache, UnwindRegsAarch64 as UnwindRegs, UnwinderAarch64 as Unwinder};

    /// The registers framehop starts a walk from. framehop strips return addresses with a mask:
    /// the address bits are those of the highest code address, and at least the 48 of Linux's
    /// user address space, above which pointer-authentication codes live.
    #[inline(always)]
    pub fn unwind_regs(regs: &super::Registers, max_code_address: u64) -> UnwindRegs {
        let mask = PtrAuthMask::from_max_known_address(max_code_address.max((1 << 48) - 1));
        UnwindRegs::new_with_ptr_auth_mask(mask, regs.lr.unwrap_or(0), regs.sp, regs.fp)
    }
}

/// This architecture's side of the contract ([`super::Architecture`]): the free functions
/// above, which the crate calls.
pub struct Native;

impl super::Architecture for Native {
    type Registers = Registers;
    type UnwindRegs = dwarf::UnwindRegs;

    #[inline(always)]
    fn registers(pc: u64, sp: u64, fp: u64) -> Registers {
        Registers::new(pc, sp, fp)
    }

    #[inline(always)]
    unsafe fn interrupted_registers(uc: *const c_void) -> Registers {
        interrupted_registers(uc)
    }

    #[inline(always)]
    fn calling_registers() -> Registers {
        calling_registers()
    }

    #[inline(always)]
    fn thread_pointer() -> u64 {
        thread_pointer()
    }

    #[inline(always)]
    fn thread_labels() -> *const std::sync::atomic::AtomicU32 {
        thread_labels()
    }

    #[inline(always)]
    fn current_sp() -> u64 {
        current_sp()
    }

    #[inline(always)]
    unsafe fn call_on_stack(top: usize, f: extern "C" fn(*mut c_void), arg: *mut c_void) {
        call_on_stack(top, f, arg)
    }

    #[inline(always)]
    fn return_address(stored: u64) -> u64 {
        return_address(stored)
    }

    #[inline(always)]
    fn frameless_leaf_caller(regs: &Registers, stack: &mut StackReader) -> Option<u64> {
        frameless_leaf_caller(regs, stack)
    }

    #[inline(always)]
    fn unwind_regs(regs: &Registers, max_code_address: u64) -> dwarf::UnwindRegs {
        dwarf::unwind_regs(regs, max_code_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_pointer_is_just_above_pthread_self() {
        let tp = thread_pointer();
        let this = unsafe { libc::pthread_self() } as u64;
        assert!(this < tp && tp - this <= 4096, "tp {tp:#x}, pthread_self {this:#x}");
    }

    #[test]
    fn return_addresses_keep_their_address_bits() {
        let here = return_addresses_keep_their_address_bits as *const () as u64;
        assert_eq!(return_address(here), here);
    }

    #[test]
    fn bl_targets_are_decoded() {
        // bl +8, bl -4, and an add (not a bl).
        let code: [u32; 3] = [0x9400_0002, 0x97ff_ffff, 0x9100_0400];
        let at = code.as_ptr() as u64;
        let _fd = crate::unwind::safe_read::for_tests();
        assert_eq!(bl_target(at), Some(at + 8));
        assert_eq!(bl_target(at + 4), Some(at));
        assert_eq!(bl_target(at + 8), None);
    }
}
