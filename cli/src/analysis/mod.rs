//! What a profile says, beyond its counts: the statistics of a change (`diff`), a program's
//! epochs over time (`history`), hints of what to optimise (`advise`), callers and callees
//! (`peek`), samples per source line or instruction (`list`) and samples by label (`labels`).

pub mod advise;
pub mod diff;
pub mod gates;
pub mod history;
pub mod labels;
pub mod list;
pub mod peek;
pub mod stats;

/// The kernel tick of this machine: the resolution of the coarse clocks, which advance once a
/// tick (4 ms on a 250 Hz kernel). 4 ms when it cannot be read.
pub fn local_tick_us() -> u64 {
    let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes one timespec into `res`.
    let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0;
    let us = res.tv_sec as u64 * 1_000_000 + res.tv_nsec as u64 / 1000;
    if ok && (100..=100_000).contains(&us) {
        us
    } else {
        4000
    }
}
