//! Debian's Chromium, a fair summary of what large C++ programs do (a zygote that must stay
//! single-threaded, children forked from it and from its own launcher, a crashpad handler,
//! renderers ended by SIGTERM, many threads), runs under the profiler as it runs without it,
//! and its processes leave complete profiles that every reader reads.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const BINARY: &str = "/usr/lib/chromium/chromium";

/// Takes a headless screenshot of tests/browser/chromium_page.html (it draws and computes for
/// ~2 s), with `env`, in a fresh user data directory under `dir`.
fn screenshot(dir: &Path, env: &[(&str, &str)]) -> (Output, PathBuf) {
    let shot = dir.join("out.png");
    let user_data = dir.join("user-data");
    let page = root().join("tests/browser/chromium_page.html");
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-quic",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", user_data.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out, shot)
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000)
}

#[test]
fn chromium_runs_unchanged_and_its_processes_leave_complete_profiles() {
    if !require_tools(&[CHROMIUM, BINARY]) {
        return;
    }
    let plain_dir = scratch_dir("chromium-plain");
    let (plain, plain_shot) = screenshot(&plain_dir, &[]);
    assert!(plain.status.success(), "plain chromium: {:?}", plain.status);
    assert!(is_png(&plain_shot));

    let dir = scratch_dir("chromium-profiled");
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let base = profiles.join("chromium.prof");
    let (profiled, shot) = {
        let _alone = alone();
        screenshot(
            &dir,
            &[
                ("LD_PRELOAD", lib().to_str().unwrap()),
                ("CPUPROFILE", base.to_str().unwrap()),
            ],
        )
    };
    let stderr = String::from_utf8_lossy(&profiled.stderr);
    assert_eq!(
        profiled.status.code(),
        plain.status.code(),
        "profiled chromium: {:?}\n{stderr}",
        profiled.status
    );
    assert!(is_png(&shot), "no screenshot under the profiler\n{stderr}");

    // Every file left is a complete profile; several processes have samples.
    let mut sampled = Vec::new();
    for entry in std::fs::read_dir(&profiles).unwrap() {
        let path = entry.unwrap().path();
        let check = Command::new(cli()).arg("check").arg(&path).output().unwrap();
        assert!(
            check.status.success(),
            "{}: {}{}",
            path.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let samples = read_profile(&path).total_samples();
        if samples > 0 {
            sampled.push((samples, path));
        }
    }
    sampled.sort();
    sampled.reverse();
    assert!(
        sampled.len() >= 3,
        "at least three processes with samples: {sampled:?}\n{stderr}"
    );
    for (samples, path) in &sampled[..3] {
        let total = |table: &std::collections::HashMap<String, f64>| table.values().fold(0.0, |a: f64, &b| a.max(b));
        // Read by our reader and by both real ones: the highest cumulative share is the root's.
        for (reader, table) in [
            ("cpuprof", cpuprof_top(path)),
            ("google-pprof", google_pprof(Path::new(BINARY), path)),
            ("go tool pprof", go_pprof(Path::new(BINARY), path)),
        ] {
            assert!(
                total(&table) > 50.0,
                "{reader} reads {} ({samples} samples): {table:?}",
                path.display()
            );
        }
    }
}
