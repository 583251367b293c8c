//! Processes a profiled program runs (tests/c/spawner.c) inherit `LD_PRELOAD` and `CPUPROFILE`
//! and write their own profiles, but say nothing on the stderr they share with the program:
//! what the program captures of its children is what it captures without the profiler.

mod support;

use std::process::Command;
use support::*;

#[test]
fn what_a_program_captures_of_its_children_is_unchanged() {
    let dir = scratch_dir("descendants");
    let program = compile_c(&dir, "spawner.c", "spawner", &["-O1"], false);
    let plain = Command::new(&program).args(["system", "300"]).output().unwrap();
    assert!(plain.status.success());
    let profile = dir.join("p.prof");
    let profiled = {
        let _alone = alone();
        Command::new(&program)
            .args(["system", "300"])
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE", &profile)
            .output()
            .unwrap()
    };
    assert_eq!(profiled.status.code(), plain.status.code());
    assert_eq!(
        String::from_utf8_lossy(&profiled.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "captured output"
    );
    let stdout = String::from_utf8_lossy(&plain.stdout);
    assert!(
        stdout.contains("system 300 failed 0") && stdout.contains("captured: to-stderr"),
        "{stdout}"
    );
    // Only the program the user started speaks.
    let stderr = String::from_utf8_lossy(&profiled.stderr);
    assert_eq!(stderr.matches("PROFILE:").count(), 1, "{stderr}");
    // The children's profiles are there: one per process system() started (sh execs `true`
    // in place), and the popen shells' and their commands'.
    let children: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("p.prof_"))
        .collect();
    assert!(children.len() >= 300, "{} child profiles", children.len());
    for path in &children {
        read_profile(path);
    }
}
