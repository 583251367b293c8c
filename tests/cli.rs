//! The `cpuprof` command on real profiles of the known-answer workload: agreement with pprof,
//! conversion to pprof protobuf and DCPI (diff: tests/diff.rs),
//! collapse, merge, record, and symbols for binaries that moved.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// The known-answer program (hot_a 3 : hot_b 1) and a profile of it at 1000 Hz, shared by the
/// tests that only read it.
fn known_answer() -> &'static (PathBuf, PathBuf) {
    static RUN: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = scratch_dir("cli_known");
        let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
        let profile = dir.join("hot.prof");
        // 4 s at the tick's rate: ~1000 independent stack observations, so the 75/25 answer holds
        // within 4 points at 3 sampling errors (the default timer observes stacks on the 250 Hz
        // tick; higher frequencies weight each observation, they do not add observations).
        run_preloaded(&hot, &["4"], &profile, &[("CPUPROFILE_FREQUENCY", "250")]);
        (hot, profile)
    })
}

fn cpuprof(args: &[&str]) -> Output {
    Command::new(cli()).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Cumulative percentages of a `top` table. Cumulative, because `burn` is inlined into hot_a
/// and hot_b: readers that expand inlined frames give it the flat time.
fn cum(table: &str) -> HashMap<String, f64> {
    cum_percentages(table)
}

fn go_pprof_top(args: &[&str]) -> String {
    let mut full = vec!["tool", "pprof", "-top", "-cum", "-nodecount=1000"];
    full.extend_from_slice(args);
    let out = run_ok(
        Path::new("go"),
        &full,
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    text(&out)
}

#[test]
fn top_agrees_with_go_pprof_within_one_point() {
    let (hot, profile) = known_answer();
    let ours = cum(&text(&cpuprof(&[
        "top",
        "--cum",
        "-n",
        "100",
        profile.to_str().unwrap(),
    ])));
    let theirs = cum(&go_pprof_top(&[hot.to_str().unwrap(), profile.to_str().unwrap()]));
    for f in ["hot_a", "hot_b"] {
        let (a, b) = (ours[f], theirs[f]);
        assert!((a - b).abs() <= 1.0, "{f}: cpuprof {a}%, go pprof {b}%");
    }
    assert!((ours["hot_a"] - 75.0).abs() <= 4.0, "{ours:?}");
}

#[test]
fn pprof_conversion_reads_the_same_in_go_pprof() {
    let (hot, profile) = known_answer();
    let dir = scratch_dir("cli_pprof");
    let pb = dir.join("hot.pb.gz");
    let out = cpuprof(&[
        "convert",
        profile.to_str().unwrap(),
        "--to",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&std::fs::read(&pb).unwrap()[..2], &[0x1f, 0x8b], "gzip magic");
    let converted = cum(&go_pprof_top(&[pb.to_str().unwrap()]));
    let raw = cum(&go_pprof_top(&[hot.to_str().unwrap(), profile.to_str().unwrap()]));
    for f in ["hot_a", "hot_b"] {
        assert!(
            (converted[f] - raw[f]).abs() <= 0.5,
            "{f}: converted {converted:?}, raw {raw:?}"
        );
    }
    // Sample types and the period, as pprof reports them.
    let home = std::env::temp_dir();
    let raw = run_ok(
        Path::new("go"),
        &["tool", "pprof", "-raw", pb.to_str().unwrap()],
        &[("HOME", home.to_str().unwrap())],
    );
    let raw_text = text(&raw);
    assert!(raw_text.contains("samples/count cpu/nanoseconds"), "{raw_text}");
}

/// A DCPI profile parsed here, independently of the cpuprof code: (tstart, header fields,
/// per-address counts), checking the layout rules on the way.
fn parse_dcpi(bytes: &[u8]) -> (u64, HashMap<String, String>, HashMap<u64, u64>) {
    let text_end = bytes
        .windows(8)
        .position(|w| w == b"samples ")
        .or_else(|| bytes.windows(8).position(|w| w == b"samples\n"));
    let text_end = text_end.expect("a samples line");
    let binary = text_end + bytes[text_end..].iter().position(|&b| b == b'\n').unwrap() + 1;
    assert_eq!(binary % 4, 0, "header padded to 4 bytes");
    let header: HashMap<String, String> = String::from_utf8_lossy(&bytes[..text_end])
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    for key in [
        "version", "image", "epoch", "platform", "event", "period", "tstart", "tsize", "cpuspeed",
    ] {
        assert!(
            header.contains_key(key),
            "required header line {key} missing: {header:?}"
        );
    }
    assert_eq!(header["version"], "pdb-0.07");
    let tstart = u64::from_str_radix(&header["tstart"], 16).unwrap();
    let words: Vec<u64> = bytes[binary..]
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
        .collect();
    let (body, footer) = words.split_at(words.len() - 2);
    let mut counts = HashMap::new();
    let (mut i, mut last) = (0, None);
    while i < body.len() {
        let (offset, number) = (body[i], body[i + 1] as usize);
        assert!(last.is_none_or(|l| offset > l), "chunks sorted by offset");
        last = Some(offset);
        for (k, &c) in body[i + 2..i + 2 + number].iter().enumerate() {
            if c > 0 {
                counts.insert(tstart + offset + k as u64, c);
            }
        }
        i += 2 + number;
    }
    assert_eq!(footer[0], counts.len() as u64, "footer: addresses with samples");
    assert_eq!(footer[1], counts.values().sum::<u64>(), "footer: total samples");
    (tstart, header, counts)
}

#[test]
fn dcpi_export_holds_every_leaf_sample_and_reads_back_into_top() {
    let (hot, profile_path) = known_answer();
    let dir = scratch_dir("cli_dcpi").join("out");
    let out = cpuprof(&[
        "convert",
        profile_path.to_str().unwrap(),
        "--to",
        "dcpi",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let profile = read_profile(profile_path);
    let mut total = 0;
    let mut executable = None;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let (_, header, counts) = parse_dcpi(&std::fs::read(entry.unwrap().path()).unwrap());
        total += counts.values().sum::<u64>();
        if header.get("path").map(String::as_str) == Some(hot.to_str().unwrap()) {
            executable = Some(counts);
        }
    }
    assert_eq!(
        total,
        profile.total_samples(),
        "per-address counts sum to the leaf counts"
    );
    // In the executable's file, each leaf's link-time address (its file offset: the text
    // segment of a gcc PIE has offset == address) carries exactly the leaf's samples.
    let mut expected: HashMap<u64, u64> = HashMap::new();
    for s in &profile.samples {
        let map = profile.maps.find(s.pcs[0]).unwrap();
        if map.path == hot.to_str().unwrap() {
            *expected.entry(s.pcs[0] - map.start + map.offset).or_default() += s.count;
        }
    }
    assert_eq!(executable.expect("a DCPI file for the executable"), expected);
    let top = cum(&text(&cpuprof(&["top", "--cum", dir.to_str().unwrap()])));
    assert!(
        (top["hot_a"] - 75.0).abs() <= 4.0 && (top["hot_b"] - 25.0).abs() <= 4.0,
        "{top:?}"
    );
}

#[test]
fn collapse_and_flamegraph_show_the_workload() {
    let (_, profile) = known_answer();
    let folded = text(&cpuprof(&["collapse", profile.to_str().unwrap()]));
    let total: u64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, read_profile(profile).total_samples());
    assert!(folded.lines().any(|l| l.contains(";main;work;hot_a")), "{folded}");
    let svg = scratch_dir("cli_flame").join("hot.svg");
    let out = cpuprof(&["flamegraph", profile.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("hot_a") && svg.contains("hot_b") && svg.contains("main"));
}

#[test]
fn merge_sums_profiles_of_separate_processes() {
    let (hot, first) = known_answer();
    let dir = scratch_dir("cli_merge");
    let second = dir.join("second.prof");
    run_preloaded(hot, &["1"], &second, &[("CPUPROFILE_FREQUENCY", "250")]);
    let merged = dir.join("merged.prof");
    let out = cpuprof(&[
        "merge",
        "-o",
        merged.to_str().unwrap(),
        first.to_str().unwrap(),
        second.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let total = read_profile(first).total_samples() + read_profile(&second).total_samples();
    assert_eq!(read_profile(&merged).total_samples(), total);
    // ASLR put the two processes' code at different addresses; merged, it is one program.
    let ours = cum(&text(&cpuprof(&["top", "--cum", merged.to_str().unwrap()])));
    let theirs = cum(&go_pprof_top(&[hot.to_str().unwrap(), merged.to_str().unwrap()]));
    for table in [&ours, &theirs] {
        assert!((table["hot_a"] - 75.0).abs() <= 4.0, "{table:?}");
    }
}

#[test]
fn record_runs_a_program_and_passes_on_its_status() {
    let (hot, _) = known_answer();
    let dir = scratch_dir("cli_record");
    let profile = dir.join("rec.prof");
    let out = cpuprof(&[
        "record",
        "-F",
        "500",
        "-o",
        profile.to_str().unwrap(),
        "--",
        hot.to_str().unwrap(),
        "0.5",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out).contains("checksum"),
        "the program's own output stays on stdout"
    );
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("Total:") && summary.contains("hot_a"), "{summary}");
    assert_eq!(read_profile(&profile).period_us, 2000);
    let out = cpuprof(&["record", "-o", profile.to_str().unwrap(), "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = cpuprof(&[
        "record",
        "-o",
        profile.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

#[test]
fn moved_binaries_are_found_and_substitutes_checked() {
    let dir = scratch_dir("cli_moved");
    let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let profile = dir.join("hot.prof");
    run_preloaded(&hot, &["3"], &profile, &[("CPUPROFILE_FREQUENCY", "250")]);
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::rename(&hot, elsewhere.join("hot")).unwrap();
    let lost = cpuprof(&["top", profile.to_str().unwrap()]);
    assert!(!text(&lost).contains("hot_a"));
    assert!(String::from_utf8_lossy(&lost.stderr).contains("not found"), "{lost:?}");
    let moved = elsewhere.join("hot");
    let renamed = dir.join("renamed");
    std::fs::copy(&moved, &renamed).unwrap();
    for args in [
        vec!["--search-path", elsewhere.to_str().unwrap()],
        vec!["--binary", moved.to_str().unwrap()],
        vec!["--binary", renamed.to_str().unwrap()],
    ] {
        let mut full = vec!["top", "--cum", profile.to_str().unwrap()];
        full.extend(&args);
        let found = cum(&text(&cpuprof(&full)));
        assert!((found["hot_a"] - 75.0).abs() <= 5.0, "{args:?}: {found:?}");
    }
    // A different build standing in for the original, which is back in place: warned about.
    std::fs::rename(&moved, &hot).unwrap();
    let other = compile_c(&dir, "hot.c", "other", &["-O1", "-fno-omit-frame-pointer"], false);
    let out = cpuprof(&["top", profile.to_str().unwrap(), "--binary", other.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("build-id"), "{out:?}");
    // The original rebuilt since the profile was taken (written beside it and renamed over
    // it, as build tools do): warned about too.
    let rebuilt = dir.join("hot.new");
    std::fs::copy(&other, &rebuilt).unwrap();
    std::fs::rename(&rebuilt, &hot).unwrap();
    let out = cpuprof(&["top", profile.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("replaced since the profile was taken"),
        "{out:?}"
    );
}

#[test]
fn bad_input_fails_with_status_one_and_says_where() {
    let dir = scratch_dir("cli_bad");
    let (_, profile) = known_answer();
    let bytes = std::fs::read(profile).unwrap();
    let cut = dir.join("cut.prof");
    std::fs::write(&cut, &bytes[..100]).unwrap();
    let out = cpuprof(&["check", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("byte"), "{out:?}");
    // The readers take a cut-short file up to the cut, with a warning (tests/cut_short.rs).
    let out = cpuprof(&["top", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cut short"), "{out:?}");
    let garbage = dir.join("garbage.prof");
    std::fs::write(&garbage, b"not a profile at all").unwrap();
    let out = cpuprof(&["top", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("byte"), "{out:?}");
    let out = cpuprof(&["top", "/nonexistent.prof"]);
    assert_eq!(out.status.code(), Some(1));
    let out = cpuprof(&["top"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}
