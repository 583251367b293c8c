//! Serves "requests" on THREADS threads, each labelled `endpoint` = `/a` (7 units of work) or
//! `/b` (3 units) through the custom-labels crate only, for SECONDS of CPU time per thread.
//! Every label switch goes through `custom_labels::with_label`, which allocates, copies and
//! frees the strings, as real users' code does. Prints the requests served.
//!
//! usage: custom-labels-user SECONDS THREADS

use std::hint::black_box;
use std::time::Duration;

/// One unit of work: about 25 µs of arithmetic in one function, whichever endpoint it serves.
#[inline(never)]
fn handle(units: u32) -> u64 {
    let mut x = 0u64;
    for i in 0..units * 12_000 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(u64::from(i)));
    }
    x
}

/// The calling thread's CPU time as of its last tick or switch (`getrusage(RUSAGE_THREAD)`),
/// which does not bring it up to date: reading the thread's CPU clock would, and the scheduler
/// would then preempt the loop at its round boundaries, which tick-driven timers sample
/// unevenly (tests/c/cpu_deadline.h).
fn thread_cpu() -> Duration {
    let mut usage = [0i64; 18];
    // SAFETY: struct rusage is 144 bytes on 64-bit Linux; RUSAGE_THREAD is 1.
    unsafe { getrusage(1, usage.as_mut_ptr()) };
    let micros = (usage[0] + usage[2]) * 1_000_000 + usage[1] + usage[3];
    Duration::from_micros(micros as u64)
}

extern "C" {
    fn getrusage(who: i32, usage: *mut i64) -> i32;
}

fn serve(seconds: f64) -> u64 {
    let end = thread_cpu() + Duration::from_secs_f64(seconds);
    let mut served = 0;
    while thread_cpu() < end {
        for _ in 0..8 {
            custom_labels::with_label("endpoint", "/a", || black_box(handle(7)));
            custom_labels::with_label("endpoint", "/b", || black_box(handle(3)));
            served += 2;
        }
    }
    served
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let served: u64 = if threads <= 1 {
        serve(seconds)
    } else {
        let workers: Vec<_> = (0..threads).map(|_| std::thread::spawn(move || serve(seconds))).collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    };
    println!("served {served}");
}
