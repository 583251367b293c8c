//! `cpuprof list`: samples per source line and per instruction, on tests/c/list_lines.c, whose
//! answers are known by construction: hot_line's loop is one line; with_inline calls the
//! inlined inner_step twice, with 2:1 work. Checked against `go tool pprof -list` on the same
//! profile converted, and for binaries without line information or without their sources.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use support::*;

/// One function's listing: its (flat, cum) header and (flat, cum) per line number (or per
/// address with --disasm, in hex).
#[derive(Debug, Default)]
struct Listing {
    total: (u64, u64),
    rows: HashMap<u64, (u64, u64)>,
    text: String,
}

/// Parses `cpuprof list` or `go tool pprof -list` output (the same layout) by function.
/// `hex`: rows are addresses (--disasm) instead of line numbers.
fn parse(output: &str, hex: bool) -> HashMap<String, Listing> {
    let mut out: HashMap<String, Listing> = HashMap::new();
    let mut current: Option<String> = None;
    let count = |t: &str| if t == "." { Some(0) } else { t.parse::<u64>().ok() };
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("ROUTINE ======================== ") {
            let name = rest.split(" in ").next().unwrap().to_string();
            current = Some(name.clone());
            out.entry(name).or_default();
            continue;
        }
        let Some(listing) = current.as_ref().map(|n| out.get_mut(n).unwrap()) else {
            continue;
        };
        listing.text.push_str(line);
        listing.text.push('\n');
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() >= 3 && tokens[2] == "(flat," {
            listing.total = (count(tokens[0]).unwrap(), count(tokens[1]).unwrap());
            continue;
        }
        let (Some(flat), Some(cum), Some(place)) = (
            tokens.first().and_then(|t| count(t)),
            tokens.get(1).and_then(|t| count(t)),
            tokens.get(2).and_then(|t| t.split_once(':')).map(|(p, _)| p),
        ) else {
            continue;
        };
        let key = if hex {
            u64::from_str_radix(place, 16)
        } else {
            place.parse()
        };
        if let Ok(key) = key {
            let row = listing.rows.entry(key).or_default();
            row.0 += flat;
            row.1 += cum;
        }
    }
    out
}

/// The number of the line of `source` (tests/c/list_lines.c) containing `text`.
fn line_of(source: &Path, text: &str) -> u64 {
    let source = std::fs::read_to_string(source).unwrap();
    let i = source.lines().position(|l| l.contains(text)).unwrap();
    i as u64 + 1
}

fn cpuprof(args: &[&str]) -> String {
    String::from_utf8_lossy(&run_ok(cli(), args, &[]).stdout).into_owned()
}

/// Builds list_lines.c (from `source`) with `flags` and profiles it for `seconds` at `hz`.
fn profiled(dir: &Path, name: &str, flags: &[&str], hz: &str, seconds: &str) -> (PathBuf, PathBuf) {
    let binary = compile_c(dir, "list_lines.c", name, flags, false);
    let profile = dir.join(format!("{name}.prof"));
    let plain = run_ok(&binary, &[seconds], &[]);
    let out = run_preloaded(&binary, &[seconds], &profile, &[("CPUPROFILE_FREQUENCY", hz)]);
    assert_eq!(plain.stdout, out.stdout, "the profiled run printed something else");
    (binary, profile)
}

fn source() -> PathBuf {
    root().join("tests/c/list_lines.c")
}

#[test]
fn hot_loop_line_holds_its_functions_samples() {
    let dir = scratch_dir("list-hot-line");
    for hz in ["100", "4000"] {
        let seconds = "3";
        let (_, profile) = profiled(&dir, &format!("ll{hz}"), &["-O2"], hz, seconds);
        let text = cpuprof(&["list", "^(hot_line|with_inline|inner_step)$", profile.to_str().unwrap()]);
        let listing = parse(&text, false);
        let hot = &listing["hot_line"];
        let loop_line = line_of(&source(), "x = x * 6364136223846793005UL + i;");
        let on_loop = hot.rows.get(&loop_line).copied().unwrap_or_default();
        assert!(hot.total.0 >= 50, "too few samples in hot_line at {hz} Hz:\n{text}");
        assert!(
            on_loop.0 as f64 >= 0.9 * hot.total.0 as f64,
            "the loop line {loop_line} has {} of hot_line's {} flat samples at {hz} Hz:\n{text}",
            on_loop.0,
            hot.total.0
        );
        // Lines' flat samples add up to the function's.
        assert_eq!(hot.rows.values().map(|r| r.0).sum::<u64>(), hot.total.0, "{text}");
        // The source is shown around the hot line.
        assert!(hot.text.contains("6364136223846793005UL"), "{text}");

        // Inlined twice with 2:1 work: the caller's listing charges each call line with the
        // samples of its inlined copy, the callee's listing its own loop line.
        let caller = &listing["with_inline"];
        let (first, second) = (
            caller.rows[&line_of(&source(), "a = inner_step(n);")],
            caller.rows[&line_of(&source(), "b = inner_step(n / 2);")],
        );
        assert_eq!(caller.total.0, 0, "the caller's own code does no work:\n{text}");
        assert!(
            (first.1 + second.1) as f64 >= 0.9 * caller.total.1 as f64,
            "the two call lines should hold with_inline's cumulative samples:\n{text}"
        );
        // 2:1, within 4.5 standard errors of a 2/3 share over the looks at with_inline's
        // stacks (the default timer looks once per kernel tick however high the frequency:
        // ~300 looks here, where 1.4-2.8:1 was 2.5 standard errors and failed 1 run in ~20).
        let total: f64 = text
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .expect("Total: N samples");
        let looks = effective_observations(&profile).unwrap_or(total) * caller.total.1 as f64 / total;
        let share = first.1 as f64 / (first.1 + second.1).max(1) as f64;
        let tolerance = (4.5 * (2.0f64 / 9.0 / looks).sqrt()).max(0.07);
        assert!(
            (share - 2.0 / 3.0).abs() <= tolerance,
            "call lines' cumulative samples {} and {} are not about 2:1 at {hz} Hz (share {share:.3}, \
             2/3 +- {tolerance:.3} over {looks:.0} looks):\n{text}",
            first.1,
            second.1
        );
        let callee = &listing["inner_step"];
        let loop_line = line_of(&source(), "x ^= x >> 7;");
        assert!(
            callee.rows[&loop_line].0 as f64 >= 0.9 * callee.total.0 as f64,
            "inner_step's loop line:\n{text}"
        );
        assert_eq!(callee.total.0, first.1 + second.1, "{text}");
    }
}

/// Per-line flat and cumulative samples as `go tool pprof -list` shows them for the same
/// profile converted to protobuf, within one sample, for optimised and unoptimised builds
/// (main's lines are call sites: return addresses must be charged to the call's line).
#[test]
fn agrees_with_go_pprof_list() {
    let dir = scratch_dir("list-pprof");
    let regex = "^(main|hot_line|with_inline|inner_step)$";
    for (name, flags) in [("ll_o2", "-O2"), ("ll_o0", "-O0")] {
        let (binary, profile) = profiled(&dir, name, &[flags, "-fno-omit-frame-pointer"], "1000", "1");
        let ours = cpuprof(&["list", regex, profile.to_str().unwrap()]);
        let pb = dir.join(format!("{name}.pb.gz"));
        cpuprof(&[
            "convert",
            profile.to_str().unwrap(),
            "--to",
            "pprof",
            "-o",
            pb.to_str().unwrap(),
        ]);
        let out = run_ok(
            Path::new("go"),
            &[
                "tool",
                "pprof",
                "-sample_index=samples",
                "-list",
                regex,
                binary.to_str().unwrap(),
                pb.to_str().unwrap(),
            ],
            &[("HOME", std::env::temp_dir().to_str().unwrap())],
        );
        let theirs = String::from_utf8_lossy(&out.stdout).into_owned();
        let (a, b) = (parse(&ours, false), parse(&theirs, false));
        let names = |m: &HashMap<String, Listing>| {
            let mut v: Vec<String> = m.keys().cloned().collect();
            v.sort();
            v
        };
        assert_eq!(
            names(&a),
            names(&b),
            "functions listed (-{flags}):\n{ours}\n----\n{theirs}"
        );
        let mut compared = 0;
        for (function, listing) in &a {
            let other = &b[function];
            let lines: std::collections::BTreeSet<u64> =
                listing.rows.keys().chain(other.rows.keys()).copied().collect();
            for line in lines {
                let (x, y) = (
                    listing.rows.get(&line).copied().unwrap_or_default(),
                    other.rows.get(&line).copied().unwrap_or_default(),
                );
                assert!(
                    x.0.abs_diff(y.0) <= 1 && x.1.abs_diff(y.1) <= 1,
                    "{function} line {line} ({flags}): cpuprof {x:?}, go tool pprof {y:?}\n{ours}\n----\n{theirs}"
                );
                compared += (x.1 > 0) as u32;
            }
        }
        // main's call lines, hot_line's loop, with_inline's two calls, inner_step's loop.
        assert!(compared >= 5, "too few lines with samples compared ({flags}):\n{ours}");
    }
}

/// Per-instruction counts: every flat sample of the function on one of its instructions, and
/// the caller of an inlined function holds the callee's samples in its code.
#[test]
fn disasm_counts_add_up_to_the_functions_flat_total() {
    let dir = scratch_dir("list-disasm");
    let (_, profile) = profiled(&dir, "ll", &["-O2"], "1000", "1");
    let text = cpuprof(&[
        "list",
        "--disasm",
        "^(hot_line|with_inline)$",
        profile.to_str().unwrap(),
    ]);
    let listing = parse(&text, true);
    let lines = parse(
        &cpuprof(&["list", "^(hot_line|inner_step)$", profile.to_str().unwrap()]),
        false,
    );
    let hot = &listing["hot_line"];
    assert!(hot.total.0 >= 100, "{text}");
    assert_eq!(hot.rows.values().map(|r| r.0).sum::<u64>(), hot.total.0, "{text}");
    assert_eq!(hot.total.0, lines["hot_line"].total.0);
    assert!(hot.text.contains("imul"), "no disassembly:\n{text}");
    assert!(
        hot.text.contains("list_lines.c:"),
        "no source lines beside the instructions:\n{text}"
    );
    let caller = &listing["with_inline"];
    assert_eq!(
        caller.rows.values().map(|r| r.0).sum::<u64>(),
        lines["inner_step"].total.0,
        "with_inline's instructions hold its inlined callee's samples:\n{text}"
    );
}

/// Without line information (a stripped copy: names from the unwind tables) samples are
/// listed per address, with a note; --disasm still disassembles. Without the source (moved
/// away), lines are listed with a note; --source-dir and --substitute find the moved tree.
#[test]
fn stripped_or_without_source_still_counts() {
    let dir = scratch_dir("list-nosource");
    let (binary, _) = profiled(&dir, "ll", &["-O2"], "1000", "0.1");
    let stripped = dir.join("ll_stripped");
    std::fs::copy(&binary, &stripped).unwrap();
    run_ok(Path::new("strip"), &["--strip-all", stripped.to_str().unwrap()], &[]);
    let profile = dir.join("stripped.prof");
    run_preloaded(&stripped, &["1"], &profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
    let text = cpuprof(&["list", r"^ll_stripped\+", profile.to_str().unwrap()]);
    let listing = parse(&text, true);
    assert!(text.contains("no line information"), "{text}");
    let flat: u64 = listing.values().map(|l| l.total.0).sum();
    assert!(
        flat >= 500,
        "the stripped program's own functions hold its samples:\n{text}"
    );
    for (name, l) in &listing {
        assert_eq!(l.rows.values().map(|r| r.0).sum::<u64>(), l.total.0, "{name}:\n{text}");
    }
    let disasm = cpuprof(&["list", "--disasm", r"^ll_stripped\+", profile.to_str().unwrap()]);
    let by_instruction = parse(&disasm, true);
    for (name, l) in &by_instruction {
        assert_eq!(
            l.rows.values().map(|r| r.0).sum::<u64>(),
            l.total.0,
            "{name}:\n{disasm}"
        );
    }
    assert!(disasm.contains("imul"), "{disasm}");

    // Built from a tree that is then moved.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("src")).unwrap();
    std::fs::copy(source(), tree.join("src/moved.c")).unwrap();
    let header = "cpu_deadline.h";
    std::fs::copy(root().join("tests/c").join(header), tree.join("src").join(header)).unwrap();
    let built = dir.join("moved");
    run_ok(
        Path::new("cc"),
        &[
            "-g",
            "-O2",
            tree.join("src/moved.c").to_str().unwrap(),
            "-o",
            built.to_str().unwrap(),
        ],
        &[],
    );
    let moved_profile = dir.join("moved.prof");
    run_preloaded(&built, &["1"], &moved_profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
    let new_home = dir.join("elsewhere");
    std::fs::rename(&tree, &new_home).unwrap();
    let p = moved_profile.to_str().unwrap();
    let loop_line = line_of(&source(), "x = x * 6364136223846793005UL + i;");
    let missing = cpuprof(&["list", "^hot_line$", p]);
    assert!(
        missing.contains("source not available") && missing.contains("--source-dir"),
        "{missing}"
    );
    let counts = &parse(&missing, false)["hot_line"];
    assert!(
        counts.rows[&loop_line].0 as f64 >= 0.9 * counts.total.0 as f64,
        "{missing}"
    );
    assert!(!missing.contains("6364136223846793005UL"), "{missing}");
    let substitute = format!("{}={}", tree.display(), new_home.display());
    for extra in [
        ["--source-dir", new_home.to_str().unwrap()],
        ["--substitute", substitute.as_str()],
    ] {
        let found = cpuprof(&[&["list", "^hot_line$", p], &extra[..]].concat());
        assert!(found.contains("6364136223846793005UL"), "{extra:?}:\n{found}");
        assert!(found.contains("source read from"), "{found}");
        let mut with_samples = parse(&found, false).remove("hot_line").unwrap().rows;
        with_samples.retain(|_, c| c.1 > 0);
        assert_eq!(with_samples, counts.rows, "{found}");
    }
}

/// A pattern that matches nothing is an error, not an empty listing.
#[test]
fn no_match_is_an_error() {
    let dir = scratch_dir("list-nomatch");
    let (_, profile) = profiled(&dir, "ll", &["-O2"], "1000", "0.2");
    let out = std::process::Command::new(cli())
        .args(["list", "^no_such_function$", profile.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no function"), "{out:?}");
}

/// A source path in DWARF is input like any other: one naming a device (`/dev/zero`, which
/// never ends) or a FIFO (whose open waits for a writer) is not read; the lines are listed
/// with the reason. Built from list_lines.c with a `#line` directive naming such a file.
#[test]
fn source_path_naming_a_device_or_fifo_is_not_read() {
    let dir = scratch_dir("list-hostile-source");
    let fifo = dir.join("pipe.c");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let text = std::fs::read_to_string(source()).unwrap();
    for (name, named) in [("zero", Path::new("/dev/zero")), ("fifo", fifo.as_path())] {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, format!("#line 1 \"{}\"\n{text}", named.display())).unwrap();
        let binary = dir.join(name);
        // The header beside the real source: a compile error would make cc show the line from
        // the #line file, reading /dev/zero without end.
        let include = root().join("tests/c");
        run_ok(
            Path::new("cc"),
            &[
                "-g",
                "-O2",
                "-I",
                include.to_str().unwrap(),
                c.to_str().unwrap(),
                "-o",
                binary.to_str().unwrap(),
            ],
            &[],
        );
        let profile = dir.join(format!("{name}.prof"));
        run_preloaded(&binary, &["0.5"], &profile, &[("CPUPROFILE_FREQUENCY", "1000")]);
        // A hang is the failure looked for: give up (and fail) after a generous bound.
        let mut child = std::process::Command::new(cli())
            .args(["list", "^hot_line$", profile.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("cpuprof list hung on a source path naming {}", named.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("not a regular file"), "{listing}");
        let hot = &parse(&listing, false)["hot_line"];
        let loop_line = line_of(&source(), "x = x * 6364136223846793005UL + i;");
        assert!(
            hot.total.0 > 0 && hot.rows[&loop_line].0 as f64 >= 0.9 * hot.total.0 as f64,
            "{listing}"
        );
    }
}
