//! Threads taking one mutex in turn, each holding it asleep, timing their own waits: the Rust
//! known answers of tests/contention.rs.
//!
//! `contention_mutex THREADS SECONDS HOLD_US` takes a `std::sync::Mutex`: run it under
//! `LD_PRELOAD=libcpuprof.so CPUPROFILE_CONTENTION=...` (std's mutex blocks in
//! `syscall(SYS_futex, ...)`, which the library times). `contention_mutex THREADS SECONDS
//! HOLD_US FILE` takes a `cpuprof::contention::Mutex` instead, with no preloading: the program
//! starts the contention profile itself and writes it to FILE and FILE.holders. Either prints
//! `waited_ns N` (the time all threads spent in `lock()`) and `handoff_ns N` (of that, the time
//! from a release, in `release_lock`, to the waiter's return: what the holders' view charges to
//! no holder).

use std::ops::DerefMut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Nanoseconds since the program started.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// When the lock was last given back ([`now_ns`]).
static RELEASED_AT: AtomicU64 = AtomicU64::new(0);

/// A wait: how long, and of that the hand-off since the lock's release.
#[derive(Clone, Copy, Default)]
struct Wait {
    waited: Duration,
    handoff: Duration,
}

/// The wait that started at `start` (ns) and has just got the lock.
fn wait_since(start: u64) -> Wait {
    let acquired = now_ns();
    let waited = acquired - start;
    let handoff = acquired.saturating_sub(RELEASED_AT.load(Ordering::Relaxed));
    Wait {
        waited: Duration::from_nanos(waited),
        handoff: Duration::from_nanos(if waited > 1000 && handoff < waited { handoff } else { 0 }),
    }
}

/// Takes the std lock, returning the guard and its wait.
#[inline(never)]
fn take_std_mutex(lock: &std::sync::Mutex<u64>) -> (MutexGuard<'_, u64>, Wait) {
    let start = now_ns();
    let guard = lock.lock().unwrap();
    (guard, wait_since(start))
}

/// Takes the profiled lock, returning the guard and its wait.
#[inline(never)]
fn take_cpuprof_mutex(lock: &cpuprof::contention::Mutex<u64>) -> (cpuprof::contention::MutexGuard<'_, u64>, Wait) {
    let start = now_ns();
    let guard = lock.lock().unwrap();
    (guard, wait_since(start))
}

/// Gives the lock back: the holders' chain (the holder's view).
#[inline(never)]
fn release_lock(guard: impl DerefMut<Target = u64>) {
    RELEASED_AT.store(now_ns(), Ordering::Relaxed);
    drop(guard);
    // Not a tail call: this frame stays on the chain.
    std::hint::black_box(());
}

/// `threads` threads taking a lock with `take` until `seconds` have passed, each holding it
/// `hold` asleep; the time they waited in all, and its hand-offs.
fn contend<G: DerefMut<Target = u64>>(
    threads: usize,
    seconds: f64,
    hold: Duration,
    take: &(dyn Fn() -> (G, Wait) + Sync),
) -> Wait {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut all = Wait::default();
                    while Instant::now() < end {
                        let (mut guard, w) = take();
                        all.waited += w.waited;
                        all.handoff += w.handoff;
                        *guard += 1;
                        std::thread::sleep(hold);
                        release_lock(guard);
                    }
                    all
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold(Wait::default(), |a, w| Wait {
                waited: a.waited + w.waited,
                handoff: a.handoff + w.handoff,
            })
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
            // FILE, the waiters' view, and FILE.holders, as the library writes them.
            for (view, path) in [
                (cpuprof::contention::View::Waiters, file.clone()),
                (cpuprof::contention::View::Holders, format!("{file}.holders")),
            ] {
                let profile = cpuprof::contention::current(view);
                profile.write_text(&mut std::fs::File::create(path)?)?;
            }
            waited
        }
    };
    println!(
        "waited_ns {}\nhandoff_ns {}",
        waited.waited.as_nanos(),
        waited.handoff.as_nanos()
    );
    Ok(())
}
