//! The calling thread's heap-sampling countdown, found inline: the thread pointer plus the
//! variable's offset from the GOT, which is what a C compiler emits for an initial-exec TLS
//! variable. The variable is C's (countdown.c): stable Rust can declare neither a foreign
//! thread-local nor its TLS model. A call to a C accessor instead cost a call and a return on
//! every allocation while a heap profile runs.

use cpuprof_core::heap::Countdown;

/// The calling thread's countdown, valid for the thread's life.
#[inline(always)]
pub fn this_thread() -> *mut Countdown {
    let p: *mut Countdown;
    // SAFETY: reads the thread pointer and a GOT slot the dynamic linker filled with the
    // variable's offset in the static TLS block (R_X86_64_TPOFF64); writes only `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + cpuprof_heap_countdown@GOTTPOFF]",
            p = out(reg) p,
            options(pure, readonly, nostack),
        );
    }
    // SAFETY: as above (R_AARCH64_TLS_TPREL64).
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!(
            "mrs {p}, tpidr_el0",
            "adrp {t}, :gottprel:cpuprof_heap_countdown",
            "ldr {t}, [{t}, :gottprel_lo12:cpuprof_heap_countdown]",
            "add {p}, {p}, {t}",
            p = out(reg) p,
            t = out(reg) _,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    p
}
