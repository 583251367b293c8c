//! Everything that differs between processor architectures, one module per architecture (as
//! framehop does): the registers a walk starts from and where the signal's ucontext keeps them,
//! the thread pointer and the thread's label-set slot, the switch to the handler's private
//! walk stack, the layout of the siginfo fields the handler reads, return addresses as stored
//! on the stack (pointer authentication), the frame-pointer walk's first step, and framehop's
//! unwinder for DWARF.
//! Code in these modules runs in signal context: no allocation, locks or panics.
//!
//! The contract is [`Architecture`]: each module implements it for its `Native`, so a module
//! that lacks an item, or gives one another signature, fails to compile on its target (the
//! aarch64 cross build checks the other one). The rest of the crate calls the module's free
//! functions, re-exported here, which the implementation delegates to: the contract costs the
//! signal handler nothing. What only one architecture needs lives under its module
//! (`x86_64::rbx_cfa`: ld.so's frames whose CFA is computed from rbx).

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::*;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

use crate::unwind::StackReader;
use std::ffi::c_void;

/// What every architecture module provides (see the module's documentation). Implemented by
/// each module's `Native`, delegating to the module's free functions of the same names.
pub trait Architecture {
    /// Registers a walk starts from: `pc`, `sp`, `fp` (public fields), and what else the
    /// architecture's walk uses.
    type Registers: Copy + std::fmt::Debug;
    /// framehop's register set for this architecture (`dwarf::UnwindRegs`).
    type UnwindRegs;

    /// `Registers::new`: PC, SP and frame pointer only (what `/proc/PID/task/TID/syscall` or a
    /// test gives).
    fn registers(pc: u64, sp: u64, fp: u64) -> Self::Registers;

    /// Registers of the interrupted code. Async-signal-safe.
    ///
    /// # Safety
    /// `uc` must be the third argument of an `SA_SIGINFO` handler.
    unsafe fn interrupted_registers(uc: *const c_void) -> Self::Registers;

    /// The registers of the function this is inlined into, where it calls in.
    fn calling_registers() -> Self::Registers;

    /// The calling thread's thread pointer (glibc's `pthread_self()` is near it).
    /// Async-signal-safe.
    fn thread_pointer() -> u64;

    /// The calling thread's label-set slot (`crate::labels`), in initial-exec TLS: never
    /// allocated on first use. Async-signal-safe.
    fn thread_labels() -> *const std::sync::atomic::AtomicU32;

    /// The stack pointer where this is inlined.
    fn current_sp() -> u64;

    /// Calls `f(arg)` with the stack pointer at `top`, and returns on the caller's stack.
    /// Async-signal-safe.
    ///
    /// # Safety
    /// `top` must be the 16-byte aligned top of writable memory large enough for `f`.
    unsafe fn call_on_stack(top: usize, f: extern "C" fn(*mut c_void), arg: *mut c_void);

    /// A return address as stored in a frame record (or link register), as a code address.
    fn return_address(stored: u64) -> u64;

    /// The caller of an interrupted function that has no frame record yet, where the
    /// architecture can tell it (a link register); `None` otherwise.
    fn frameless_leaf_caller(regs: &Self::Registers, stack: &mut StackReader) -> Option<u64>;

    /// The registers framehop starts a walk from (`dwarf::unwind_regs`).
    fn unwind_regs(regs: &Self::Registers, max_code_address: u64) -> Self::UnwindRegs;
}

/// The architecture this is built for must meet the contract with the very types the crate uses
/// through the re-exports above.
const _: fn() = meets_the_contract::<Native>;

fn meets_the_contract<A: Architecture<Registers = Registers, UnwindRegs = dwarf::UnwindRegs>>() {}

#[cfg(not(all(any(target_arch = "x86_64", target_arch = "aarch64"), target_os = "linux")))]
compile_error!("cpuprof supports x86-64 and aarch64 Linux only");

/// The parts of `siginfo_t` the handler reads, in the generic layout of 64-bit Linux (the same
/// on x86-64 and aarch64): the union after the three ints, 8-byte aligned, holds
/// `si_tid, si_overrun` for POSIX timers and `si_band, si_fd` for SIGPOLL codes.
#[repr(C)]
pub struct SigInfoFields {
    pub signo: std::ffi::c_int,
    pub errno: std::ffi::c_int,
    pub code: std::ffi::c_int,
    _pad: std::ffi::c_int,
    pub timer_id: std::ffi::c_int,
    pub timer_overrun: std::ffi::c_int,
    pub poll_fd: std::ffi::c_int,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler reads `si_code`, `si_overrun` and `si_fd` through [`SigInfoFields`]: the union
    /// must start where the kernel writes it. A thread-directed `tgkill` makes the kernel fill
    /// `si_pid` and `si_uid`, the union's first two ints, as it fills `si_tid, si_overrun`.
    #[test]
    fn siginfo_fields_are_where_the_kernel_writes_them() {
        // SAFETY: SIGUSR2 is blocked on this thread before it is sent here, then taken off the
        // queue with sigtimedwait, so no handler or default action ever sees it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let pid = libc::getpid();
            libc::syscall(libc::SYS_tgkill, pid, libc::gettid(), libc::SIGUSR2);
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let timeout = libc::timespec { tv_sec: 5, tv_nsec: 0 };
            assert_eq!(libc::sigtimedwait(&set, &mut info, &timeout), libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            let fields = &*(&info as *const libc::siginfo_t as *const SigInfoFields);
            assert_eq!(fields.signo, libc::SIGUSR2);
            // SI_TKILL, or SI_USER on kernels that report tgkill as kill.
            assert!(
                [libc::SI_TKILL, libc::SI_USER].contains(&fields.code),
                "si_code {}",
                fields.code
            );
            assert_eq!(fields.timer_id, pid, "union's first int (si_pid / si_tid)");
            assert_eq!(
                fields.timer_overrun as u32,
                libc::getuid(),
                "second int (si_uid / si_overrun)"
            );
        }
        assert_eq!(
            std::mem::offset_of!(SigInfoFields, poll_fd),
            24,
            "si_fd after the 8-byte si_band"
        );
    }
}
