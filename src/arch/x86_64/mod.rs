//! x86-64: registers from the ucontext's `gregs`, the thread pointer at `%fs:0`, return
//! addresses stored as they are, frame records `{rbp, return address}`.

pub mod rbx_cfa;

use crate::unwind::StackReader;
use std::ffi::c_void;

/// Registers a walk starts from.
#[derive(Clone, Copy, Debug)]
pub struct Registers {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    /// rbx, which the DWARF walker needs to step through ld.so's lazy-binding stub
    /// ([`rbx_cfa`]); `None` where the caller cannot know it.
    pub rbx: Option<u64>,
}

impl Registers {
    /// PC, SP and frame pointer only (what `/proc/PID/task/TID/syscall` or a test gives).
    pub const fn new(pc: u64, sp: u64, fp: u64) -> Self {
        Registers { pc, sp, fp, rbx: None }
    }
}

/// Registers of the interrupted code. Async-signal-safe.
///
/// # Safety
/// `uc` must be the third argument of an `SA_SIGINFO` handler.
pub unsafe fn interrupted_registers(uc: *const c_void) -> Registers {
    let uc = &*(uc as *const libc::ucontext_t);
    let g = &uc.uc_mcontext.gregs;
    Registers {
        pc: g[libc::REG_RIP as usize] as u64,
        sp: g[libc::REG_RSP as usize] as u64,
        fp: g[libc::REG_RBP as usize] as u64,
        rbx: Some(g[libc::REG_RBX as usize] as u64),
    }
}

/// The registers of the function this is inlined into, as they are where it calls the
/// assembly below: the PC is a return address inside that function, the SP its stack pointer
/// then, and the FP whatever rbp holds (its frame pointer only if it keeps one). Nothing here
/// assumes the caller keeps a frame pointer: code built without `force-frame-pointers` (another
/// `RUSTFLAGS`, a build from outside this workspace) must still be walked safely, which a
/// DWARF walk from this PC and SP does exactly, and a frame-pointer walk does over checked
/// reads.
#[inline(always)]
pub fn calling_registers() -> Registers {
    let mut out = [0u64; 3];
    // SAFETY: the routine writes three u64s through its first argument and touches nothing else
    // (no stack beyond its return address, rbp unchanged).
    unsafe { cpuprof_calling_registers(&mut out) };
    Registers::new(out[0], out[1], out[2])
}

extern "C" {
    fn cpuprof_calling_registers(out: *mut [u64; 3]);
}

// [rdi] = the return address (a PC in the caller), [rdi+8] = the caller's SP once this returns,
// [rdi+16] = rbp as the caller left it. Hidden: each copy of the crate keeps its own.
std::arch::global_asm!(
    ".pushsection .text.cpuprof_calling_registers,\"ax\",@progbits",
    ".globl cpuprof_calling_registers",
    ".hidden cpuprof_calling_registers",
    ".type cpuprof_calling_registers,@function",
    "cpuprof_calling_registers:",
    ".cfi_startproc",
    "mov rax, [rsp]",
    "mov [rdi], rax",
    "lea rax, [rsp + 8]",
    "mov [rdi + 8], rax",
    "mov [rdi + 16], rbp",
    "ret",
    ".cfi_endproc",
    ".size cpuprof_calling_registers, .-cpuprof_calling_registers",
    ".popsection",
);

/// The calling thread's thread pointer, which glibc also returns as `pthread_self()`.
/// Async-signal-safe: one instruction.
#[inline(always)]
pub fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer that the x86-64 TLS ABI keeps at %fs:0.
    unsafe { std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Where a thread's static TLS blocks lie, given its thread pointer and the static TLS size
/// (`_dl_get_tls_static_info`): below the thread pointer (TLS variant II).
pub fn static_tls(tp: u64, size: u64) -> std::ops::Range<u64> {
    tp.saturating_sub(size)..tp
}

// The calling thread's label set (`crate::labels`): four bytes of initial-exec TLS. Defined
// here because stable Rust can choose neither a thread-local's TLS model nor keep a
// `thread_local!` in a shared object from going through `__tls_get_addr`, which may allocate
// the first time a thread touches the block (in a signal handler, that can deadlock). Hidden:
// each copy of the crate keeps its own.
std::arch::global_asm!(
    ".pushsection .tbss.cpuprof_thread_labels,\"awT\",@nobits",
    ".globl cpuprof_thread_labels",
    ".hidden cpuprof_thread_labels",
    ".type cpuprof_thread_labels,@object",
    ".p2align 2",
    "cpuprof_thread_labels:",
    ".zero 4",
    ".size cpuprof_thread_labels, 4",
    ".popsection",
);

/// The calling thread's address of `$symbol`, a hidden initial-exec TLS variable of this
/// object: the thread pointer plus the variable's offset, from the GOT slot the dynamic linker
/// filled (R_X86_64_TPOFF64) — the sequence a C compiler emits. Async-signal-safe: no call,
/// nothing allocated. For variables stable Rust cannot declare (`thread_labels`, the heap
/// profile's countdown in libcpuprof.so).
#[doc(hidden)]
#[macro_export]
macro_rules! initial_exec_address {
    ($symbol:literal) => {{
        let p: usize;
        // SAFETY: reads the thread pointer and a GOT slot; writes only `p`.
        unsafe {
            ::std::arch::asm!(
                "mov {p}, qword ptr fs:[0]",
                concat!("add {p}, qword ptr [rip + ", $symbol, "@GOTTPOFF]"),
                p = out(reg) p,
                options(pure, readonly, nostack),
            );
        }
        p
    }};
}

/// The calling thread's label-set slot. Async-signal-safe: two instructions, no call.
#[inline(always)]
pub fn thread_labels() -> *const std::sync::atomic::AtomicU32 {
    crate::initial_exec_address!("cpuprof_thread_labels") as *const std::sync::atomic::AtomicU32
}

/// The stack pointer where this is inlined.
#[inline(always)]
pub fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: copies the stack pointer register.
    unsafe { std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}

/// Calls `f(arg)` with the stack pointer at `top` (16-byte aligned, the top of a stack of ours),
/// and returns on the caller's stack. Async-signal-safe.
///
/// # Safety
/// `top` must be the 16-byte aligned top of writable memory large enough for `f`.
#[inline(always)]
pub unsafe fn call_on_stack(top: usize, f: extern "C" fn(*mut c_void), arg: *mut c_void) {
    // Switches rsp to `top`, calls the C-ABI function (rsp % 16 == 0 before `call`, as the ABI
    // requires), and restores rsp from r12, which the callee preserves. The compiler saves r12
    // for us (declared clobbered).
    std::arch::asm!(
        "mov r12, rsp",
        "mov rsp, {top}",
        "call {f}",
        "mov rsp, r12",
        top = in(reg) top,
        f = in(reg) f,
        in("rdi") arg,
        out("r12") _,
        clobber_abi("C"),
    );
}

/// A return address as stored in a frame: x86-64 stores it as it is.
#[inline(always)]
pub fn return_address(stored: u64) -> u64 {
    stored
}

/// The caller of an interrupted function that has not pushed its frame: on x86-64 its return
/// address is on the stack at an offset only DWARF knows, so a frame-pointer walk cannot see it.
#[inline(always)]
pub fn frameless_leaf_caller(_regs: &Registers, _stack: &mut StackReader) -> Option<u64> {
    None
}

/// framehop's unwinder, its cache and register set for this architecture.
pub mod dwarf {
    pub use framehop::x86_64::{CacheX86_64 as Cache, UnwindRegsX86_64 as UnwindRegs, UnwinderX86_64 as Unwinder};

    /// The registers framehop starts a walk from.
    #[inline(always)]
    pub fn unwind_regs(regs: &super::Registers, _max_code_address: u64) -> UnwindRegs {
        UnwindRegs::new(regs.pc, regs.sp, regs.fp)
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
    fn thread_pointer_is_pthread_self() {
        assert_eq!(thread_pointer(), unsafe { libc::pthread_self() } as u64);
    }
}
