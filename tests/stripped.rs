//! Code without symbols: a fully stripped binary's functions are told apart by its unwind
//! tables (`object+0xSTART` rows, START its link-time address) in `top`, `collapse` and
//! `convert`; code not even they cover stays one `[object]` row, and in the protobuf an
//! address with its mapping and no function, for the reader to symbolise. And stacks end at
//! their thread's root (`_start`, `clone3`) once libc's internal functions are named.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// Compiles tests/c/stripped.c at -O2 and strips a copy of it of every symbol but the
/// exported ones (`main`, in .dynsym with -rdynamic, which a name lookup by nearest preceding
/// symbol would charge the static functions to). Returns (unstripped, stripped), whose code
/// is the same at the same addresses.
fn stripped_pair(dir: &Path) -> (PathBuf, PathBuf) {
    let full = compile_c(dir, "stripped.c", "stripped_full", &["-O2", "-rdynamic"], false);
    let stripped = dir.join("stripped");
    std::fs::copy(&full, &stripped).unwrap();
    run_ok(Path::new("strip"), &["--strip-all", stripped.to_str().unwrap()], &[]);
    let nm = Command::new("nm").arg(&stripped).output().unwrap();
    assert!(
        String::from_utf8_lossy(&nm.stderr).contains("no symbols"),
        "strip left symbols: {}",
        String::from_utf8_lossy(&nm.stdout)
    );
    (full, stripped)
}

/// Link-time address of each function symbol of `binary`, by name (`nm`).
fn nm_addresses(binary: &Path) -> HashMap<String, u64> {
    let out = run_ok(Path::new("nm"), &[binary.to_str().unwrap()], &[]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols[..] {
                [addr, "t" | "T", name] => Some((name.to_string(), u64::from_str_radix(addr, 16).ok()?)),
                _ => None,
            }
        })
        .collect()
}

fn cpuprof(args: &[&str]) -> String {
    String::from_utf8_lossy(&run_ok(cli(), args, &[]).stdout).into_owned()
}

fn go_pprof_output(args: &[&str]) -> String {
    let out = run_ok(
        Path::new("go"),
        &[&["tool", "pprof"], args].concat(),
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Samples per leaf (last frame) in folded stacks, as percentages of all samples.
fn leaf_percentages(folded: &str) -> HashMap<String, f64> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        *counts.entry(stack.rsplit(';').next().unwrap().to_string()).or_default() += count;
        total += count;
    }
    assert!(total > 0, "no samples in {folded}");
    counts
        .into_iter()
        .map(|(k, v)| (k, 100.0 * v as f64 / total as f64))
        .collect()
}

/// Percentage of samples whose folded stack holds the frame `name`.
fn stack_percentage(folded: &str, name: &str) -> f64 {
    let (mut with, mut total) = (0, 0);
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let count: u64 = count.parse().unwrap();
        total += count;
        if stack.split(';').any(|f| f == name) {
            with += count;
        }
    }
    assert!(total > 0, "no samples in {folded}");
    100.0 * with as f64 / total as f64
}

/// Runs `program args` plainly and under the profiler (with `env`); both must exit 0 with the
/// same first line of output (the workload's checksum).
fn run_both(program: &Path, args: &[&str], profile: &Path, env: &[(&str, &str)]) {
    let plain = run_ok(program, args, &[]);
    let profiled = run_preloaded(program, args, profile, env);
    let first = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_string);
    assert_eq!(first(&plain), first(&profiled));
}

#[test]
fn stripped_functions_are_rows_at_their_link_time_addresses() {
    let dir = scratch_dir("stripped");
    let (full, stripped) = stripped_pair(&dir);
    let addresses = nm_addresses(&full);
    // 1:2:3 of the CPU time; ~1000 samples (4 s at 250 Hz) make ±4 points about three
    // standard deviations of sampling error.
    let expected: Vec<(String, f64)> = [
        ("spin_one", 100.0 / 6.0),
        ("spin_two", 200.0 / 6.0),
        ("spin_three", 50.0),
    ]
    .iter()
    .map(|&(f, share)| (format!("stripped+{:#x}", addresses[f]), share))
    .collect();
    let profile = dir.join("stripped.prof");
    run_both(&stripped, &["4"], &profile, &[("CPUPROFILE_FREQUENCY", "250")]);
    let path = profile.to_str().unwrap();

    // Cumulative shares, which include the clock reads each function makes.
    let top = cpuprof(&["top", "--cum", "-n", "1000", path]);
    let table = cum_percentages(&top);
    for (row, share) in &expected {
        let got = table.get(row).copied().unwrap_or(0.0);
        assert!(
            (got - share).abs() <= 4.0,
            "top: {row} {got}%, want {share:.1} ± 4:\n{top}"
        );
    }
    assert!(!top.contains("[stripped]"), "unnamed code left in top:\n{top}");

    let folded = cpuprof(&["collapse", path]);
    for (row, share) in &expected {
        let got = stack_percentage(&folded, row);
        assert!(
            (got - share).abs() <= 4.0,
            "collapse: {row} {got}%, want {share:.1} ± 4:\n{folded}"
        );
    }

    // The protobuf carries the same names, read back by go tool pprof.
    let pb = dir.join("stripped.pb.gz");
    cpuprof(&["convert", "--to", "pprof", "-o", pb.to_str().unwrap(), path]);
    let go_top = go_pprof_output(&["-top", "-cum", "-nodecount=1000", pb.to_str().unwrap()]);
    let go_table = cum_percentages(&go_top);
    for (row, share) in &expected {
        let got = go_table.get(row).copied().unwrap_or(0.0);
        assert!(
            (got - share).abs() <= 4.0,
            "go tool pprof: {row} {got}%, want {share:.1} ± 4:\n{go_top}"
        );
    }
}

#[test]
fn code_no_unwind_table_covers_stays_unnamed_for_the_reader() {
    let dir = scratch_dir("stripped_bare");
    let (_, stripped) = stripped_pair(&dir);
    for frequency in ["100", "4000"] {
        let profile = dir.join(format!("bare-{frequency}.prof"));
        run_both(
            &stripped,
            &["1", "bare"],
            &profile,
            &[("CPUPROFILE_FREQUENCY", frequency)],
        );
        let path = profile.to_str().unwrap();

        // One row for the object, as before unwind tables were read, in top and collapse.
        let flat = percentages(&cpuprof(&["top", "-n", "1000", path]), 1);
        assert!(share(&flat, "[stripped]") >= 90.0, "{frequency} Hz: top {flat:?}");
        let leaves = leaf_percentages(&cpuprof(&["collapse", path]));
        assert!(
            share(&leaves, "[stripped]") >= 90.0,
            "{frequency} Hz: collapse {leaves:?}"
        );

        // In the protobuf: the address and its mapping, no function (pprof -raw lists such a
        // location as `ID: 0xADDRESS M=MAPPING` and nothing after).
        let pb = dir.join(format!("bare-{frequency}.pb.gz"));
        cpuprof(&["convert", "--to", "pprof", "-o", pb.to_str().unwrap(), path]);
        let raw = go_pprof_output(&["-raw", pb.to_str().unwrap()]);
        assert!(!raw.contains("[stripped]"), "{frequency} Hz: a baked-in name:\n{raw}");
        let mappings = raw.split("\nMappings\n").nth(1).expect("a Mappings section");
        let mapping = mappings
            .lines()
            .find(|l| l.contains(&format!(" {} ", stripped.display())))
            .and_then(|l| l.split(':').next())
            .unwrap_or_else(|| panic!("no mapping of {}:\n{raw}", stripped.display()));
        let unnamed = raw
            .lines()
            .filter(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() == 3
                    && cols[0].ends_with(':')
                    && cols[1].starts_with("0x")
                    && cols[2] == format!("M={mapping}")
            })
            .count();
        assert!(
            unnamed >= 1,
            "{frequency} Hz: no unnamed location in mapping {mapping}:\n{raw}"
        );
    }
}

#[test]
fn unnamed_locations_let_pprof_symbolise_later() {
    // The binary is gone when the profile is converted (moved after the run), so none of its
    // addresses can be named then; given the binary afterwards, pprof names them itself.
    let dir = scratch_dir("stripped_later");
    let (full, _) = stripped_pair(&dir);
    let program = dir.join("program");
    std::fs::copy(&full, &program).unwrap();
    let profile = dir.join("later.prof");
    run_both(&program, &["4"], &profile, &[("CPUPROFILE_FREQUENCY", "250")]);
    let moved = dir.join("program.moved");
    std::fs::rename(&program, &moved).unwrap();
    let pb = dir.join("later.pb.gz");
    cpuprof(&[
        "convert",
        "--to",
        "pprof",
        "-o",
        pb.to_str().unwrap(),
        profile.to_str().unwrap(),
    ]);
    let raw = go_pprof_output(&["-raw", pb.to_str().unwrap()]);
    assert!(!raw.contains("[program]"), "a baked-in name:\n{raw}");
    let table = cum_percentages(&go_pprof_output(&[
        "-top",
        "-cum",
        "-nodecount=1000",
        moved.to_str().unwrap(),
        pb.to_str().unwrap(),
    ]));
    for (function, want) in [
        ("spin_one", 100.0 / 6.0),
        ("spin_two", 200.0 / 6.0),
        ("spin_three", 50.0),
    ] {
        let got = share(&table, function);
        assert!(
            (got - want).abs() <= 6.0,
            "{function} {got}%, want {want:.1} ± 6: {table:?}"
        );
    }
}

/// How libc's `clone3` is named in stacks: by its symbol when libc's debug file is found, else
/// by the unwind-table extent its child side has (`libc.so.6+0xSTART`, START within clone3,
/// whose extent is found from libc6-dbg's symbol table).
fn is_clone3(name: &str, libc: &Path, clone3: (u64, u64)) -> bool {
    if name.ends_with("clone3") || name.ends_with("clone") {
        return true;
    }
    let prefix = format!("{}+0x", libc.file_name().unwrap().to_str().unwrap());
    name.strip_prefix(&prefix)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .is_some_and(|start| (clone3.0..clone3.0 + clone3.1).contains(&start))
}

/// Start and size of `clone3` in `libc`, from its separate debug file (libc6-dbg).
fn clone3_extent(libc: &Path) -> (u64, u64) {
    let notes = run_ok(Path::new("readelf"), &["-n", libc.to_str().unwrap()], &[]);
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build-id", libc.display()));
    let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    assert!(Path::new(&debug).exists(), "{debug} missing: install libc6-dbg");
    let nm = run_ok(Path::new("nm"), &["-S", &debug], &[]);
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols[..] {
                [start, size, _, "__clone3" | "clone3"] => Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(size, 16).ok()?,
                )),
                _ => None,
            }
        })
        .expect("clone3 in libc's symbol table")
}

#[test]
fn stacks_reach_their_threads_roots() {
    let dir = scratch_dir("roots");
    let roots = compile_c(&dir, "roots.c", "roots", &["-O2"], false);
    for frequency in ["100", "4000"] {
        let profile = dir.join(format!("roots-{frequency}.prof"));
        run_both(&roots, &["3", "1"], &profile, &[("CPUPROFILE_FREQUENCY", frequency)]);
        let libc = read_profile(&profile)
            .maps
            .entries
            .iter()
            .map(|m| PathBuf::from(&m.path))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
            })
            .expect("libc in the maps");
        let clone3 = clone3_extent(&libc);

        let folded = cpuprof(&["collapse", profile.to_str().unwrap()]);
        let (mut main, mut threads, mut total) = (0u64, 0u64, 0u64);
        for line in folded.lines() {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            let count: u64 = count.parse().unwrap();
            let root = stack.split(';').next().unwrap();
            total += count;
            if root == "_start" {
                main += count;
            } else if is_clone3(root, &libc, clone3) {
                threads += count;
            }
        }
        let pct = |n: u64| 100.0 * n as f64 / total as f64;
        assert!(
            pct(main + threads) >= 95.0,
            "{frequency} Hz: {:.1}% reach _start, {:.1}% clone3:\n{folded}",
            pct(main),
            pct(threads)
        );
        // Each of the four threads burns a quarter: the main thread's stacks are complete too.
        assert!(
            (pct(main) - 25.0).abs() <= 6.0,
            "{frequency} Hz: _start {:.1}%",
            pct(main)
        );
    }
}
