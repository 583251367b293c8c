//! Reading the interrupted thread's registers from the signal handler's ucontext.

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

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("cpuprof supports x86-64 Linux only for now");
