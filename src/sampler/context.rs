//! Reading registers: the interrupted thread's from the signal handler's ucontext, and the
//! calling function's own, for walks that start outside a handler.

use crate::unwind::Registers;

/// Registers of the interrupted code. Async-signal-safe.
///
/// # Safety
/// `uc` must be the third argument of an `SA_SIGINFO` handler.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub unsafe fn interrupted_registers(uc: *const libc::c_void) -> Registers {
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
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub fn calling_registers() -> Registers {
    let mut out = [0u64; 3];
    // SAFETY: the routine writes three u64s through its first argument and touches nothing else
    // (no stack beyond its return address, rbp unchanged).
    unsafe { cpuprof_calling_registers(&mut out) };
    Registers {
        pc: out[0],
        sp: out[1],
        fp: out[2],
        rbx: None,
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
extern "C" {
    fn cpuprof_calling_registers(out: *mut [u64; 3]);
}

// [rdi] = the return address (a PC in the caller), [rdi+8] = the caller's SP once this returns,
// [rdi+16] = rbp as the caller left it. Hidden: each copy of the crate keeps its own.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
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

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("cpuprof supports x86-64 Linux only for now");
