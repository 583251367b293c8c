//! Threads taking one mutex in turn, each holding it asleep, timing their own waits: the Rust
//! known answers of tests/contention.rs.
//!
//! `contention_mutex THREADS SECONDS HOLD_US` takes a `std::sync::Mutex`: run it under
//! `LD_PRELOAD=libcpuprof.so CPUPROFILE_CONTENTION=...` (std's mutex blocks in
//! `syscall(SYS_futex, ...)`, which the library times). `contention_mutex THREADS SECONDS
//! HOLD_US FILE` takes a `cpuprof::contention::Mutex` instead, with no preloading: the program
//! starts the contention profile itself and writes it to FILE. Either prints `waited_ns N` (the
//! time all threads spent in `lock()`).

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// Takes the std lock, returning the guard and how long it waited.
#[inline(never)]
fn take_std_mutex(lock: &std::sync::Mutex<u64>) -> (MutexGuard<'_, u64>, Duration) {
    let start = Instant::now();
    let guard = lock.lock().unwrap();
    (guard, start.elapsed())
}

/// Takes the profiled lock, returning the guard and how long it waited.
#[inline(never)]
fn take_cpuprof_mutex(lock: &cpuprof::contention::Mutex<u64>) -> (MutexGuard<'_, u64>, Duration) {
    let start = Instant::now();
    let guard = lock.lock().unwrap();
    (guard, start.elapsed())
}

/// `threads` threads taking a lock with `take` until `seconds` have passed, each holding it
/// `hold` asleep; the time they waited in all.
fn contend<'a>(
    threads: usize,
    seconds: f64,
    hold: Duration,
    take: &(dyn Fn() -> (MutexGuard<'a, u64>, Duration) + Sync),
) -> Duration {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut waited = Duration::ZERO;
                    while Instant::now() < end {
                        let (mut guard, w) = take();
                        waited += w;
                        *guard += 1;
                        std::thread::sleep(hold);
                    }
                    waited
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    })
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let threads: usize = arg(1, "4").parse().unwrap();
    let seconds: f64 = arg(2, "2").parse().unwrap();
    let hold = Duration::from_micros(arg(3, "1000").parse().unwrap());
    let waited = match args.get(4) {
        None => {
            let lock = std::sync::Mutex::new(0u64);
            contend(threads, seconds, hold, &|| take_std_mutex(&lock))
        }
        Some(file) => {
            let lock = cpuprof::contention::Mutex::new(0u64);
            cpuprof::contention::start(cpuprof::contention::DEFAULT_PERIOD_NS).map_err(std::io::Error::other)?;
            let waited = contend(threads, seconds, hold, &|| take_cpuprof_mutex(&lock));
            cpuprof::contention::stop();
            let profile = cpuprof::contention::current();
            profile.write_text(&mut std::fs::File::create(file)?)?;
            waited
        }
    };
    println!("waited_ns {}", waited.as_nanos());
    Ok(())
}
