//! The Rust front end in-process: the guard, exact bytes of an empty profile, the known
//! answer, and errors. Profiling is process-wide, so these tests take turns.

mod support;

use cpuprof::format::{Maps, Profile, SlotFormat};
use cpuprof::Profiler;
use std::hint::black_box;
use std::sync::Mutex;
use support::*;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[inline(always)]
fn burn(n: u64) -> u64 {
    let mut x = n;
    for i in 0..n {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
fn hot_a(n: u64) -> u64 {
    burn(3 * n)
}

#[inline(never)]
fn hot_b(n: u64) -> u64 {
    burn(n)
}

fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[test]
fn empty_profile_is_exactly_header_trailer_and_maps() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = scratch_dir("empty").join("empty.prof");
    let guard = Profiler::builder().report_on_stderr(false).start(&path).unwrap();
    let report = guard.stop().unwrap();
    assert_eq!(report.interrupts, 0);
    let bytes = std::fs::read(&path).unwrap();
    let mut expected = Vec::new();
    for slot in [0, 3, 0, 10000, 0, 0, 1, 0] {
        SlotFormat::NATIVE.put(slot, &mut expected);
    }
    assert_eq!(&bytes[..64], &expected[..]);
    assert_eq!(report.bytes, bytes.len() as u64);
    let maps_text = std::str::from_utf8(&bytes[64..]).unwrap();
    let maps = Maps::parse(maps_text.as_bytes());
    let build_ids = maps_text.lines().filter(|l| l.starts_with("# build-id ")).count();
    let weights = maps_text.lines().filter(|l| l.starts_with("# signal-weights ")).count();
    assert_eq!(weights, 1, "one signal-weights line");
    let process = maps_text.lines().filter(|l| l.starts_with("# process ")).count();
    assert_eq!(process, 1, "one process line");
    assert_eq!(
        maps.entries.len() + build_ids + weights + process,
        maps_text.lines().count(),
        "every line is a mapping line, a build-id line, the signal-weights or the process line"
    );
    let process = maps.process.expect("the process line reads");
    assert_eq!((process.pid, process.forked), (std::process::id(), false));
    let args: Vec<Vec<u8>> = std::env::args_os()
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .collect();
    assert_eq!(process.args, args);
    assert!(build_ids > 0, "the test binary and libc have build-ids");
    let exe = std::env::current_exe().unwrap();
    assert!(maps
        .entries
        .iter()
        .any(|m| m.is_executable() && m.path == exe.to_str().unwrap()));
}

#[test]
fn guard_known_answer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = scratch_dir("guard").join("guard.prof");
    let cpu_before = process_cpu_seconds();
    {
        let _guard = Profiler::builder()
            .frequency(250)
            .report_on_stderr(false)
            .start(&path)
            .unwrap();
        // Rounds of varying length: a fixed round a whole fraction of the 4 ms tick would be
        // seen at the same point of the round by every sample (aliasing, seen once as 60/39 on
        // a loaded machine), and no number of samples would then average it out.
        let end = process_cpu_seconds() + 3.0;
        let mut round = 1u64;
        while process_cpu_seconds() < end {
            round = round
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = 50_000 + (round >> 33) % 100_000;
            black_box(hot_a(n));
            black_box(hot_b(n));
        }
    }
    let cpu = process_cpu_seconds() - cpu_before;
    let profile = Profile::parse(&std::fs::read(&path).unwrap()).unwrap();
    let sampled = profile.total_samples() as f64 * profile.period_us as f64 / 1e6;
    assert!(
        (sampled - cpu).abs() <= 0.10 * cpu,
        "samples x period = {sampled:.2} s, CPU = {cpu:.2} s"
    );
    assert_three_to_one("cpuprof top", &cpuprof_top(&path), &path);
    let exe = std::env::current_exe().unwrap();
    assert_three_to_one("google-pprof", &google_pprof(&exe, &path), &path);
    assert_three_to_one("go tool pprof", &go_pprof(&exe, &path), &path);
}

#[test]
fn second_start_and_bad_paths_are_errors_naming_the_path() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("errors");
    let err = Profiler::start(dir.join("no/such/dir/x.prof"))
        .err()
        .expect("missing directory");
    assert!(
        err.to_string().contains("no/such/dir/x.prof") && err.to_string().contains("No such file"),
        "{err}"
    );
    let err = Profiler::start(&dir).err().expect("a directory is not a file");
    assert!(err.to_string().contains(dir.to_str().unwrap()), "{err}");

    let first = dir.join("first.prof");
    let guard = Profiler::builder().report_on_stderr(false).start(&first).unwrap();
    let err = Profiler::start(dir.join("second.prof")).err().expect("already running");
    assert!(err.to_string().contains("first.prof"), "{err}");
    guard.stop().unwrap();
    assert!(!dir.join("second.prof").exists());
}

#[inline(never)]
fn wait_here(rx: &std::sync::mpsc::Receiver<()>) {
    let _ = black_box(rx.recv());
}

/// The builder's wall-clock modes: a thread named `waiter` blocked 1.5 s in `wait_here` (a
/// channel's futex wait) while the test burns 1.5 s of CPU in hot_a/hot_b. `wall(100)`: the
/// burning spans 1.5 s ± 10 % of wall samples, and so does the waiter thread, blocked in
/// futex; `wall_beside`: the CPU profile holds the burning 3:1 and nothing of the waiter, the
/// wall profile the same as alone. The waiter's blocked stacks reach `wait_here` (this test
/// binary and std are built with frame pointers, and std's channel calls `Thread::park` through
/// a register: the frame record proven from the record above it, `unwind::frame_records`).
#[test]
fn wall_and_wall_beside_known_answer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("wall-guard");
    let (wall, cpu) = (dir.join("wall.prof"), dir.join("cpu.prof"));
    for beside in [false, true] {
        let builder = Profiler::builder().report_on_stderr(false);
        let guard = if beside {
            builder.frequency(250).wall_beside(&wall, 100).start(&cpu)
        } else {
            builder.wall(100).start(&wall)
        }
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::Builder::new()
            .name("waiter".into())
            .spawn(move || wait_here(&rx))
            .unwrap();
        let started = std::time::Instant::now();
        while started.elapsed().as_secs_f64() < 1.5 {
            black_box(hot_a(100_000));
            black_box(hot_b(100_000));
        }
        tx.send(()).unwrap();
        waiter.join().unwrap();
        guard.stop().unwrap();
        let profile = Profile::parse(&std::fs::read(&wall).unwrap()).unwrap();
        let total = profile.total_samples() as f64 * profile.period_us as f64 / 1e6;
        let cum = cpuprof_top(&wall);
        let seconds = |f: &str| share(&cum, f) / 100.0 * total;
        let burning = seconds("hot_a") + seconds("hot_b");
        assert!(
            (burning - 1.5).abs() <= 0.15,
            "beside={beside}: hot_a + hot_b {burning:.3} s: {cum:?}"
        );
        let contexts = &profile.maps.contexts;
        let waiter_tid = contexts
            .thread_names
            .iter()
            .find(|(_, n)| *n == "waiter")
            .map(|(t, _)| *t);
        let waiter_in_futex: u64 = profile
            .samples
            .iter()
            .filter(|s| {
                s.context
                    .as_ref()
                    .is_some_and(|c| Some(c.tid) == waiter_tid && c.syscall() == Some("futex"))
            })
            .map(|s| s.count)
            .sum();
        let waited = waiter_in_futex as f64 * profile.period_us as f64 / 1e6;
        assert!(
            (waited - 1.5).abs() <= 0.15,
            "beside={beside}: waiter blocked in futex {waited:.3} s"
        );
        let waited_here = seconds("wait_here");
        assert!(
            (waited_here - 1.5).abs() <= 0.15,
            "beside={beside}: wait_here {waited_here:.3} s: {cum:?}"
        );
        if beside {
            assert_three_to_one("cpuprof top of the CPU profile", &cpuprof_top(&cpu), &cpu);
            let cpu_profile = Profile::parse(&std::fs::read(&cpu).unwrap()).unwrap();
            assert!(
                cpu_profile.maps.contexts.is_empty(),
                "the CPU profile carries no states"
            );
        }
    }
}
