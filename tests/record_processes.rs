//! `cpuprof record` follows every process it starts: a line per profile written (file, pid,
//! samples, the process's command line or type), one report per program, named as its user
//! named it, and the processes of one program (and one Chromium-style `--type`) merged.

mod support;

use std::process::{Command, Output};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

fn record(dir: &std::path::Path, args: &[&str]) -> Output {
    record_with(dir, args, &[])
}

fn record_with(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(cli())
        .current_dir(dir)
        .args(["record", "-F", "1000", "-n", "100", "-o", "run.prof"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    out
}

fn cpuprof(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(cli()).current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `path pid N samples description` lines of the summary.
fn profile_lines(summary: &str) -> Vec<(String, u64, String)> {
    summary
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 6 && cols[1] == "pid" && cols[4] == "samples")
                .then(|| (cols[0].to_string(), cols[3].parse().unwrap(), cols[5..].join(" ")))
        })
        .collect()
}

/// The pid the summary lists for the profile `path`.
fn pid_of(summary: &str, path: &str) -> u32 {
    summary
        .lines()
        .find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() > 2 && cols[0] == path && cols[1] == "pid").then(|| cols[2].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {path} in {summary}"))
}

/// The report that follows the line naming `heading`.
fn report_after<'a>(summary: &'a str, heading: &str) -> &'a str {
    let start = summary
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in {summary}"));
    let rest = &summary[start..];
    let end = rest[1..].find("\ncpuprof: ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

#[test]
fn both_programs_of_a_shell_command_are_reported() {
    let dir = scratch_dir("record_two");
    // Two programs with different answers: hot_a 75 % in `a`, 60 % in `b`.
    let a = compile_c(&dir, "hot.c", "a", FLAGS, false);
    let b = compile_c(
        &dir,
        "hot.c",
        "b",
        &["-O2", "-fno-omit-frame-pointer", "-DHOT_B_WORK=2"],
        false,
    );
    let out = record(&dir, &["--", "sh", "-c", "./a 0.6; ./b 0.6"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("checksum 1").count(), 2);
    let summary = String::from_utf8_lossy(&out.stderr);
    let lines = profile_lines(&summary);
    let mut hot_a = Vec::new();
    for program in [&a, &b] {
        // Named by their argv[0], described by their command lines.
        let name = program.file_name().unwrap().to_str().unwrap();
        let line = lines
            .iter()
            .find(|l| l.2 == format!("./{name} 0.6"))
            .unwrap_or_else(|| panic!("{name}: {summary}"));
        assert!(line.0.starts_with("run.prof_") && line.1 > 300, "{line:?}");
        let table = cum_percentages(report_after(&summary, &format!("cpuprof: {name}, pid")));
        hot_a.push(share(&table, "hot_a"));
    }
    // 75 % and 60 % by construction; sampling on a loaded machine moves each by a few points,
    // so what is checked is that each report holds its own program's samples.
    assert!(
        hot_a[0] > hot_a[1] && hot_a.iter().all(|&s| (50.0..=90.0).contains(&s)),
        "hot_a in a and b: {hot_a:?}: {summary}"
    );
    // The shell's own profile is listed first, whatever it holds, named as it was given with
    // the file it runs.
    assert_eq!(lines.len(), 3, "{summary}");
    assert_eq!(lines[0].0, "run.prof", "{summary}");
    assert!(lines[0].2.starts_with("sh -c "), "{summary}");
}

#[test]
fn a_program_in_several_processes_is_merged() {
    let dir = scratch_dir("record_self_exec");
    let program = compile_c(&dir, "self_exec.c", "self_exec", FLAGS, false);
    let out = record(&dir, &["--", "./self_exec", "3"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "checksum 1\n");
    let summary = String::from_utf8_lossy(&out.stderr);
    let lines = profile_lines(&summary);
    assert_eq!(lines.len(), 4, "{summary}");
    assert!(program.ends_with("self_exec"));
    assert!(
        lines.iter().all(|l| l.2.starts_with("./self_exec ") && l.1 > 150),
        "{summary}"
    );
    // The group's heading in the list, then its processes, the command's first.
    assert!(summary.contains("\n  self_exec: 4 processes, "), "{summary}");
    assert_eq!(
        (lines[0].0.as_str(), lines[0].2.as_str()),
        ("run.prof", "./self_exec 3"),
        "{summary}"
    );
    let report = report_after(&summary, "cpuprof: self_exec: 4 processes merged");
    let total: u64 = lines.iter().map(|l| l.1).sum();
    assert!(report.contains(&format!("Total: {total} samples")), "{report}");
    let table = cum_percentages(report);
    let (got, main) = (share(&table, "hot_a"), share(&table, "main"));
    assert!((60.0..=90.0).contains(&got) && main > 95.0, "hot_a {got}%: {report}");

    // Each process alone on request.
    let out = record(&dir, &["--merge=none", "--", "./self_exec", "1"]);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert_eq!(summary.matches("Total:").count(), 2, "{summary}");
    assert!(!summary.contains("merged"), "{summary}");
}

#[test]
fn a_program_run_by_another_name_is_reported_by_that_name() {
    let dir = scratch_dir("record_symlink");
    let program = compile_c(&dir, "hot.c", "hot", FLAGS, false);
    let exe = std::fs::canonicalize(&program).unwrap();
    let exe = exe.to_str().unwrap();
    // As `redis-server` is a symlink to `redis-check-rdb`.
    std::os::unix::fs::symlink("hot", dir.join("given-name")).unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());

    // The command itself, found in $PATH.
    let out = record_with(&dir, &["--", "given-name", "0.3"], &[("PATH", &path)]);
    let summary = String::from_utf8_lossy(&out.stderr);
    let lines = profile_lines(&summary);
    assert_eq!(lines.len(), 1, "{summary}");
    assert_eq!(lines[0].2, "given-name 0.3", "{summary}");
    let report = report_after(&summary, &format!("cpuprof: given-name ({exe}), pid"));
    assert!(share(&cum_percentages(report), "hot_a") > 50.0, "{report}");

    // A process it starts, named by its argv[0].
    let out = record(&dir, &["--", "sh", "-c", "./given-name 0.3; true"]);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        profile_lines(&summary).iter().any(|l| l.2 == "./given-name 0.3"),
        "{summary}"
    );
    report_after(&summary, &format!("cpuprof: given-name ({exe}), pid"));
}

#[test]
fn processes_of_one_program_are_reported_by_their_type() {
    let dir = scratch_dir("record_types");
    compile_c(&dir, "typed_children.c", "typed", FLAGS, false);
    let out = record(&dir, &["--", "./typed", "0.3"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "checksum 1\n");
    let summary = String::from_utf8_lossy(&out.stderr);
    let lines = profile_lines(&summary);
    let of_type =
        |description: &str| -> Vec<&(String, u64, String)> { lines.iter().filter(|l| l.2 == description).collect() };
    assert_eq!(of_type("typed (a)").len(), 2, "{summary}");
    assert_eq!(of_type("typed (b)").len(), 1, "{summary}");
    assert_eq!(of_type("typed (utility: net)").len(), 1, "{summary}");
    // The command's own process has no type: it is the browser, listed first.
    assert_eq!(lines[0].0, "run.prof", "{summary}");
    assert_eq!(lines[0].2, "typed (browser)", "{summary}");
    assert!(summary.contains("\n  typed (a): 2 processes, "), "{summary}");

    // One report per type, holding that type's work only.
    for (heading, function) in [
        ("cpuprof: typed (a): 2 processes merged", "work_a"),
        ("cpuprof: typed (b), pid", "work_b"),
        ("cpuprof: typed (utility: net), pid", "work_net"),
        ("cpuprof: typed (browser), pid", "work_browser"),
    ] {
        let table = cum_percentages(report_after(&summary, heading));
        assert!(share(&table, function) > 70.0, "{function} in {heading}: {summary}");
        for other in ["work_a", "work_b", "work_net", "work_browser"] {
            assert!(
                other == function || share(&table, other) == 0.0,
                "{other} in {heading}: {summary}"
            );
        }
    }
    // merge=all: one report of every process, named by the program when they all run one.
    let out = record(&dir, &["--merge=all", "--", "./typed", "0.1"]);
    let all = String::from_utf8_lossy(&out.stderr);
    assert_eq!(all.matches("Total:").count(), 1, "{all}");
    assert!(all.contains("cpuprof: typed: 5 processes merged"), "{all}");

    // The process line in dump, in the protobuf's comments, and in merge when the inputs agree.
    let b = &of_type("typed (b)")[0].0;
    let (browser_pid, b_pid) = (pid_of(&summary, "run.prof"), pid_of(&summary, b));
    let b_file = dir.join(b);
    let b_file = b_file.to_str().unwrap();
    let dump = cpuprof(&dir, &["dump", b_file]);
    assert!(
        dump.contains(&format!(
            "process: pid {b_pid}, parent {browser_pid}, started\ncommand: ./typed 0.3 --lang=en --type=b\n"
        )),
        "{dump}"
    );
    let pb = dir.join("b.pb.gz");
    cpuprof(&dir, &["convert", "--to", "pprof", "-o", pb.to_str().unwrap(), b_file]);
    let comments = run_ok(
        std::path::Path::new("go"),
        &["tool", "pprof", "-comments", pb.to_str().unwrap()],
        &[("HOME", std::env::temp_dir().to_str().unwrap())],
    );
    let comments = String::from_utf8_lossy(&comments.stdout);
    assert!(
        comments.contains(&format!(
            "process {b_pid} (parent {browser_pid}, started): ./typed 0.3 --lang=en --type=b"
        )),
        "{comments}"
    );
    let a: Vec<String> = of_type("typed (a)").iter().map(|l| l.0.clone()).collect();
    cpuprof(&dir, &["merge", "-o", "same.prof", &a[0], &a[0]]);
    assert!(cpuprof(&dir, &["dump", "same.prof"]).contains("\ncommand: ./typed 0.3 --lang=en --type=a\n"));
    cpuprof(&dir, &["merge", "-o", "two.prof", &a[0], &a[1]]);
    assert!(!cpuprof(&dir, &["dump", "two.prof"]).contains("process:"));
}
