//! `cpuprof record` follows every process it starts: a line per profile written (program,
//! pid, samples), one report per program, and the processes of one program merged.

mod support;

use std::process::{Command, Output};
use support::*;

const FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

fn record(dir: &std::path::Path, args: &[&str]) -> Output {
    let out = Command::new(cli())
        .current_dir(dir)
        .args(["record", "-F", "1000", "-n", "100", "-o", "run.prof"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    out
}

/// The `path pid N samples program` lines of the summary.
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
        let name = program.to_str().unwrap();
        let line = lines
            .iter()
            .find(|l| l.2 == name)
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
    // The shell's own profile is listed first, whatever it holds.
    assert_eq!(lines.len(), 3, "{summary}");
    assert_eq!(lines[0].0, "run.prof", "{summary}");
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
    let name = std::fs::canonicalize(&program).unwrap();
    let name = name.to_str().unwrap();
    assert!(lines.iter().all(|l| l.2 == name && l.1 > 150), "{summary}");
    let report = report_after(&summary, &format!("cpuprof: {name}: 4 processes merged"));
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
