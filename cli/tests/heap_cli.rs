//! The `cpuprof` command on heap profiles (gperftools' text format, `heap_v2`): `top` with each
//! `--sample-index`, `convert --to pprof`, `collapse`, `flamegraph`, `report`, `diff` and
//! `check`, read against `go tool pprof` on the same files.
//!
//! The profiles are real ones of a small C program (`heap_cli.c`, built with `cc -g -O0
//! -fno-omit-frame-pointer`): its addresses are return addresses it took at run time and its
//! maps are its own `/proc/self/maps`, so both readers must find the program's binary and name
//! its functions; only the counts are chosen, so the answer is known: in use, grow_big 3 to
//! grow_small's 1; allocated in all, 1 to 3.
//!
//! Each test needs `cc` and `go` and is skipped without them (failing under `CI=true`: see
//! tests/README.md).

// The workspace's skip policy (tests/support/skip.rs), of which these tests use a part.
#[allow(dead_code)]
#[path = "../../tests/support/skip.rs"]
mod skip;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CPUPROF: &str = env!("CARGO_BIN_EXE_cpuprof");

/// Bytes per object and the sampling period the C program writes.
const OBJECT: f64 = 1024.0;
const PERIOD: f64 = 524288.0;

/// Sampled objects per function: in use and allocated in all (3:1 and 1:3).
const BIG: (u64, u64) = (300, 600);
const SMALL: (u64, u64) = (100, 1800);

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("heap_cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        // go keeps its caches under HOME.
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `program args`, asserting it exits 0; returns what it printed.
fn run_ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(&out)
}

/// The C program, built into `dir`.
fn program(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/heap_cli.c");
    let exe = dir.join("heap_cli");
    let out = Command::new("cc")
        .args(["-g", "-O0", "-fno-omit-frame-pointer"])
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// A heap profile written by the program into `dir/name` with these counts of sampled objects
/// (in use, allocated) for grow_big and grow_small.
fn heap_profile(exe: &Path, dir: &Path, name: &str, big: (u64, u64), small: (u64, u64)) -> PathBuf {
    let path = dir.join(name);
    let counts = [big.0, small.0, big.1, small.1].map(|n| n.to_string());
    let mut args = vec![path.to_str().unwrap()];
    args.extend(counts.iter().map(String::as_str));
    run_ok(exe.to_str().unwrap(), &args);
    path
}

/// Skips (or fails under CI) without the tools; else the program and its profile.
fn setup(name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    if !skip::require_tools(&["cc", "go"]) {
        return None;
    }
    let dir = scratch(name);
    let exe = program(&dir);
    let profile = heap_profile(&exe, &dir, "a.heap", BIG, SMALL);
    Some((dir, exe, profile))
}

/// pprof's scaling of one line (`scaleHeapSample`), truncated as pprof truncates it.
fn scaled(objects: u64) -> (u64, u64) {
    let scale = 1.0 / (1.0 - (-OBJECT / PERIOD).exp());
    (
        (objects as f64 * scale) as u64,
        (objects as f64 * OBJECT * scale) as u64,
    )
}

/// A table as `top` and `go tool pprof -top` print it: the total (as printed) and each
/// function's flat and cumulative percentages.
struct Table {
    total: String,
    flat: HashMap<String, f64>,
    cum: HashMap<String, f64>,
}

fn table(text: &str, total: &str) -> Table {
    let mut t = Table {
        total: total.to_string(),
        flat: HashMap::new(),
        cum: HashMap::new(),
    };
    let rows = text.lines().skip_while(|l| !l.trim_start().starts_with("flat")).skip(1);
    for line in rows {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 6 {
            continue;
        }
        let pct = |s: &str| s.trim_end_matches('%').parse::<f64>().unwrap();
        t.flat.insert(cols[5..].join(" "), pct(cols[1]));
        t.cum.insert(cols[5..].join(" "), pct(cols[4]));
    }
    t
}

/// `cpuprof top` of `profile` with `args`.
fn cpuprof_top(profile: &Path, args: &[&str]) -> Table {
    let mut all = vec!["top"];
    all.extend_from_slice(args);
    all.push(profile.to_str().unwrap());
    let text = run_ok(CPUPROF, &all);
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("Total: "))
        .unwrap_or_else(|| panic!("no total: {text}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    table(&text, &total)
}

/// `go tool pprof -top` of `profile` with `args`.
fn go_top(profile: &Path, args: &[&str]) -> Table {
    let mut all = vec!["tool", "pprof", "-top"];
    all.extend_from_slice(args);
    all.push(profile.to_str().unwrap());
    let text = run_ok("go", &all);
    // Showing nodes accounting for X, 100% of X total
    let total = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1)?.strip_suffix(" total"))
        .unwrap_or_else(|| panic!("no total: {text}"))
        .to_string();
    table(&text, &total)
}

fn assert_share(t: &Table, function: &str, expected: f64, reader: &str) {
    let got = t.flat.get(function).copied();
    assert!(
        got.is_some_and(|g| (g - expected).abs() < 0.1),
        "{reader}: {function} {got:?}, expected {expected}% (flat: {:?})",
        t.flat
    );
    assert!((t.cum["main"] - 100.0).abs() < 0.1, "{reader}: main {:?}", t.cum);
}

#[test]
fn top_agrees_with_go_pprof_for_every_sample_index() {
    let Some((_, _, profile)) = setup("top") else {
        return;
    };
    let (big, small) = (scaled(BIG.0), scaled(SMALL.0));
    let (big_alloc, small_alloc) = (scaled(BIG.1), scaled(SMALL.1));
    // (index, grow_big's share, the total computed here from the counts)
    let cases = [
        (None, 75.0, format!("{:.2}MB", (big.1 + small.1) as f64 / 1048576.0)),
        (
            Some("inuse_space"),
            75.0,
            format!("{:.2}MB", (big.1 + small.1) as f64 / 1048576.0),
        ),
        (
            Some("alloc_space"),
            25.0,
            format!("{:.2}MB", (big_alloc.1 + small_alloc.1) as f64 / 1048576.0),
        ),
        (Some("inuse_objects"), 75.0, (big.0 + small.0).to_string()),
        (Some("alloc_objects"), 25.0, (big_alloc.0 + small_alloc.0).to_string()),
    ];
    for (index, big_share, total) in cases {
        let (ours, theirs) = match index {
            Some(name) => (
                cpuprof_top(&profile, &["--sample-index", name]),
                go_top(&profile, &[&format!("-sample_index={name}")]),
            ),
            None => (cpuprof_top(&profile, &[]), go_top(&profile, &[])),
        };
        let what = index.unwrap_or("default");
        assert_eq!(ours.total, total, "{what}: cpuprof's total");
        assert_eq!(theirs.total, total, "{what}: go tool pprof's total");
        for (t, reader) in [(&ours, "cpuprof"), (&theirs, "go tool pprof")] {
            assert_share(t, "grow_big", big_share, &format!("{what}, {reader}"));
            assert_share(t, "grow_small", 100.0 - big_share, &format!("{what}, {reader}"));
        }
    }
    // pprof's spelling of the option is taken too.
    assert_eq!(
        cpuprof_top(&profile, &["--sample_index", "alloc_space"]).flat["grow_big"],
        25.0
    );
}

#[test]
fn convert_to_pprof_reads_the_same_in_go_pprof() {
    let Some((dir, _, profile)) = setup("convert") else {
        return;
    };
    let converted = dir.join("a.pb.gz");
    run_ok(
        CPUPROF,
        &[
            "convert",
            profile.to_str().unwrap(),
            "--to",
            "pprof",
            "-o",
            converted.to_str().unwrap(),
        ],
    );
    for index in ["inuse_space", "alloc_space", "inuse_objects", "alloc_objects"] {
        let flag = format!("-sample_index={index}");
        let (raw, ours) = (go_top(&profile, &[&flag]), go_top(&converted, &[&flag]));
        assert_eq!(ours.total, raw.total, "{index}");
        for function in ["grow_big", "grow_small"] {
            assert_share(&ours, function, raw.flat[function], index);
        }
    }
    // The default (last) sample type is the one --sample-index names.
    let alloc = dir.join("alloc.pb.gz");
    run_ok(
        CPUPROF,
        &[
            "convert",
            profile.to_str().unwrap(),
            "--to",
            "pprof",
            "--sample-index",
            "alloc_space",
            "-o",
            alloc.to_str().unwrap(),
        ],
    );
    let text = run_ok("go", &["tool", "pprof", "-top", alloc.to_str().unwrap()]);
    assert!(text.contains("Type: alloc_space"), "{text}");
    assert_eq!(
        go_top(&alloc, &[]).total,
        go_top(&profile, &["-sample_index=alloc_space"]).total
    );
    // Filters: grow_small's line left out.
    let focused = dir.join("focused.pb.gz");
    run_ok(
        CPUPROF,
        &[
            "convert",
            profile.to_str().unwrap(),
            "--to",
            "pprof",
            "--ignore",
            "grow_small",
            "-o",
            focused.to_str().unwrap(),
        ],
    );
    let t = go_top(&focused, &[]);
    assert_share(&t, "grow_big", 100.0, "ignore grow_small");
    assert!(!t.flat.contains_key("grow_small"), "{:?}", t.flat);
}

#[test]
fn the_other_commands_read_heap_profiles() {
    let Some((dir, exe, profile)) = setup("others") else {
        return;
    };
    let file = profile.to_str().unwrap();
    let (big, small) = (scaled(BIG.0), scaled(SMALL.0));

    // collapse: the scaled bytes in use per chain.
    let folded = run_ok(CPUPROF, &["collapse", file]);
    assert_eq!(
        folded,
        format!("main;grow_big {}\nmain;grow_small {}\n", big.1, small.1)
    );
    let objects = run_ok(CPUPROF, &["collapse", "--sample-index", "alloc_objects", file]);
    let (big_alloc, small_alloc) = (scaled(BIG.1), scaled(SMALL.1));
    assert_eq!(
        objects,
        format!("main;grow_big {}\nmain;grow_small {}\n", big_alloc.0, small_alloc.0)
    );

    // peek: grow_big's caller with its bytes.
    let peeked = run_ok(CPUPROF, &["peek", "^grow_big$", file]);
    let total = cpuprof_top(&profile, &[]).total;
    assert!(peeked.contains(&format!("Total: {total} inuse_space")), "{peeked}");
    assert!(peeked.contains("100.0% |   main"), "{peeked}");

    // check: a heap profile, its period, lines and totals.
    let checked = run_ok(CPUPROF, &["check", file]);
    let total_objects = big.0 + small.0;
    for expected in [
        "valid heap profile, sampled every 512kB (524288 bytes) on average, 2 lines",
        &format!("in use: {total_objects} objects, "),
        "(400 objects, 409600 bytes sampled)",
        "(2400 objects, 2457600 bytes sampled)",
    ] {
        assert!(checked.contains(expected), "{expected}: {checked}");
    }

    // flamegraph and report: written, in bytes.
    let svg = dir.join("a.svg");
    run_ok(CPUPROF, &["flamegraph", file, "-o", svg.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("Heap profile: inuse_space") && svg.contains("grow_big"),
        "{svg}"
    );
    let html = dir.join("a.html");
    run_ok(CPUPROF, &["report", file, "-o", html.to_str().unwrap()]);
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains(&format!("Total: {total} inuse_space")), "{html}");
    assert!(html.contains("\"unit\":\"bytes\",\"value\":\"inuse_space\""));

    // diff: grow_small's bytes in use tripled; significant with 400 and 600 samples.
    let grown = heap_profile(&exe, &dir, "b.heap", BIG, (SMALL.0 * 3, SMALL.1));
    let out = run(CPUPROF, &["diff", file, grown.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(3), "{text}");
    for expected in [
        "400 sampled objects, ~400 effective samples",
        "observations: the sampled objects",
        "significant: grow_small grew, grow_big shrank",
        "inuse_space: the totals were",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    // The same change with a tenth of the samples is not significant, and says what would
    // settle it.
    let few = heap_profile(&exe, &dir, "few.heap", (30, 60), (10, 180));
    let more = heap_profile(&exe, &dir, "more.heap", (30, 60), (14, 180));
    let out = run(CPUPROF, &["diff", few.to_str().unwrap(), more.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("nothing is significant") && text.contains("sampled objects per run"),
        "{text}"
    );

    // Commands that read CPU profiles only say so.
    let out = run(CPUPROF, &["list", "grow", file]);
    let message = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        message.contains("a heap profile, where a CPU profile is needed"),
        "{message}"
    );
}
