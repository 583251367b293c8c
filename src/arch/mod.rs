//! Everything that differs between processor architectures, one module per architecture (as
//! framehop does): the registers a walk starts from and where the signal's ucontext keeps them,
//! the thread pointer, the switch to the handler's private walk stack, the layout of the
//! siginfo fields the handler reads, return addresses as stored on the stack (pointer
//! authentication), the frame-pointer walk's first step, and framehop's unwinder for DWARF.
//! Code in these modules runs in signal context: no allocation, locks or panics.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::*;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

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
