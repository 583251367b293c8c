//! Reports from inside a Rust program (`cpuprof::Report`): the example that profiles a
//! function and writes a top table, a flame graph and a pprof protobuf with no raw file, read
//! back by go tool pprof; and in this process, thread labels, snapshots while running, reports
//! of file profiles, and the in-memory mode's promise to touch no file. Profiling is
//! process-wide, so the in-process tests take turns.

mod support;

use cpuprof::{Profiler, Report};
use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use support::*;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[inline(never)]
fn heavy(n: u64) -> u64 {
    spin(3 * n)
}

#[inline(never)]
fn light(n: u64) -> u64 {
    spin(n)
}

#[inline(always)]
fn spin(n: u64) -> u64 {
    (0..n).fold(n, |x, i| black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i)))
}

/// The calling thread's CPU time as of its last tick or switch (`getrusage(RUSAGE_THREAD)`
/// does not bring the scheduler's account up to date, so reading it does not bias tick-driven
/// sampling; see tests/c/cpu_deadline.h).
fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a local struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs `f` for `seconds` of the calling thread's CPU time.
fn for_cpu_seconds(seconds: f64, mut f: impl FnMut()) {
    let end = thread_cpu_seconds() + seconds;
    while thread_cpu_seconds() < end {
        for _ in 0..16 {
            f();
        }
    }
}

/// The cpuprof-style table's cumulative share per function, from `write_top`.
fn top_table(report: &Report) -> (String, HashMap<String, f64>) {
    let mut table = Vec::new();
    report.write_top(&mut table, 1000).unwrap();
    let table = String::from_utf8(table).unwrap();
    let shares = cum_percentages(&table);
    (table, shares)
}

fn samples_per_thread(report: &Report) -> HashMap<String, u64> {
    let mut per_thread = HashMap::new();
    for sample in report.samples() {
        let thread = sample.thread().expect("in-memory samples carry their thread");
        *per_thread.entry(thread.name.unwrap_or("?").to_string()).or_default() += sample.count();
    }
    per_thread
}

/// examples/report.rs as a user runs it: the top table on stdout, a flame graph and a
/// `.pb.gz` in its directory and no other file; go tool pprof reads the protobuf with the
/// Rust functions' names, and its thread labels.
#[test]
fn the_example_prints_top_functions_and_writes_a_flame_graph_and_pprof_without_a_raw_file() {
    let dir = scratch_dir("report_example");
    let example = build_example("report", &["flamegraph"]);
    let out = Command::new(&example).arg("100").current_dir(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table = cum_percentages(&stdout);
    let (parse, render) = (share(&table, "parse"), share(&table, "render"));
    assert!(
        (parse - 75.0).abs() <= 8.0 && (render - 25.0).abs() <= 8.0,
        "parse {parse}%, render {render}% (want 75/25):\n{stdout}"
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["report.pb.gz", "report.svg"], "no raw profile, nothing else");

    let svg = std::fs::read_to_string(dir.join("report.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("</svg>"), "an SVG document");
    for name in ["report::parse", "report::render", "worker-a", "worker-b"] {
        assert!(svg.contains(name), "the flame graph shows {name}");
    }

    let pb = dir.join("report.pb.gz");
    let go = go_pprof_of(&pb, &["-top", "-cum", "-nodecount=1000"]);
    let go_table = cum_percentages(&go);
    for (function, want) in [("report::parse", parse), ("report::render", render)] {
        let got = go_table.get(function).copied().unwrap_or(0.0);
        assert!(
            (got - want).abs() <= 0.2,
            "go tool pprof: {function} {got}%, report {want}%:\n{go}"
        );
    }
    let tags = go_pprof_of(&pb, &["-tags"]);
    // Per-thread timers fire on the 4 ms tick: a thread's share rests on about one look per
    // 4 ms of CPU, which on a loaded machine can be too few for 8 points (4.5 standard errors).
    // "Total 825.0ms" or "Total 1.7s".
    let total_ms: f64 = tags
        .split("Total ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| match t.strip_suffix("ms") {
            Some(ms) => ms.parse().ok(),
            None => t.strip_suffix('s')?.parse::<f64>().ok().map(|s| s * 1000.0),
        })
        .unwrap_or_else(|| panic!("no total:\n{tags}"));
    let tolerance = (4.5 * (0.25 / (total_ms / 4.0)).sqrt() * 100.0).max(8.0);
    for thread in ["worker-a", "worker-b"] {
        let line = tags
            .lines()
            .find(|l| l.contains(thread))
            .unwrap_or_else(|| panic!("{thread}:\n{tags}"));
        let percent: f64 = line.split(['(', '%']).nth(1).unwrap().trim().parse().unwrap();
        assert!(
            (percent - 50.0).abs() <= tolerance,
            "equal work on each thread (tolerance {tolerance:.1} points):\n{tags}"
        );
    }
}

fn go_pprof_of(profile: &Path, args: &[&str]) -> String {
    let out = run_ok(
        Path::new("go"),
        &[&["tool", "pprof"], args, &[profile.to_str().unwrap()]].concat(),
        &[],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Threads named `heavy` and `light` burn 3:1 in functions of the same names: the report's
/// samples carry their threads' names in that ratio, and the top table splits the functions
/// likewise. No file is created: the process opens no descriptor on any `(in memory)` path.
#[test]
fn samples_name_their_threads_and_nothing_touches_the_file_system() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let guard = Profiler::builder().frequency(500).start_in_memory().unwrap();
    let threads: Vec<_> = [("heavy", 2.25), ("light", 0.75)]
        .into_iter()
        .map(|(name, seconds)| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    for_cpu_seconds(seconds, || {
                        black_box(if name == "heavy" { heavy(20_000) } else { light(60_000) });
                    })
                })
                .unwrap()
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let report = guard.report().unwrap();
    assert!(!Path::new("(in memory)").exists());
    let summary = report.summary().expect("a stopped profile has its summary");
    assert_eq!((summary.path.as_ref(), summary.lost), (None, 0));
    let per_thread = samples_per_thread(&report);
    let (heavy_n, light_n) = (per_thread["heavy"] as f64, per_thread["light"] as f64);
    let share = 100.0 * heavy_n / (heavy_n + light_n);
    assert!((share - 75.0).abs() <= 6.0, "heavy thread {share:.1}%: {per_thread:?}");
    let (table, shares) = top_table(&report);
    let heavy_fn = support::share(&shares, "heavy");
    assert!(
        (heavy_fn - share).abs() <= 6.0,
        "heavy() {heavy_fn}% vs its thread {share:.1}%:\n{table}"
    );
    assert!(!report.is_wall_clock());
}

/// A snapshot while running is a complete profile of what was sampled so far, and profiling
/// goes on: the final report holds at least as much, the snapshot's share of `heavy` holds.
#[test]
fn a_snapshot_while_running_is_a_complete_profile_and_profiling_goes_on() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let guard = Profiler::builder().frequency(250).start_in_memory().unwrap();
    for_cpu_seconds(1.0, || {
        black_box(heavy(20_000));
        black_box(light(20_000));
    });
    let snapshot = guard.snapshot().unwrap();
    assert!(snapshot.summary().is_none());
    for_cpu_seconds(1.0, || {
        black_box(light(20_000));
    });
    let report = guard.report().unwrap();
    let (table, shares) = top_table(&snapshot);
    let heavy_share = support::share(&shares, "heavy");
    assert!((heavy_share - 75.0).abs() <= 10.0, "snapshot:\n{table}");
    assert!(
        report.total_samples() >= snapshot.total_samples() + 150,
        "the profile went on after the snapshot: {} then {}",
        snapshot.total_samples(),
        report.total_samples()
    );
    // The raw bytes of the snapshot are a profile the real readers take.
    let dir = scratch_dir("report_snapshot");
    let raw = dir.join("snapshot.prof");
    std::fs::write(&raw, snapshot.raw()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let pprof = google_pprof(&exe, &raw);
    assert!(
        (support::share(&pprof, "heavy") - heavy_share).abs() <= 1.0,
        "{pprof:?}"
    );
}

/// A file profile gives its report too (read back from the file it completed), without
/// thread labels unless asked; `Report::parse` reads any raw profile.
#[test]
fn a_file_profile_reports_and_any_raw_profile_parses() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("report_file");
    let path = dir.join("file.prof");
    let guard = Profiler::builder()
        .frequency(250)
        .report_on_stderr(false)
        .start(&path)
        .unwrap();
    for_cpu_seconds(1.5, || {
        black_box(heavy(20_000));
        black_box(light(20_000));
    });
    let report = guard.report().unwrap();
    assert_eq!(report.summary().unwrap().path.as_deref(), Some(path.as_path()));
    assert!(report.samples().all(|s| s.thread().is_none()));
    assert_eq!(report.raw(), std::fs::read(&path).unwrap());
    let again = Report::parse(std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(again.top(), report.top());
    let (table, shares) = top_table(&report);
    assert!((support::share(&shares, "heavy") - 75.0).abs() <= 10.0, "{table}");
    // The folded stacks: outermost frame first, counts adding up to the total.
    let mut folded = Vec::new();
    report.write_folded(&mut folded).unwrap();
    let folded = String::from_utf8(folded).unwrap();
    let total: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, report.total_samples());
    assert!(
        folded.lines().any(|l| l.contains("::heavy ")
            || l.ends_with("::heavy")
            || l.split(' ').next().unwrap().ends_with("::heavy")),
        "{folded}"
    );
    let bad = Report::parse(b"not a profile".to_vec())
        .err()
        .expect("garbage is refused");
    assert!(bad.to_string().contains("cannot read the profile"), "{bad}");
}
