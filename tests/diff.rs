//! `cpuprof diff` on real profiles of the known-answer workload (hot_a 3 : hot_b 1) and of a
//! new version whose hot_b does twice the work (3 : 2, so hot_b goes from 25 % to 40 %):
//! effects with intervals, significance corrected for the functions compared, the CI gate's exit
//! codes, and the same against a history (with a version whose hot_b does four times the work).
//!
//! These are statistical tests; each assertion's false-failure rate is below 1 in 1000 (worked
//! out next to it). CPU time recorded: ~24 s.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// Held while a profiled run or a `cpuprof` command runs: the tests' own processes never
/// compete for the CPU with a profiled run (see [`record`]).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn cpuprof(args: &[&str]) -> Output {
    let _turn = one_at_a_time();
    Command::new(cli()).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The workload (`b_work` 1), its new version (2), or one whose hot_b does four times the work
/// (4: hot_b 25 -> 57 %), each built once per test binary.
fn program(b_work: u32) -> &'static Path {
    const WORKS: [u32; 3] = [1, 2, 4];
    static BUILT: OnceLock<Vec<PathBuf>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let dir = scratch_dir("diff_programs");
        let build = |work: u32| {
            let define = format!("-DHOT_B_WORK={work}");
            let flags = [FLAGS, &[define.as_str()]].concat();
            compile_c(&dir, "hot.c", &format!("hot_b{work}"), &flags, false)
        };
        WORKS.iter().map(|&work| build(work)).collect()
    });
    let index = WORKS.iter().position(|&w| w == b_work).expect("a built version");
    &built[index]
}

/// Profiles of `runs` = (hot_b work, seconds, frequency), recorded while no other process of
/// these tests runs. Profiled runs competing with each other or with `cpuprof` commands on this
/// 2-core machine (load 9-11 from other work) varied far beyond sampling error, and not at
/// random: hot_a 46-88 % for 75 % in 0.4 s runs two at a time (4x the binomial variance, and
/// 0.35-0.39 s recorded of 0.4), and single runs at 45.5 and 46.6 % (hot_b doubled, 10 % of
/// the time missing) when they overlapped other tests' `cpuprof` commands. With nothing else of
/// ours running: 65-82 %, SD 5.25 points against 5.16 for the sampling model.
fn record(name: &str, runs: &[(u32, &str, &str)]) -> Vec<PathBuf> {
    let dir = scratch_dir(name);
    let mut paths = Vec::new();
    for (i, &(work, seconds, hz)) in runs.iter().enumerate() {
        let path = dir.join(format!("run{i}.prof"));
        let _turn = one_at_a_time();
        run_preloaded(program(work), &[seconds], &path, &[("CPUPROFILE_FREQUENCY", hz)]);
        paths.push(path);
    }
    paths
}

/// The issue's case: the two versions at the default 100 Hz for 1.1 s (~110 samples each).
fn split() -> &'static [PathBuf] {
    static RUN: OnceLock<Vec<PathBuf>> = OnceLock::new();
    RUN.get_or_init(|| record("diff_split", &[(1, "1.1", "100"), (2, "1.1", "100")]))
}

/// Ten times the samples: 4.4 s at 250 Hz (the tick's rate, so every sample is an observation).
fn ten_times() -> &'static [PathBuf] {
    static RUN: OnceLock<Vec<PathBuf>> = OnceLock::new();
    RUN.get_or_init(|| record("diff_ten", &[(1, "4.4", "250"), (2, "4.4", "250")]))
}

/// 20 pairs of runs of the same program, 0.3 s at 1000 Hz: ~300 samples but only ~75 looks at
/// the stack each (the default timer observes on the 250 Hz tick and weights by the overrun).
/// Twenty real pairs rather than resamples of one: what varies between real runs (the tick's
/// phase, the machine's load) is part of what must not be flagged.
fn same_pairs() -> &'static [PathBuf] {
    static RUN: OnceLock<Vec<PathBuf>> = OnceLock::new();
    RUN.get_or_init(|| record("diff_same", &[(1, "0.3", "1000"); 40]))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// One row of a diff report: (share change, low, high, marked; time change, low, high, marked).
#[derive(Debug)]
struct Row {
    share: (f64, f64, f64, bool),
    time: (f64, f64, f64, bool),
    position: usize,
}

fn row(report: &str, function: &str) -> Option<Row> {
    // The rows: lines with intervals, not the column header (`change [interval] pts`).
    let lines = report
        .lines()
        .filter(|l| l.contains('[') && l.contains(']') && !l.contains("[interval]"));
    let (position, line) = lines
        .enumerate()
        .find(|(_, l)| l.split_whitespace().last() == Some(function))?;
    // `before% now% change [low, high]M  before now change [low, high]M  settle function`
    let parts: Vec<&str> = line.split(']').collect();
    let effect = |part: &str| {
        let numbers: Vec<f64> = part
            .replace(['[', ',', '%', '*'], " ")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        let n = numbers.len();
        (numbers[n - 3], numbers[n - 2], numbers[n - 1])
    };
    let marked = |part: &str| part.starts_with('*');
    let ((a, b, c), (d, e, f)) = (effect(parts[0]), effect(parts[1]));
    Some(Row {
        share: (a, b, c, marked(parts[1])),
        time: (d, e, f, marked(parts[2])),
        position,
    })
}

#[test]
fn the_issue_case_names_hot_b_with_its_interval() {
    let runs = split();
    let out = cpuprof(&["diff", path(&runs[0]), path(&runs[1])]);
    let report = text(&out);
    assert!(matches!(out.status.code(), Some(0 | 3)), "{report}");
    assert!(!report.contains("no significant change"), "{report}");
    let b = row(&report, "hot_b").unwrap_or_else(|| panic!("hot_b not shown: {report}"));
    // hot_a loses what hot_b gains: the two largest changes, whatever their size this time.
    assert!(b.position < 2, "{report}");
    let (change, low, high, _) = b.share;
    assert!(low <= change && change <= high && high - low > 5.0, "{report}");
    let (change, low, high, _) = b.time;
    assert!(low <= change && change <= high, "{report}");
    if !b.share.3 {
        assert!(report.contains("needs"), "what would settle it: {report}");
    }
    // The true change (+15 points) is plausible: inside a 99.99 % interval but for 1 in 10,000.
    let out = cpuprof(&["diff", "--confidence", "0.9999", path(&runs[0]), path(&runs[1])]);
    let (_, low, high, _) = row(&text(&out), "hot_b").unwrap().share;
    assert!(low <= 15.0 && 15.0 <= high, "{}", text(&out));
}

#[test]
fn ten_times_the_samples_mark_hot_b_significant() {
    let runs = ten_times();
    let out = cpuprof(&["diff", path(&runs[0]), path(&runs[1])]);
    let report = text(&out);
    // hot_b: +15 points with a standard error of ~2 (1100 observations a side), z ~ 7.5 against
    // the ~3.9 Holm needs: missed for 1 run in 6000.
    assert_eq!(out.status.code(), Some(3), "{report}");
    let b = row(&report, "hot_b").unwrap();
    let a = row(&report, "hot_a").unwrap();
    assert!(b.share.3 && b.share.0 > 0.0 && b.time.1 > 0.0, "{report}");
    assert!(a.share.3 && a.share.0 < 0.0, "{report}");
    let summary = report.lines().find(|l| l.starts_with("significant:")).unwrap_or("");
    assert!(
        summary.contains("hot_b grew") && summary.contains("hot_a shrank"),
        "{report}"
    );
    // Nothing else: main, work and the rest are at 100 % in both. Times are not marked between
    // two runs (their totals' noise is unknown), only shares.
    assert!(!b.time.3 && !a.time.3, "{report}");
    assert_eq!(
        report.lines().filter(|l| l.contains(']') && l.contains('*')).count(),
        2,
        "{report}"
    );
}

#[test]
fn fail_on_thresholds_set_the_exit_status() {
    let runs = ten_times();
    // hot_b grew ~15 points, ~0.66 s of 4.4 s (~15 % of the baseline's time); hot_a shrank.
    for (condition, status) in [
        ("significant", 3),
        ("share=5", 3),
        ("share=50", 0),
        ("growth=5%", 3),
        ("growth=50%", 0),
        ("growth=100ms", 3),
        ("growth=2s", 0),
    ] {
        let out = cpuprof(&["diff", "--fail-on", condition, path(&runs[0]), path(&runs[1])]);
        let report = text(&out);
        assert_eq!(out.status.code(), Some(status), "--fail-on {condition}: {report}");
        let failures: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
        assert_eq!(failures.len(), if status == 3 { 1 } else { 0 }, "{report}");
        assert!(failures.iter().all(|l| l.contains("hot_b")), "{report}");
    }
    // Two conditions: either fails the build.
    let out = cpuprof(&[
        "diff",
        "--fail-on",
        "share=50",
        "--fail-on",
        "growth=5%",
        path(&runs[0]),
        path(&runs[1]),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    for bad in ["growth=5", "speed=2", "share=-1"] {
        let out = cpuprof(&["diff", "--fail-on", bad, path(&runs[0]), path(&runs[1])]);
        assert_eq!(out.status.code(), Some(2), "--fail-on {bad} is a usage error");
    }
    // Per unit of work: told that the new run did twice the work, hot_b's time per unit is
    // ~1.76 s / 2 against ~1.1 s, no growth, and the time gate passes.
    let out = cpuprof(&[
        "diff",
        "--units",
        "1,2",
        "--fail-on",
        "growth=5%",
        path(&runs[0]),
        path(&runs[1]),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("per unit of work"), "{}", text(&out));
}

/// A row's z, from its 95 % interval (nearly symmetric at these shares).
fn z(effect: (f64, f64, f64, bool)) -> f64 {
    let (change, low, high, _) = effect;
    change / ((high - low) / (2.0 * 1.959964))
}

/// The first profile's (samples, observations) and the tick from a report's header.
fn observations(report: &str) -> (f64, f64, f64) {
    let header = report.lines().next().unwrap();
    let number_before = |word: &str| -> f64 {
        let at = header.find(word).unwrap();
        let digits: String = header[..at].trim_end().rsplit([' ', '(', '~']).next().unwrap().into();
        digits.parse().unwrap()
    };
    (
        number_before(" samples"),
        number_before(" independent"),
        number_before(" us)"),
    )
}

/// The `# signal-weights` line of a profile: signals, sum of weights, sum of squares.
fn signal_weights(profile: &Path) -> (u64, u64, u64) {
    let bytes = std::fs::read(profile).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("# signal-weights "))
        .expect("a signal-weights line");
    let n: Vec<u64> = line.split_whitespace().map(|v| v.parse().unwrap()).collect();
    (n[0], n[1], n[2])
}

#[test]
fn the_same_program_twice_is_never_marked() {
    let runs = same_pairs();
    let mut squares = Vec::new();
    for pair in runs.chunks(2) {
        // alpha 1e-5 family-wise: a false mark in 20 tries for 2 runs in 10,000 if the counts
        // were binomial in the observations (measured on 780 pairs of these runs: see below).
        let out = cpuprof(&[
            "diff",
            // Every row: hot_a's change may be too small to be among the ten largest.
            "-n",
            "1000",
            "--alpha",
            "0.00001",
            "--fail-on",
            "significant",
            path(&pair[0]),
            path(&pair[1]),
        ]);
        let report = text(&out);
        assert_eq!(out.status.code(), Some(0), "{report}");
        assert!(report.contains("nothing is significant"), "{report}");
        // The intervals count looks at the stack, not samples: the effective number of the
        // weighted signals the profile recorded, at most one per tick of its CPU time (at
        // 1000 Hz, about a quarter of the samples).
        let (samples, observed, tick_us) = observations(&report);
        let (signals, sum, squares_sum) = signal_weights(&pair[0]);
        assert_eq!(sum as f64, samples, "no sample lost: {report}");
        let expected = (sum as f64).powi(2) / squares_sum as f64;
        assert!((observed - expected).abs() <= 1.0, "{expected} expected: {report}");
        assert!(
            observed <= signals as f64 && observed <= samples * (1000.0 / tick_us) * 1.1,
            "{report}"
        );
        squares.push(z(row(&report, "hot_a").unwrap().share).powi(2));
    }
    // For the record (CI logs): 1 if the counts were binomial in the observations. Runs on a
    // loaded machine have heavier tails (1.9 in one batch here; 7.5 counting samples).
    let mean = squares.iter().sum::<f64>() / squares.len() as f64;
    eprintln!("mean z^2 of hot_a's share over 20 pairs: {mean:.2}");
}

#[test]
fn history_marks_what_left_the_usual_range() {
    let runs = same_pairs();
    let dir = scratch_dir("diff_history").join("history");
    std::fs::create_dir_all(&dir).unwrap();
    // The history: every run but the one judged (39 of them; with 20, a batch whose runs
    // spread more than usual left hot_b's +12 points at z ~3.2, short of Holm's ~3.9, in 2 of
    // 5 runs on a 2-core machine).
    let usual = &runs[1];
    for p in runs.iter().filter(|p| *p != usual) {
        std::fs::copy(p, dir.join(p.file_name().unwrap())).unwrap();
    }
    // alpha 1e-4: a usual run is marked for 1 run in 10,000.
    // Every row: hot_b's change may be too small to be among the ten largest.
    let out = cpuprof(&[
        "diff",
        "-n",
        "1000",
        "--alpha",
        "0.0001",
        "--history",
        path(&dir),
        path(usual),
    ]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(row(&report, "hot_b").is_some(), "{report}");
    // A version whose hot_b does four times the work: 25 -> 57 %, +32 points (1.1 s: its time
    // is not comparable with 0.3 s runs, its share is). Its standard error is the history's
    // spread beyond sampling plus the new run's sampling (3 points at 275 observations). The
    // spread was ~0 on an idle machine, but 4.1 points on one CI machine, which left the
    // doubled hot_b's +14 points at z 2.8, short of the ~4 Holm needs. At +32 points that
    // spread still gives z ~6.
    let grown = &record("diff_grown", &[(4, "1.1", "250")])[0];
    let out = cpuprof(&["diff", "--fail-on", "share=5", "--history", path(&dir), path(grown)]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(3), "{report}");
    let failures: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failures.len(), 1, "{report}");
    assert!(failures[0].contains("hot_b"), "{report}");
    assert!(row(&report, "hot_b").unwrap().share.3, "{report}");
}
