//! Event profiles (`CPUPROFILE_EVENT`, `/pprof/pmuprofile`, `ProfilerBuilder::event`): samples
//! every N occurrences of a software or hardware event, by perf events per thread.
//!
//! Known answers from `tests/c/events_known.c`, which counts its own events: page faults
//! (touch_a 3 pages for each of touch_b's: shares within 3 points of 75/25, the total within
//! 5 % of `perf stat -e page-faults` on the same run), threads, over HTTP, and through the Rust
//! API; no sleep or poll interrupted; context switches refused (they would interrupt them).
//! Hardware events are
//! tested where the machine counts them; where it does not (these VMs: `perf stat -e cycles`
//! says `<not supported>`), the start must say so and the program run unchanged.

mod support;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

/// `tests/c/events_known.c`, built once for every test of this binary.
fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("events");
            compile_c(&dir, "events_known.c", "events_known", &["-O2", "-pthread"], false)
        })
        .clone()
}

/// The events a profile's samples stand for: samples times the `# event` line's period.
fn events_in(profile: &Path) -> (String, u64) {
    let p = read_profile(profile);
    let total = p.total_samples();
    let event = p
        .maps
        .event
        .unwrap_or_else(|| panic!("{}: no `# event` line", profile.display()));
    (event.name, total * event.period)
}

/// `perf stat -e EVENT` of `program args` run with `env` (set by `env(1)`, so that perf itself
/// is not preloaded): the program's output and the count.
fn perf_stat(event: &str, program: &Path, args: &[&str], env: &[(&str, &str)]) -> (std::process::Output, u64) {
    let _alone = alone();
    let out = Command::new("perf")
        .args(["stat", "-x", ",", "-e", event, "--", "env"])
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(program)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "perf stat: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let count = stderr
        .lines()
        .find_map(|l| l.split(',').next()?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no count in perf stat's output: {stderr}"));
    (out, count)
}

/// Whether this machine counts hardware event `event` (`perf stat` says `<not supported>` in
/// most virtual machines).
fn machine_counts(event: &str) -> bool {
    let out = Command::new("perf")
        .args(["stat", "-x", ",", "-e", event, "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    !stderr.contains("not supported") && !stderr.contains("not counted")
}

fn assert_share(reader: &str, table: &std::collections::HashMap<String, f64>, a: &str, want_a: f64, b: &str) {
    let (sa, sb) = (share(table, a), share(table, b));
    assert!(
        (sa - want_a).abs() <= 3.0 && (sb - (100.0 - want_a)).abs() <= 3.0,
        "{reader}: {a} {sa}%, {b} {sb}% (want {want_a}/{} ± 3): {table:?}",
        100.0 - want_a
    );
}

fn assert_total(what: &str, profiled: u64, counted: u64) {
    let error = (profiled as f64 - counted as f64).abs() / counted as f64;
    assert!(
        error <= 0.05,
        "{what}: the profile stands for {profiled} events, perf stat counted {counted} ({:.1} % apart)",
        100.0 * error
    );
}

#[test]
fn page_faults_known_answer_agrees_with_perf_stat_and_the_readers() {
    if !require_tools(&["perf", "google-pprof", "go"]) {
        return;
    }
    let prog = program();
    let dir = scratch_dir("events_faults");
    let profile = dir.join("faults.prof");
    let lib = lib().to_str().unwrap();
    let env = [
        ("LD_PRELOAD", lib),
        ("CPUPROFILE", profile.to_str().unwrap()),
        ("CPUPROFILE_EVENT", "page-faults"),
        ("CPUPROFILE_EVENT_PERIOD", "10"),
    ];
    // 120,000 faults, a sample every 10: 12,000 samples, so 3 points are ~7 standard errors.
    let args = ["faults", "3000", "1000", "30"];
    let (out, counted) = perf_stat("page-faults", &prog, &args, &env);
    let v = values(&out);
    assert_eq!((v["pages_a"].as_str(), v["pages_b"].as_str()), ("90000", "30000"));
    let (name, profiled) = events_in(&profile);
    assert_eq!(name, "page-faults");
    assert_total("page faults", profiled, counted);
    let top = run_ok(cli(), &["top", profile.to_str().unwrap()], &[]);
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.starts_with("Total: ") && top.contains("page-faults events at 10 per sample"),
        "{top}"
    );
    assert_share("cpuprof top", &cpuprof_top(&profile), "touch_a", 75.0, "touch_b");
    assert_share(
        "google-pprof",
        &google_pprof(&prog, &profile),
        "touch_a",
        75.0,
        "touch_b",
    );
    assert_share("go tool pprof", &go_pprof(&prog, &profile), "touch_a", 75.0, "touch_b");
    // As protobuf, the sample type is the event's.
    let pb = dir.join("faults.pb.gz");
    run_ok(
        cli(),
        &[
            "convert",
            "--to",
            "pprof",
            profile.to_str().unwrap(),
            "-o",
            pb.to_str().unwrap(),
        ],
        &[],
    );
    let types = run_ok(
        Path::new("go"),
        &["tool", "pprof", "-raw", pb.to_str().unwrap()],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let raw = String::from_utf8_lossy(&types.stdout);
    assert!(raw.contains("page-faults/count"), "{raw}");
}

#[test]
fn sleeping_calls_never_fail_with_eintr_and_kernel_only_events_are_refused() {
    let prog = program();
    let dir = scratch_dir("events_eintr");
    let plain = run_ok(&prog, &["eintr", "500"], &[]);
    assert_eq!(values(&plain)["nanosleep_eintr"], "0");
    // A sample at every page fault, each just before a sleep: no sleep is cut short.
    let profile = dir.join("faults.prof");
    let out = run_preloaded(
        &prog,
        &["eintr", "500"],
        &profile,
        &[("CPUPROFILE_EVENT", "page-faults"), ("CPUPROFILE_EVENT_PERIOD", "1")],
    );
    assert_eq!(out.stdout, plain.stdout, "{}", String::from_utf8_lossy(&out.stderr));
    let (_, events) = events_in(&profile);
    assert!(events >= 500, "{events} page faults sampled");
    // Context switches happen in the kernel, where the signal would wake the sleeper (1,329 of
    // 2,000 sleeps failed with EINTR when they were profiled): refused, the program unchanged.
    for event in ["context-switches", "cpu-migrations"] {
        let profile = dir.join(format!("{event}.prof"));
        let out = run_preloaded(&prog, &["eintr", "500"], &profile, &[("CPUPROFILE_EVENT", event)]);
        assert_eq!(out.stdout, plain.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("happens only inside the kernel") && stderr.contains("EINTR"),
            "{stderr}"
        );
        assert!(!profile.exists(), "{event}: no profile");
    }
}

#[test]
fn every_thread_counts_its_own_events() {
    if !require_tools(&["perf"]) {
        return;
    }
    let prog = program();
    let profile = scratch_dir("events_threads").join("threads.prof");
    let lib = lib().to_str().unwrap();
    let env = [
        ("LD_PRELOAD", lib),
        ("CPUPROFILE", profile.to_str().unwrap()),
        ("CPUPROFILE_EVENT", "minor-faults"),
    ];
    let (out, counted) = perf_stat("minor-faults", &prog, &["threads", "8", "10000"], &env);
    assert_eq!(values(&out)["pages_a"], "80000");
    let (_, profiled) = events_in(&profile);
    assert_total("minor faults of 8 threads", profiled, counted);
    let touch_a = share(&cpuprof_top(&profile), "touch_a");
    assert!(touch_a >= 95.0, "touch_a {touch_a}%");
}

#[test]
fn hardware_events_are_profiled_or_refused_with_the_reason() {
    if !require_tools(&["perf"]) {
        return;
    }
    let prog = program();
    let dir = scratch_dir("events_hardware");
    let args = ["faults", "300", "100", "10"];
    let plain = run_ok(&prog, &args, &[]);
    for event in ["instructions", "cycles", "r00c0"] {
        let profile = dir.join(format!("{event}.prof"));
        let out = run_preloaded(
            &prog,
            &args,
            &profile,
            &[("CPUPROFILE_EVENT", event), ("CPUPROFILE_EVENT_PERIOD", "100000")],
        );
        assert_eq!(out.stdout, plain.stdout, "{event}: the program's output changed");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if machine_counts(event) {
            let (name, _) = events_in(&profile);
            assert_eq!(name, event);
        } else {
            eprintln!("{event}: this machine has no counter for it; checking the refusal");
            assert!(
                stderr.contains(&format!("cannot profile event {event}: this machine does not count it"))
                    && stderr.contains("software events")
                    && stderr.contains("the program continues without profiling"),
                "{stderr}"
            );
            assert!(!profile.exists(), "{event}: no profile is written");
        }
    }
    // Names and periods cpuprof does not take are refused at start, never profiled as CPU time.
    for (event, period, says) in [
        ("hugs", "10", "\"hugs\" is not an event cpuprof knows"),
        ("page-faults", "0", "is not a whole number of events"),
    ] {
        let profile = dir.join("refused.prof");
        let out = run_preloaded(
            &prog,
            &args,
            &profile,
            &[("CPUPROFILE_EVENT", event), ("CPUPROFILE_EVENT_PERIOD", period)],
        );
        assert_eq!(out.stdout, plain.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{event} {period}: {stderr}");
        assert!(!profile.exists());
    }
}

#[test]
fn pmuprofile_endpoint_serves_an_event_profile() {
    if !require_tools(&["google-pprof"]) {
        return;
    }
    let prog = program();
    let dir = scratch_dir("events_http");
    let _alone = alone();
    let child = HttpChild::start(&prog, &["serve", "300", "100"], &[]);
    let (status, body) = http_exchange(
        &child.address,
        b"GET /pprof/pmuprofile?event=page-faults&period=10&seconds=2 HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let profile = dir.join("pmu.prof");
    std::fs::write(&profile, &body).unwrap();
    let (name, events) = events_in(&profile);
    assert_eq!(name, "page-faults");
    assert!(events > 1000, "{events} page faults in 2 s");
    assert_share("cpuprof top", &cpuprof_top(&profile), "touch_a", 75.0, "touch_b");
    assert_share(
        "google-pprof",
        &google_pprof(&prog, &profile),
        "touch_a",
        75.0,
        "touch_b",
    );
    // An event the machine cannot count: refused with the reason (422), or served where it can.
    let (status, body) = http_exchange(
        &child.address,
        b"GET /pprof/pmuprofile?event=cycles&seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&body);
    if require_tools(&["perf"]) && machine_counts("cycles") {
        assert_eq!(status, 200, "{text}");
    } else {
        assert_eq!(status, 422, "{text}");
        assert!(text.contains("this machine does not count it"), "{text}");
    }
    // A CPU profile afterwards is a CPU profile again.
    let (status, body) = http_exchange(
        &child.address,
        b"GET /pprof/profile?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    assert_eq!(status, 200);
    let cpu = dir.join("cpu.prof");
    std::fs::write(&cpu, &body).unwrap();
    assert_eq!(read_profile(&cpu).maps.event, None);
    let (out, _) = child.finish();
    assert!(out.status.success(), "{out:?}");
}

/// Writes to `pages` fresh pages (mapped here and unmapped after, so each write faults).
#[inline(never)]
fn touch_pages(pages: usize) -> usize {
    let page = 4096;
    // SAFETY: a private anonymous mapping of our own, written within its length, then unmapped.
    unsafe {
        let block = libc::mmap(
            std::ptr::null_mut(),
            pages * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(block, libc::MAP_FAILED);
        for i in 0..pages {
            std::ptr::write_volatile(block.cast::<u8>().add(i * page), 1);
        }
        libc::munmap(block, pages * page);
    }
    pages
}

#[inline(never)]
fn rust_touch_a(pages: usize) -> usize {
    std::hint::black_box(touch_pages(pages))
}

#[inline(never)]
fn rust_touch_b(pages: usize) -> usize {
    std::hint::black_box(touch_pages(pages) + 1) - 1
}

#[test]
fn the_rust_api_profiles_an_event_in_process() {
    let _alone = alone();
    let guard = cpuprof::Profiler::builder()
        .event("page-faults", Some(10))
        .start_in_memory()
        .expect("page faults are software events, counted wherever perf events are");
    for _ in 0..20 {
        // Blocks above the allocator's mmap threshold: fresh pages each time.
        rust_touch_a(3000);
        rust_touch_b(1000);
    }
    let report = guard.report().unwrap();
    let event = report.event().expect("an event profile");
    assert_eq!((event.name.as_str(), event.period), ("page-faults", 10));
    let mut text = Vec::new();
    report.write_top(&mut text, 50).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("page-faults events at 10 per sample"), "{text}");
    // As a ratio of the two: the test binary's other threads fault too (a fork by another test
    // makes this process's pages copy-on-write), and their faults are in the total.
    let table = cum_percentages(&text);
    let (a, b) = (share(&table, "rust_touch_a"), share(&table, "rust_touch_b"));
    let of_a = 100.0 * a / (a + b);
    assert!(
        a + b >= 50.0 && (of_a - 75.0).abs() <= 3.0,
        "a {a}%, b {b}% ({of_a:.1} % of the two): {text}"
    );
    // A name cpuprof does not know fails the start, with the reason.
    let refused = cpuprof::Profiler::builder().event("hugs", None).start_in_memory();
    let message = refused.err().expect("refused").to_string();
    assert!(message.contains("not an event cpuprof knows"), "{message}");
}
