//! Hot-path audit: while a thread is sampled, the signal handler's path makes no system call
//! besides the timer's own, allocates nothing and takes no lock.
//!
//! * Allocations and locks (this file, through the Rust API): a counting global allocator and
//!   cpuprof's per-thread lock counter must not move on a thread burning CPU in code that
//!   neither allocates nor locks, across a window in which hundreds of samples land on it.
//! * System calls (through LD_PRELOAD, under strace): between two markers on such a thread,
//!   the only calls are the signal's `rt_sigreturn` and, for perf events, the
//!   `clock_gettime` of the thread's CPU clock (the sample's weight) and three `ioctl`s (the
//!   event's id, the next interval, re-enabling), exactly that per signal. The program also
//!   interposes malloc, which libcpuprof.so's allocations go through.

mod support;

use cpuprof::{locks_taken_on_this_thread, Profiler, TimerChoice, UnwinderChoice};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use support::*;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct CountingAllocator;

fn count_allocation() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator; the counter is a const thread-local.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_allocation();
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[inline(never)]
fn burn(iterations: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the calling thread's CPU clock into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Allocations and locks on a thread across a window of sampling, and the samples taken in it.
fn audit_window(timer: TimerChoice, unwinder: UnwinderChoice) -> (u64, u64, u64) {
    let dir = scratch_dir("hot_path_rust");
    let guard = Profiler::builder()
        .frequency(1000)
        .timer(timer)
        .unwinder(unwinder)
        .start(dir.join(format!("{timer:?}-{unwinder:?}.prof")))
        .unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let worker = {
        let barrier = barrier.clone();
        std::thread::spawn(move || {
            // Long enough for the writer thread to arm this thread and learn its stack.
            let warm_until = thread_cpu_seconds() + 0.2;
            while thread_cpu_seconds() < warm_until {
                burn(1_000_000);
            }
            barrier.wait();
            let (allocations, locks) = (ALLOCATIONS.with(Cell::get), locks_taken_on_this_thread());
            burn(400_000_000);
            let deltas = (
                ALLOCATIONS.with(Cell::get) - allocations,
                locks_taken_on_this_thread() - locks,
            );
            barrier.wait();
            deltas
        })
    };
    barrier.wait();
    let before = guard.samples();
    barrier.wait();
    let samples = guard.samples() - before;
    let (allocations, locks) = worker.join().unwrap();
    guard.stop().unwrap();
    (allocations, locks, samples)
}

#[test]
fn handler_path_allocates_nothing_and_takes_no_lock() {
    for (timer, unwinder) in [
        (TimerChoice::Perf, UnwinderChoice::Auto),
        (TimerChoice::Perf, UnwinderChoice::FramePointer),
        (TimerChoice::Thread, UnwinderChoice::Auto),
        (TimerChoice::Itimer, UnwinderChoice::Auto),
    ] {
        let (allocations, locks, samples) = audit_window(timer, unwinder);
        let what = format!("{timer:?}/{unwinder:?}: {samples} samples in the window");
        assert!(samples >= 50, "{what}: too few to audit");
        assert_eq!(allocations, 0, "{what}: the sampled thread allocated");
        assert_eq!(locks, 0, "{what}: the sampled thread took cpuprof locks");
    }
}

/// System calls of thread `tid` between its two `getppid` markers in an `strace -f` log, by
/// name, with the signals delivered to it counted under "signal".
fn calls_in_window(trace: &str, tid: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    let mut inside = false;
    for line in trace.lines() {
        let Some(rest) = line.strip_prefix(tid).and_then(|r| r.strip_prefix(' ')) else {
            continue;
        };
        let rest = rest.trim_start();
        let name = if rest.starts_with("--- SIG") {
            "signal".to_string()
        } else if rest.starts_with("<... ") {
            continue; // the second half of a call strace split; counted at its start
        } else {
            rest.split('(').next().unwrap_or("").to_string()
        };
        if name == "getppid" {
            if inside {
                return calls;
            }
            inside = true;
        } else if inside {
            *calls.entry(name).or_insert(0) += 1;
        }
    }
    panic!("no complete getppid window for thread {tid} in the trace");
}

#[test]
fn handler_path_makes_only_the_timers_system_calls() {
    if !require_tools(&["strace"]) {
        return;
    }
    let dir = scratch_dir("hot_path_strace");
    let prog = compile_c(
        &dir,
        "hot_path.c",
        "hot_path",
        &["-O2", "-fno-omit-frame-pointer"],
        false,
    );
    for (timer, unwinder, timer_calls) in [
        ("perf", "auto", &[("clock_gettime", 1), ("ioctl", 3)][..]),
        ("perf", "fp", &[("clock_gettime", 1), ("ioctl", 3)][..]),
        ("thread", "auto", &[][..]),
        ("itimer", "auto", &[][..]),
    ] {
        let trace_path = dir.join(format!("{timer}-{unwinder}.strace"));
        let profile = dir.join(format!("{timer}-{unwinder}.prof"));
        let env = [
            format!("LD_PRELOAD={}", lib().display()),
            format!("CPUPROFILE={}", profile.display()),
            "CPUPROFILE_FREQUENCY=1000".into(),
            format!("CPUPROFILE_TIMER={timer}"),
            format!("CPUPROFILE_UNWINDER={unwinder}"),
        ];
        let mut args: Vec<String> = vec!["-f".into(), "-qq".into(), "-o".into(), trace_path.display().to_string()];
        for e in &env {
            args.extend(["-E".into(), e.clone()]);
        }
        args.extend([prog.display().to_string(), "500000000".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_ok(std::path::Path::new("strace"), &args, &[]);
        let v = values(&out);
        assert_eq!(
            v["allocations"], "0",
            "{timer}/{unwinder}: the sampled thread allocated"
        );
        let calls = calls_in_window(&std::fs::read_to_string(&trace_path).unwrap(), &v["tid"]);
        let what = format!("{timer}/{unwinder}: {calls:?}");
        let signals = calls.get("signal").copied().unwrap_or(0);
        assert!(signals >= 50, "{what}: too few signals to audit");
        let mut expected = BTreeMap::from([("signal".to_string(), signals), ("rt_sigreturn".to_string(), signals)]);
        for (call, per_signal) in timer_calls {
            expected.insert(call.to_string(), per_signal * signals);
        }
        assert_eq!(calls, expected, "{what}");
        read_profile(&profile);
    }
}
