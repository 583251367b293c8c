//! Profiles cut short — by SIGKILL, by `_exit`, by a program that takes every signal over and
//! leaves with `exit_group` (as Go does), or truncated at any offset — are read by every
//! reader command up to the cut, with one warning naming what is missing, and with the
//! executable's maps when the file has none; `check` still fails on them. The profiles are
//! written without checkpoints (`CPUPROFILE_CHECKPOINT=off`, as before checkpoints existed):
//! with them, a SIGKILLed process leaves a complete file (tests/process_end.rs).

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

fn cpuprof(args: &[&str]) -> Output {
    Command::new(cli())
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn warnings(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.contains("warning"))
        .map(str::to_string)
        .collect()
}

/// Runs `program mode` plainly and profiled (at `hz`, into `profile`, without checkpoints):
/// the same exit status and standard output. Returns the status.
fn run_both(program: &Path, mode: &str, profile: &Path, hz: &str) -> Option<i32> {
    let plain = Command::new(program).args([mode, "10"]).output().unwrap();
    let profiled = Command::new(program)
        .args([mode, "10"])
        .env("LD_PRELOAD", lib())
        .env("CPUPROFILE", profile)
        .env("CPUPROFILE_CHECKPOINT", "off")
        .env("CPUPROFILE_FREQUENCY", hz)
        .output()
        .unwrap();
    assert_eq!(plain.status, profiled.status, "{mode}: {profiled:?}");
    assert_eq!(plain.stdout, profiled.stdout, "{mode}");
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "checksum 1\n");
    use std::os::unix::process::ExitStatusExt;
    profiled.status.code().or(profiled.status.signal().map(|s| 128 + s))
}

/// Total samples, the period and cumulative shares from `cpuprof top --cum`.
fn top(args: &[&str]) -> (u64, HashMap<String, f64>, Output) {
    let mut full = vec!["top", "--cum", "-n", "1000"];
    full.extend_from_slice(args);
    let out = cpuprof(&full);
    assert!(out.status.success(), "top {args:?}: {}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let total = table
        .lines()
        .find_map(|l| l.strip_prefix("Total: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("Total line");
    (total, cum_percentages(&table), out)
}

/// The sampling period of a profile, from its header (slot 3 of 8 bytes).
fn period_us(profile: &Path) -> u64 {
    let bytes = std::fs::read(profile).unwrap();
    u64::from_le_bytes(bytes[24..32].try_into().unwrap())
}

/// The workload does 3 units in hot_a for 1 in hot_b: shares within four standard errors of
/// sampling (at least 4 points). CPU timers fire on the 250 Hz scheduler tick, so above 250 Hz
/// one signal carries several periods: the independent draws are 250 per CPU-second.
fn assert_known_answer(what: &str, total: u64, period_us: u64, table: &HashMap<String, f64>) {
    let (a, b) = (share(table, "hot_a"), share(table, "hot_b"));
    let draws = (total as f64 * (period_us as f64 / 4000.0).min(1.0)).max(1.0);
    let sigma = 100.0 * (0.75f64 * 0.25 / draws).sqrt();
    let margin = (4.0 * sigma).max(4.0);
    assert!(
        (a - 75.0).abs() <= margin && (b - 25.0).abs() <= margin && share(table, "main") > 95.0,
        "{what}: hot_a {a}%, hot_b {b}% of {total} samples (want 75/25 ± {margin:.1}): {table:?}"
    );
}

#[test]
fn profiles_cut_by_kill_exit_and_takeover_are_read_by_every_reader() {
    let dir = scratch_dir("cut_short");
    let program = compile_c(&dir, "cut_short.c", "cut_short", FLAGS, false);
    for mode in ["kill", "exit", "takeover"] {
        for hz in ["100", "4000"] {
            let what = format!("{mode} at {hz} Hz");
            // Named after the program, beside it: found without --binary.
            let profile = dir.join(format!("cut_short.{mode}.{hz}.prof"));
            let status = run_both(&program, mode, &profile, hz);
            assert_eq!(status, Some(if mode == "kill" { 128 + 9 } else { 0 }), "{what}");
            let p = profile.to_str().unwrap();

            let check = cpuprof(&["check", p]);
            let cut = !check.status.success();
            if mode == "kill" {
                assert!(cut, "{what}: SIGKILL cannot leave a complete profile: {check:?}");
            }
            if cut {
                assert_eq!(check.status.code(), Some(1), "{what}");
                assert!(stderr(&check).contains("records"), "{what}: {}", stderr(&check));
            }
            let expected_warnings = usize::from(cut);

            let (total, table, out) = top(&[p]);
            assert_eq!(warnings(&out).len(), expected_warnings, "{what}: {}", stderr(&out));
            if cut {
                let w = &warnings(&out)[0];
                assert!(
                    w.contains("the trailer") && w.contains("found beside the profile"),
                    "{what}: {w}"
                );
            }
            assert_known_answer(&format!("top, {what}"), total, period_us(&profile), &table);

            // --binary names the executable when nothing sits beside the profile.
            let elsewhere = dir.join(format!("elsewhere.{mode}.{hz}"));
            std::fs::copy(&profile, &elsewhere).unwrap();
            let e = elsewhere.to_str().unwrap();
            let (_, unnamed, out) = top(&[e]);
            if cut {
                assert!(stderr(&out).contains("--binary PROGRAM"), "{what}: {}", stderr(&out));
                assert_eq!(share(&unnamed, "hot_a"), 0.0, "{what}: no binary, no names");
            }
            let (total, table, out) = top(&["--binary", program.to_str().unwrap(), e]);
            assert_eq!(warnings(&out).len(), expected_warnings, "{what}: {}", stderr(&out));
            assert_known_answer(&format!("top --binary, {what}"), total, period_us(&profile), &table);

            let folded = cpuprof(&["collapse", p]);
            assert!(folded.status.success(), "{what}: {}", stderr(&folded));
            assert_eq!(warnings(&folded).len(), expected_warnings, "{what}");
            let text = String::from_utf8_lossy(&folded.stdout);
            let folded_total: u64 = text
                .lines()
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
                .sum();
            assert_eq!(folded_total, total, "{what}: collapse keeps every sample");
            assert!(text.contains("main;work;hot_a"), "{what}: {text}");

            let pprof = dir.join(format!("{mode}.{hz}.pb.gz"));
            let out = cpuprof(&["convert", "--to", "pprof", "-o", pprof.to_str().unwrap(), p]);
            assert!(out.status.success(), "{what}: {}", stderr(&out));
            assert_eq!(warnings(&out).len(), expected_warnings, "{what}");
            let go = run_ok(
                Path::new("go"),
                &[
                    "tool",
                    "pprof",
                    "-top",
                    "-cum",
                    "-nodecount=1000",
                    pprof.to_str().unwrap(),
                ],
                &[("HOME", std::env::temp_dir().to_str().unwrap())],
            );
            let go_table = cum_percentages(&String::from_utf8_lossy(&go.stdout));
            assert!(
                (share(&go_table, "hot_a") - share(&table, "hot_a")).abs() < 0.2,
                "{what}: go tool pprof on the conversion {go_table:?} vs top {table:?}"
            );

            let dcpi = dir.join(format!("{mode}.{hz}.dcpi"));
            let out = cpuprof(&["convert", "--to", "dcpi", "-o", dcpi.to_str().unwrap(), p]);
            assert!(out.status.success(), "{what}: {}", stderr(&out));
            assert_eq!(warnings(&out).len(), expected_warnings, "{what}");

            let svg = dir.join(format!("{mode}.{hz}.svg"));
            let out = cpuprof(&["flamegraph", "-o", svg.to_str().unwrap(), p]);
            assert!(out.status.success(), "{what}: {}", stderr(&out));
            assert_eq!(warnings(&out).len(), expected_warnings, "{what}");
            assert!(std::fs::read_to_string(&svg).unwrap().contains("hot_a"), "{what}");
        }
    }
}

#[test]
fn google_pprof_reads_the_same_shares() {
    // google-pprof places a cut profile's addresses only for a fixed-address executable
    // (it has no maps to find a PIE's load address), so the comparison uses one.
    let dir = scratch_dir("cut_short_gpprof");
    let program = compile_c(
        &dir,
        "cut_short.c",
        "fixed",
        &["-O2", "-fno-omit-frame-pointer", "-no-pie"],
        false,
    );
    for mode in ["kill", "exit", "takeover"] {
        let profile = dir.join(format!("fixed.{mode}.prof"));
        run_both(&program, mode, &profile, "4000");
        let (total, ours, _) = top(&[profile.to_str().unwrap()]);
        let theirs = google_pprof(&program, &profile);
        for f in ["hot_a", "hot_b", "main"] {
            assert!(
                (share(&ours, f) - share(&theirs, f)).abs() < 0.2,
                "{mode}: {f}: ours {ours:?}, google-pprof {theirs:?}"
            );
        }
        assert_known_answer(mode, total, 250, &ours);
    }
}

/// Byte offsets where each whole record of a little-endian 64-bit profile ends, with its
/// count, and where the trailer starts.
fn record_ends(bytes: &[u8]) -> (Vec<(usize, u64)>, usize) {
    let slot = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let mut at = 40;
    let mut ends = Vec::new();
    while slot(at) != 0 {
        let end = at + 8 * (2 + slot(at + 8) as usize);
        ends.push((end, slot(at)));
        at = end;
    }
    (ends, at)
}

#[test]
fn truncation_anywhere_after_the_header_keeps_the_whole_records() {
    let dir = scratch_dir("cut_short_truncated");
    let hot = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let full = dir.join("full.prof");
    run_preloaded(&hot, &["1.0"], &full, &[("CPUPROFILE_FREQUENCY", "1000")]);
    let bytes = std::fs::read(&full).unwrap();
    let (ends, trailer) = record_ends(&bytes);
    assert!(ends.len() >= 2, "{ends:?}");
    let (first_end, _) = ends[0];
    // Just past the header, inside a count, inside a depth, mid-chain, mid-slot, at a record
    // boundary, in the trailer.
    let cuts = [
        40,
        44,
        first_end - 20,
        first_end - 8,
        first_end,
        first_end + 12,
        first_end + 3,
        trailer - 5,
        trailer,
        trailer + 8,
        trailer + 16,
    ];
    for cut in cuts {
        let path = dir.join(format!("cut_{cut}.prof"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let p = path.to_str().unwrap();
        let whole: u64 = ends.iter().filter(|&&(end, _)| end <= cut).map(|&(_, c)| c).sum();
        let (total, table, out) = top(&["--binary", hot.to_str().unwrap(), p]);
        assert_eq!(total, whole, "cut at {cut}");
        let w = warnings(&out);
        assert_eq!(w.len(), 1, "cut at {cut}: {}", stderr(&out));
        assert!(
            w[0].contains("the trailer and the maps") || w[0].contains("the trailer, the maps"),
            "{w:?}"
        );
        if cut < trailer {
            let partial = !ends.iter().any(|&(end, _)| end == cut) && cut != 40;
            assert_eq!(w[0].contains("the last record"), partial, "cut at {cut}: {w:?}");
        }
        if total > 0 {
            assert_eq!(share(&table, "main"), 100.0, "cut at {cut}: {table:?}");
        }
        assert_eq!(cpuprof(&["check", p]).status.code(), Some(1), "cut at {cut}");
    }
    // Empty, as gperftools leaves a process killed before its buffer filled: said so.
    let empty = dir.join("empty.prof");
    std::fs::write(&empty, b"").unwrap();
    let out = cpuprof(&["top", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    // Inside the header: not a profile, for every command.
    let path = dir.join("header.prof");
    std::fs::write(&path, &bytes[..24]).unwrap();
    for command in ["top", "collapse", "check"] {
        assert_eq!(cpuprof(&[command, path.to_str().unwrap()]).status.code(), Some(1));
    }
    // The wrong executable is refused, not used to put wrong names on the addresses.
    let cut = dir.join("wrong.prof");
    std::fs::write(&cut, &bytes[..trailer]).unwrap();
    let (_, table, out) = top(&["--binary", "/bin/true", cut.to_str().unwrap()]);
    assert!(stderr(&out).contains("do not fit"), "{}", stderr(&out));
    assert_eq!(share(&table, "hot_a"), 0.0);
}

#[test]
fn merge_and_diff_read_cut_profiles() {
    let dir = scratch_dir("cut_short_merge");
    let program: PathBuf = compile_c(&dir, "cut_short.c", "cut_short", FLAGS, false);
    let (a, b) = (dir.join("cut_short.a.prof"), dir.join("cut_short.b.prof"));
    run_both(&program, "kill", &a, "1000");
    run_both(&program, "kill", &b, "1000");
    let merged = dir.join("merged.prof");
    let out = cpuprof(&[
        "merge",
        "-o",
        merged.to_str().unwrap(),
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(warnings(&out).len(), 2, "one per file: {}", stderr(&out));
    // Both processes' addresses went through the executable's maps into one program.
    let (total, table, _) = top(&["--binary", program.to_str().unwrap(), merged.to_str().unwrap()]);
    let (ta, _, _) = top(&[a.to_str().unwrap()]);
    let (tb, _, _) = top(&[b.to_str().unwrap()]);
    assert_eq!(total, ta + tb);
    assert_known_answer("merged", total, 1000, &table);
    let out = cpuprof(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(matches!(out.status.code(), Some(0 | 3)), "{}", stderr(&out));
    assert_eq!(warnings(&out).len(), 2, "one per file: {}", stderr(&out));
}
