//! Threads taking one `std::sync::Mutex` in turn, each holding it asleep, timing their own
//! waits: the Rust known answer of tests/contention.rs (run under `LD_PRELOAD=libcpuprof.so
//! CPUPROFILE_CONTENTION=...`: std's mutex blocks in `syscall(SYS_futex, ...)`, which the
//! library times).
//!
//! `contention_mutex THREADS SECONDS HOLD_US` prints `waited_ns N` (the time all threads
//! spent in `lock()`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Takes the lock, returning the guard and how long it waited.
#[inline(never)]
fn take_std_mutex(lock: &Mutex<u64>) -> (std::sync::MutexGuard<'_, u64>, Duration) {
    let start = Instant::now();
    let guard = lock.lock().unwrap();
    (guard, start.elapsed())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let threads: usize = arg(1, "4").parse().unwrap();
    let seconds: f64 = arg(2, "2").parse().unwrap();
    let hold = Duration::from_micros(arg(3, "1000").parse().unwrap());
    let lock = Mutex::new(0u64);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let waited: Duration = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut waited = Duration::ZERO;
                    while Instant::now() < end {
                        let (mut guard, w) = take_std_mutex(&lock);
                        waited += w;
                        *guard += 1;
                        std::thread::sleep(hold);
                    }
                    waited
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    println!("waited_ns {}", waited.as_nanos());
}
