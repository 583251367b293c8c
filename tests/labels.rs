//! Labels on samples (issue 28): `tests/c/labels_known.c`, linked with -lcpuprof and started by
//! CPUPROFILE, serves requests alternating /a (70 % of the work) and /b (30 %) in one function,
//! switching label sets ~20,000 times a second per thread. The profile's samples carry the sets:
//! our reader, `cpuprof top --by endpoint` and `--tagfocus`, and go tool pprof (`-tags`,
//! `-tagfocus`) on the converted profile, give 70/30.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use support::*;

/// The program, built once per test binary.
fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| compile_c(&scratch_dir("labels"), "labels_known.c", "labels_known", &["-O2"], true))
        .clone()
}

/// Runs the program for `seconds` of CPU on each of `threads` threads under a 1000 Hz CPU
/// profile (with `env`); the profile's path.
fn profile_run(name: &str, seconds: &str, threads: &str, env: &[(&str, &str)]) -> PathBuf {
    let dir = scratch_dir(name);
    let profile = dir.join("labels.prof");
    let mut all = vec![
        ("CPUPROFILE", profile.to_str().unwrap()),
        ("CPUPROFILE_FREQUENCY", "1000"),
    ];
    all.extend_from_slice(env);
    let out = run_alone(&program(), &[seconds, threads], &all);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("requests "),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile
}

/// Each endpoint's share of the labelled samples in percent, by our reader.
fn our_shares(profile: &Path) -> HashMap<String, f64> {
    let p = read_profile(profile);
    let mut by = HashMap::new();
    for s in &p.samples {
        if let Some((_, value)) = s.labels.as_ref().and_then(|l| l.iter().find(|(k, _)| k == "endpoint")) {
            *by.entry(value.clone()).or_insert(0.0) += s.count as f64;
        }
    }
    let total: f64 = by.values().sum();
    by.values_mut().for_each(|v| *v *= 100.0 / total);
    by
}

/// `go tool pprof -tags`' shares of the endpoint values, from its `N (P%): VALUE` lines.
fn go_tag_shares(binary: &Path, pprof: &Path) -> HashMap<String, f64> {
    let out = run_ok(
        Path::new("go"),
        &[
            "tool",
            "pprof",
            "-tags",
            binary.to_str().unwrap(),
            pprof.to_str().unwrap(),
        ],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut shares = HashMap::new();
    let mut in_endpoint = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') || line.contains(": Total") {
            in_endpoint = line.starts_with("endpoint:");
            continue;
        }
        if !in_endpoint {
            continue;
        }
        // "1.4s (70.01%): /a"
        if let Some((left, value)) = line.rsplit_once("): ") {
            if let Some(p) = left
                .rsplit_once('(')
                .and_then(|(_, p)| p.trim_end_matches('%').parse::<f64>().ok())
            {
                shares.insert(value.to_string(), p);
            }
        }
    }
    assert!(!shares.is_empty(), "no endpoint tags in: {text}");
    shares
}

/// The samples go tool pprof keeps, in seconds (`-top`'s header: "Showing nodes accounting
/// for 0.89s, 30.0% of 2.98s total", with `-nodecount` large enough to show every node).
fn go_kept_seconds(pprof: &Path, extra: &[&str]) -> f64 {
    let binary = program();
    let mut args = vec!["tool", "pprof", "-top", "-nodecount=100000"];
    args.extend_from_slice(extra);
    args.extend([binary.to_str().unwrap(), pprof.to_str().unwrap()]);
    let out = run_ok(
        Path::new("go"),
        &args,
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let kept = text
        .split("accounting for ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no header in: {text}"))
        .trim();
    let (number, scale) = match kept.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (kept.trim_end_matches('s'), 1.0),
    };
    number.parse::<f64>().unwrap_or_else(|_| panic!("{kept}")) * scale
}

/// 70/30 within 3 points, or 4.5 standard errors of a 30 % share where the profile holds
/// fewer looks than that needs (a busy machine: few, heavy signals; see
/// `support::assert_three_to_one`).
fn assert_seventy_thirty(reader: &str, shares: &HashMap<String, f64>, profile: &Path) {
    let looks = effective_observations(profile).unwrap_or(1000.0);
    let tolerance = (4.5 * (0.3 * 0.7 / looks).sqrt() * 100.0).max(3.0);
    let (a, b) = (
        shares.get("/a").copied().unwrap_or(0.0),
        shares.get("/b").copied().unwrap_or(0.0),
    );
    assert!(
        (a - 70.0).abs() <= tolerance && (b - 30.0).abs() <= tolerance,
        "{reader}: /a {a:.1} %, /b {b:.1} % (tolerance {tolerance:.1} points, {looks:.0} looks): {shares:?}"
    );
}

/// The share of the total in `cpuprof top`'s "Filters kept N samples (P% of the total" line
/// after each `== KEY=VALUE` header of `text`.
fn kept_shares(text: &str) -> HashMap<String, f64> {
    let mut shares = HashMap::new();
    let mut group = String::new();
    for line in text.lines() {
        if let Some(header) = line.strip_prefix("== ") {
            group = header.rsplit('=').next().unwrap_or(header).to_string();
        } else if let Some(rest) = line.strip_prefix("Filters kept ") {
            let share = rest
                .split_once('(')
                .and_then(|(_, p)| p.split('%').next())
                .and_then(|p| p.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{line}"));
            shares.insert(group.clone(), share);
        }
    }
    shares
}

fn check_known_answer(profile: &Path) {
    check_known_answer_of(&program(), profile)
}

/// [`check_known_answer`] of a profile of `binary`.
fn check_known_answer_of(binary: &Path, profile: &Path) {
    let ours = our_shares(profile);
    assert_seventy_thirty("our reader", &ours, profile);
    let path = profile.to_str().unwrap();
    let by = run_ok(cli(), &["top", "--by", "endpoint", path], &[]);
    let by = kept_shares(&String::from_utf8_lossy(&by.stdout));
    assert_seventy_thirty("cpuprof top --by endpoint", &by, profile);
    let focus = run_ok(cli(), &["top", "--tagfocus", "endpoint=/b", path], &[]);
    let focus = kept_shares(&format!("== /b\n{}", String::from_utf8_lossy(&focus.stdout)));
    assert!(
        (focus["/b"] - by["/b"]).abs() < 0.05,
        "cpuprof top --tagfocus endpoint=/b kept {:.1} %, --by endpoint said {:.1} %",
        focus["/b"],
        by["/b"]
    );
    let pprof = profile.with_extension("pb.gz");
    run_ok(
        cli(),
        &[
            "convert",
            "--to",
            "pprof",
            "-o",
            pprof.to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[],
    );
    let tags = go_tag_shares(binary, &pprof);
    assert_seventy_thirty("go tool pprof -tags", &tags, profile);
    // -tagfocus keeps the /b samples only: their share of the whole.
    let all = go_kept_seconds(&pprof, &[]);
    let b = go_kept_seconds(&pprof, &["-tagfocus=endpoint=/b"]);
    let share = 100.0 * b / all;
    assert!(
        (share - tags["/b"]).abs() < 0.5,
        "-tagfocus endpoint=/b kept {share:.1} % of {all} s, -tags said {:.1} %",
        tags["/b"]
    );
}

#[test]
fn one_thread_switching_labels_twenty_thousand_times_a_second() {
    // perf's cpu-clock: 1000 signals per CPU-second (the POSIX timers fire on the 250 Hz tick).
    let profile = profile_run("labels_one", "3", "1", &[("CPUPROFILE_TIMER", "perf")]);
    check_known_answer(&profile);
}

#[test]
fn eight_threads_switching_labels() {
    let profile = profile_run("labels_eight", "2", "8", &[]);
    check_known_answer(&profile);
}

/// A wall-clock profile at 1000 Hz: the serving thread is on the CPU, its samples carry the
/// sets as a CPU profile's do (the main thread, waiting unlabelled in pthread_join, is the
/// rest).
#[test]
fn wall_clock_profile_of_one_thread() {
    let dir = scratch_dir("labels_wall");
    let profile = dir.join("wall.prof");
    let out = run_alone(
        &program(),
        &["2", "1"],
        &[
            ("CPUPROFILE_WALL", profile.to_str().unwrap()),
            ("CPUPROFILE_WALL_FREQUENCY", "1000"),
        ],
    );
    assert!(out.status.success());
    let shares = our_shares(&profile);
    assert_seventy_thirty("our reader, wall-clock", &shares, &profile);
    let by = run_ok(cli(), &["top", "--by", "endpoint", profile.to_str().unwrap()], &[]);
    let by = kept_shares(&String::from_utf8_lossy(&by.stdout));
    // Of the whole: the main thread's waiting is as long as the serving thread's work.
    let labelled = by["/a"] + by["/b"];
    assert!(
        (35.0..65.0).contains(&labelled),
        "labelled {labelled:.1} % of the wall time: {by:?}"
    );
}

/// A wall-clock profile of a thread that sleeps 3 ms under /a and works ~1 ms under /b: its
/// samples off the CPU carry /a, its samples on the CPU /b (3 : 1 of its time).
#[test]
fn wall_clock_samples_off_the_cpu_keep_their_labels() {
    let dir = scratch_dir("labels_wall_sleepy");
    let profile = dir.join("wall.prof");
    let env = [
        ("CPUPROFILE_WALL", profile.to_str().unwrap()),
        ("CPUPROFILE_WALL_FREQUENCY", "500"),
    ];
    run_alone(&program(), &["0", "1", "sleepy"], &env);
    let shares = our_shares(&profile);
    let (a, b) = (
        shares.get("/a").copied().unwrap_or(0.0),
        shares.get("/b").copied().unwrap_or(0.0),
    );
    assert!(
        (60.0..90.0).contains(&a) && (10.0..40.0).contains(&b),
        "asleep under /a {a:.1} %, working under /b {b:.1} %: {shares:?}"
    );
}

/// The Rust API with tokio's multi-thread runtime (`examples/labels_tokio.rs`): tasks carry
/// their labels (`WithLabels`) as they move between the runtime's threads.
#[test]
fn tokio_tasks_keep_their_labels_across_threads() {
    let example = build_example("labels_tokio", &[]);
    let profile = scratch_dir("labels_tokio").join("tokio.prof");
    let out = run_alone(&example, &[profile.to_str().unwrap(), "3"], &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert_seventy_thirty("our reader", &our_shares(&profile), &profile);
    // The tasks moved: each endpoint's samples came from more than one worker thread.
    let p = read_profile(&profile);
    for endpoint in ["/a", "/b"] {
        let threads: std::collections::HashSet<u32> = p
            .samples
            .iter()
            .filter(|s| s.labels.as_ref().is_some_and(|l| l.iter().any(|(_, v)| v == endpoint)))
            .filter_map(|s| s.context.as_ref().map(|c| c.tid))
            .collect();
        assert!(threads.len() >= 2, "{endpoint} ran on threads {threads:?}");
    }
}

/// Eight threads switching between three sets (and none) in a tight loop, sampled at 4000 Hz
/// (perf's cpu-clock) for 1.5 s of CPU each: the program runs to its end, nothing is lost, and
/// every sample carries a set that was installed (a fourth, interned but never installed,
/// appears nowhere) or none.
#[test]
fn eight_threads_switching_in_a_tight_loop_at_4000_hz() {
    stress(&program(), "labels_stress", &[]);
}

/// The same stress with the program built with AddressSanitizer and UndefinedBehaviorSanitizer
/// (which abort it on the first error they find, in its code or in what ours does to its
/// memory). Leak checking is off: LeakSanitizer sometimes reports the state a single-threaded
/// process's profile is written with until its writer thread starts (docs/HOSTILE.md).
#[test]
fn the_stress_under_address_and_undefined_behaviour_sanitizers() {
    let dir = scratch_dir("labels_sanitized");
    let flags = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"];
    let sanitized = compile_c(&dir, "labels_known.c", "labels_known_asan", &flags, true);
    stress(
        &sanitized,
        "labels_sanitized_run",
        &[("ASAN_OPTIONS", "detect_leaks=0")],
    );
}

/// Eight threads of `program` switching sets for 1.5 s of CPU each at 4000 Hz (see above).
fn stress(program: &Path, name: &str, env: &[(&str, &str)]) {
    let dir = scratch_dir(name);
    let profile = dir.join("stress.prof");
    let mut all = vec![
        ("CPUPROFILE", profile.to_str().unwrap()),
        ("CPUPROFILE_FREQUENCY", "4000"),
        ("CPUPROFILE_TIMER", "perf"),
    ];
    all.extend_from_slice(env);
    let out = run_alone(program, &["1.5", "8", "stress"], &all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(lost samples: 0)"), "{stderr}");
    let p = read_profile(&profile);
    let installed = [
        vec![("endpoint", "/a")],
        vec![("endpoint", "/b")],
        vec![("endpoint", "/c"), ("tenant", "t 1")],
    ];
    let (mut labelled, mut total) = (0, 0);
    for s in &p.samples {
        total += s.count;
        let Some(labels) = &s.labels else { continue };
        labelled += s.count;
        let pairs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(installed.contains(&pairs), "a sample labelled {pairs:?}");
    }
    assert!(
        total > 10_000 && labelled > total / 10,
        "{labelled} of {total} samples labelled"
    );
}

/// `tests/programs/custom_labels_user`, built once: a Rust program that labels its requests
/// with Polar Signals' `custom-labels` crate (the custom-labels ABI v1) and nothing of
/// cpuprof's. Its own workspace and target directory: the crate's build script runs bindgen,
/// which needs libclang (.ci/run installs libclang1-14). None if that cannot be built here.
fn custom_labels_program() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = root().join("tests/programs/custom_labels_user");
            let target = root().join("target/custom-labels-user");
            let out = std::process::Command::new(env!("CARGO"))
                .current_dir(&dir)
                .args(["build", "-q", "--release", "--locked", "--target-dir"])
                .arg(&target)
                .output()
                .expect("run cargo build");
            if !out.status.success() {
                skip(&format!(
                    "the custom-labels crate did not build (libclang for its bindgen?): {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                return None;
            }
            Some(target.join("release/custom-labels-user"))
        })
        .clone()
}

/// A program that labels its work only through the custom-labels ABI, preloaded with
/// libcpuprof.so: cpuprof says it reads the labels, and the known answer holds on one thread
/// and on four, by our reader, `cpuprof top --by endpoint` and go tool pprof.
#[test]
fn labels_set_through_the_custom_labels_abi_are_read_with_no_code_of_ours() {
    let Some(program) = custom_labels_program() else { return };
    for threads in ["1", "4"] {
        let dir = scratch_dir(&format!("labels_custom_abi_{threads}"));
        let profile = dir.join("custom.prof");
        let out = run_preloaded(
            &program,
            &["2", threads],
            &profile,
            &[("CPUPROFILE_FREQUENCY", "1000"), ("CPUPROFILE_TIMER", "perf")],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("through the custom-labels ABI (v1)") && stderr.contains("(lost samples: 0)"),
            "{stderr}"
        );
        assert!(!stderr.contains("could not be read"), "{stderr}");
        check_known_answer_of(&program, &profile);
    }
}

/// `cpuprof diff --by endpoint` of a run and one where /b requests also call validate(): the
/// change shows under /b only (validate grew, serve's share shrank), /a is unchanged, and
/// `--tagfocus endpoint=/a` alone finds nothing significant either.
#[test]
fn diff_by_label_value_shows_a_change_under_its_value_only() {
    let dir = scratch_dir("labels_diff");
    let run = |name: &str, extra: &[&str]| {
        let profile = dir.join(name);
        let mut args = vec!["2", "1"];
        args.extend_from_slice(extra);
        let env = [
            ("CPUPROFILE", profile.to_str().unwrap()),
            ("CPUPROFILE_FREQUENCY", "1000"),
            ("CPUPROFILE_TIMER", "perf"),
        ];
        run_alone(&program(), &args, &env);
        profile
    };
    let (before, after) = (run("before.prof", &[]), run("after.prof", &["b-grows"]));
    let (before, after) = (before.to_str().unwrap(), after.to_str().unwrap());
    let out = std::process::Command::new(cli())
        .args(["diff", "--by", "endpoint", before, after])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "a significant change: {text}");
    let section = |header: &str| -> String {
        let start = text.find(header).unwrap_or_else(|| panic!("no {header}: {text}"));
        let rest = &text[start + header.len()..];
        rest[..rest.find("\n== ").unwrap_or(rest.len())].to_string()
    };
    let (a, b) = (section("== endpoint=/a\n"), section("== endpoint=/b\n"));
    assert!(a.contains("nothing is significant"), "/a: {a}");
    let verdict = b.lines().find(|l| l.starts_with("significant: ")).unwrap_or_default();
    assert!(
        verdict.contains("validate grew") && verdict.contains("serve shrank"),
        "/b: {b}"
    );
    let focus = std::process::Command::new(cli())
        .args(["diff", "--tagfocus", "endpoint=/a", before, after])
        .output()
        .unwrap();
    let focus_text = String::from_utf8_lossy(&focus.stdout);
    assert!(
        focus.status.code() == Some(0) && focus_text.contains("nothing is significant"),
        "{focus_text}"
    );
}

/// Labels survive the epoch database (`CPUPROFILE_DB`, read merged by `top --db`) and `merge`:
/// `--tagfocus endpoint=/b` keeps the /b share of the whole there too.
#[test]
fn the_epoch_database_and_merge_keep_labels() {
    let dir = scratch_dir("labels_db");
    let db = dir.join("db");
    let env = [
        ("CPUPROFILE_DB", db.to_str().unwrap()),
        ("CPUPROFILE_FREQUENCY", "1000"),
        ("CPUPROFILE_TIMER", "perf"),
    ];
    run_alone(&program(), &["2", "1"], &env);
    let focus = run_ok(
        cli(),
        &["top", "--db", db.to_str().unwrap(), "--tagfocus", "endpoint=/b"],
        &[],
    );
    let kept = kept_shares(&format!("== /b\n{}", String::from_utf8_lossy(&focus.stdout)));
    assert!(
        (kept["/b"] - 30.0).abs() < 5.0,
        "top --db --tagfocus endpoint=/b: {kept:?}"
    );
    let epoch_file = std::fs::read_dir(&db)
        .unwrap()
        .flat_map(|e| std::fs::read_dir(e.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "prof"))
        .expect("an epoch's profile");
    let merged = dir.join("merged.prof");
    let (epoch, merged_path) = (epoch_file.to_str().unwrap(), merged.to_str().unwrap());
    run_ok(cli(), &["merge", "-o", merged_path, epoch, epoch], &[]);
    let (once, twice) = (our_shares(&epoch_file), our_shares(&merged));
    assert!((once["/b"] - twice["/b"]).abs() < 0.01, "merge: {once:?} -> {twice:?}");
    assert_eq!(
        read_profile(&merged).total_samples(),
        2 * read_profile(&epoch_file).total_samples()
    );
}
