//! Programs that own their signals and descriptors (tests/c/hostile_fds.c): with the profiler
//! they must behave exactly as without it, and every loss of profile data must be reported.
//! Each case runs at 100 and 4000 samples per second.

mod support;

use cpuprof::format::Profile;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use support::*;

const FREQUENCIES: &[&str] = &["100", "4000"];

fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("hostile-fds-bin");
            compile_c(
                &dir,
                "hostile_fds.c",
                "hostile_fds",
                &["-O1", "-fno-omit-frame-pointer"],
                false,
            )
        })
        .clone()
}

/// Runs of `case` at each frequency, profiles in one directory.
fn at_each_frequency(case: &str) -> PlainVsProfiled {
    PlainVsProfiled::new(case, &scratch_dir(&format!("fds-{case}"))).across("CPUPROFILE_FREQUENCY", FREQUENCIES)
}

/// Programs that close or `dup2` over descriptors run under the default timer (POSIX CPU timers,
/// no descriptors) and under perf events, whose descriptors are identified by event id before
/// every use and re-armed when the program takes them; each run in a directory of its own,
/// `fds-CASE-RUN` (`fds-CASE-plain` for the plain run), its profile there as `p.prof`.
fn takeover_runs(case: &'static str) -> PlainVsProfiled {
    PlainVsProfiled::new(case, &scratch_dir(&format!("fds-{case}")))
        .across("CPUPROFILE_TIMER", &["auto", "perf"])
        .across("CPUPROFILE_FREQUENCY", FREQUENCIES)
        .profile_at(move |name| scratch_dir(&format!("fds-{case}-{name}")).join("p.prof"))
}

/// The directory of a [`takeover_runs`] run.
fn run_dir(case: &str, run: &Run) -> PathBuf {
    match &run.profile {
        Some(profile) => profile.parent().unwrap().to_path_buf(),
        None => scratch_dir(&format!("fds-{case}-plain")),
    }
}

/// Asserts that the profile covers at least `seconds` of CPU time: sampling went on after the
/// program took descriptor numbers over.
fn assert_sampled(what: &str, profile: &Path, seconds: f64) {
    let p = read_profile(profile);
    let sampled = p.total_samples() as f64 * p.period_us as f64 / 1e6;
    assert!(
        sampled >= seconds,
        "{what}: {sampled:.2} s sampled, want at least {seconds} s"
    );
}

/// The profile is whole, and the PROFILE line says so.
fn assert_complete(what: &str, profile: &Path, out: &Output) {
    let err = stderr(out);
    assert!(
        err.contains("PROFILE: interrupts") && !err.contains("INCOMPLETE"),
        "{what}: {err}"
    );
    read_profile(profile);
}

/// Cpuprof said the profile is not whole: the PROFILE line says INCOMPLETE, `reason` is on
/// stderr, and no other PROFILE line claims a complete file.
fn assert_loss_reported(what: &str, out: &Output, reason: &str) {
    let err = stderr(out);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("PROFILE:")).collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.contains("INCOMPLETE")),
        "{what}: {err}"
    );
    assert!(err.contains(reason), "{what}: no '{reason}' in {err}");
}

/// The file holds whole records only: it is a complete profile, or it ends exactly where a
/// record ends (without the trailer).
fn assert_whole_records(what: &str, bytes: &[u8]) {
    if bytes.is_empty() || Profile::parse(bytes).is_ok() {
        return;
    }
    let defect = Profile::parse_lenient(bytes)
        .map(|(_, defect)| defect.map(|d| d.to_string()).unwrap_or_default())
        .unwrap_or_else(|e| e.to_string());
    let expected = format!("at byte offset {}: file ends without the trailer", bytes.len());
    assert!(defect.starts_with(&expected), "{what}: {defect}");
}

/// Runs a sigwait/signalfd daemon: waits for `ready`, sends SIGHUP and SIGUSR1 three times
/// each (each after the previous one was counted, as standard signals do not queue), then
/// SIGTERM; returns everything it printed.
fn signal_daemon(mode: &str, env: &[(String, String)]) -> Output {
    let mut child = command(&program(), &[mode], env, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let guard = HangGuard::watch(&child);
    let pid = child.id() as i32;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let mut next_line = |seen: &mut String| {
        if let Some(Ok(line)) = lines.next() {
            seen.push_str(&line);
            seen.push('\n');
        }
    };
    next_line(&mut seen);
    for _ in 0..3 {
        for signal in [libc::SIGHUP, libc::SIGUSR1] {
            // SAFETY: signals our own child; if it died, the output shows it.
            unsafe { libc::kill(pid, signal) };
            next_line(&mut seen);
        }
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    for line in lines.map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
    }
    let mut out = child.wait_with_output().unwrap();
    drop(guard);
    out.stdout = seen.into_bytes();
    out
}

fn daemon_receives_every_signal(mode: &str) {
    let compared = at_each_frequency(mode).run(|run| signal_daemon(mode, &run.env));
    assert!(
        stdout(&compared.plain).ends_with("hups 3 usr1s 3\n"),
        "{}",
        stdout(&compared.plain)
    );
    for p in &compared.profiled {
        assert_complete(&p.run.what, &p.profile, &p.out);
    }
}

#[test]
fn a_sigwait_daemon_receives_every_signal() {
    daemon_receives_every_signal("sigwait");
}

#[test]
fn a_signalfd_daemon_receives_every_signal() {
    daemon_receives_every_signal("signalfd");
}

fn expected_file(i: usize) -> String {
    (0..40).map(|line| format!("file {i} line {line}\n")).collect()
}

#[test]
fn close_range_and_reopened_files_are_left_to_the_program() {
    let compared = takeover_runs("closerange").run(|run| {
        let dir = run_dir("closerange", run);
        let out = run_program(&program(), &["closerange", dir.to_str().unwrap()], &run.env, &[]);
        for i in 0..8 {
            let file = dir.join(format!("file{i}.txt"));
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                expected_file(i),
                "{}",
                file.display()
            );
        }
        out
    });
    let plain = stdout(&compared.plain);
    assert!(
        plain.contains("lowest numbers: yes") && plain.contains("files intact 8 of 8"),
        "{plain}"
    );
    for p in &compared.profiled {
        assert_loss_reported(&p.run.what, &p.out, "was closed or replaced by the program");
        assert_whole_records(&p.run.what, &std::fs::read(&p.profile).unwrap());
    }
}

#[test]
fn open_returns_the_lowest_free_descriptor_while_profiling() {
    let compared = at_each_frequency("lowestfd").run(|run| run_program(&program(), &["lowestfd"], &run.env, &[]));
    assert_eq!(stdout(&compared.plain), "lowest-free violations 0\n");
    for p in &compared.profiled {
        assert_complete(&p.run.what, &p.profile, &p.out);
    }
}

#[test]
fn a_file_size_limit_ends_the_profile_cleanly() {
    const LIMIT: u64 = 64 * 1024;
    let fsize = [Limit::soft(libc::RLIMIT_FSIZE, LIMIT)];
    let compared = at_each_frequency("fsize").run(|run| run_program(&program(), &["distinct", "2"], &run.env, &fsize));
    assert_eq!(stdout(&compared.plain), "distinct done\n");
    for p in &compared.profiled {
        let what = &p.run.what;
        let bytes = std::fs::read(&p.profile).unwrap();
        assert!(bytes.len() as u64 <= LIMIT, "{what}: {} bytes", bytes.len());
        assert_whole_records(what, &bytes);
        // 4000 samples a second over 4096 chains need more than 64 KiB, but on a busy machine
        // fewer signals come; a profile that fits is complete, one that does not says so.
        if Profile::parse(&bytes).is_err() {
            assert_loss_reported(what, &p.out, "File too large");
        }
    }
}

#[test]
fn a_fifo_as_profile_path_is_refused_without_blocking() {
    // Not in the comparison's directory (`fds-fifo`), which it makes afresh.
    let dir = scratch_dir("fds-fifo-path");
    let fifo = dir.join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let compared = at_each_frequency("fifo")
        .profile_at(move |_| fifo.clone())
        .run(|run| run_program(&program(), &["distinct", "0.3"], &run.env, &[]));
    for p in &compared.profiled {
        let err = stderr(&p.out);
        assert!(
            err.contains("not a regular file") && err.contains("fifo"),
            "{}: {err}",
            p.run.what
        );
    }
}

#[test]
fn a_profile_directory_deleted_while_profiling_is_reported() {
    let compared = PlainVsProfiled::new("rmdir", &scratch_dir("fds-rmdir"))
        .across("CPUPROFILE_FREQUENCY", FREQUENCIES)
        .profile_at(|name| scratch_dir(&format!("fds-rmdir-{name}")).join("p.prof"))
        .run(|run| {
            let dir = match &run.profile {
                Some(profile) => profile.parent().unwrap().to_path_buf(),
                None => scratch_dir("fds-rmdir-plain"),
            };
            run_program(&program(), &["rmdir", dir.to_str().unwrap()], &run.env, &[])
        });
    assert_eq!(stdout(&compared.plain), "rmdir ok\n");
    for p in &compared.profiled {
        assert_loss_reported(&p.run.what, &p.out, "deleted while profiling");
    }
}

fn expected_log() -> String {
    (0..30).map(|line| format!("log line {line}\n")).collect()
}

#[test]
fn a_log_dup2ed_onto_low_descriptors_gets_no_profile_bytes() {
    let compared = takeover_runs("dup2low").run(|run| {
        let log = run_dir("dup2low", run).join("log");
        run_program(&program(), &["dup2low", log.to_str().unwrap()], &run.env, &[])
    });
    for p in &compared.profiled {
        let (what, log) = (&p.run.what, p.profile.with_file_name("log"));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), expected_log(), "{what}");
        assert_complete(what, &p.profile, &p.out);
        // Two threads burn ~1.4 s of CPU each, 1.2 s of it after the dup2s.
        assert_sampled(what, &p.profile, 1.0);
    }
}

#[test]
fn a_log_dup2ed_onto_every_descriptor_gets_no_profile_bytes_and_the_loss_is_reported() {
    // Every number up to the limit, cpuprof's included. 4096 keeps the run short whatever
    // limit the test runs with, and puts cpuprof's descriptors above FD_SETSIZE.
    let nofile = [Limit::soft(libc::RLIMIT_NOFILE, 4096)];
    let compared = takeover_runs("dup2all").run(|run| {
        let log = run_dir("dup2all", run).join("log");
        run_program(&program(), &["dup2all", log.to_str().unwrap()], &run.env, &nofile)
    });
    for p in &compared.profiled {
        let (what, log) = (&p.run.what, p.profile.with_file_name("log"));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), expected_log(), "{what}");
        assert_loss_reported(what, &p.out, "was closed or replaced by the program");
        assert_whole_records(what, &std::fs::read(&p.profile).unwrap());
    }
}

#[test]
fn a_shell_exec_3_redirect_gets_no_profile_bytes() {
    // The loop burns ~1 s of CPU after the redirection.
    let script = "exec 3>\"$1\"; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo log >&3; echo out $i";
    // Each profiled run is compared with a plain run of its own, in its directory.
    for (timer, frequency) in [("auto", "100"), ("auto", "4000"), ("perf", "100"), ("perf", "4000")] {
        let case = format!("bash-{timer}-{frequency}");
        let dir = scratch_dir(&format!("fds-{case}"));
        let log = dir.join("log");
        let compared = PlainVsProfiled::new(&format!("bash exec 3> under {timer} at {frequency} Hz"), &dir)
            .with("CPUPROFILE_FREQUENCY", frequency)
            .with("CPUPROFILE_TIMER", timer)
            .profile_at({
                let dir = dir.clone();
                move |_| dir.join("p.prof")
            })
            .run(|run| {
                let args = ["-c", script, "bash", log.to_str().unwrap()];
                let out = run_program(Path::new("/bin/bash"), &args, &run.env, &[]);
                assert_eq!(std::fs::read_to_string(&log).unwrap(), "log\n", "{}", run.what);
                out
            });
        for p in &compared.profiled {
            assert_complete(&p.run.what, &p.profile, &p.out);
            assert_sampled(&p.run.what, &p.profile, 0.3);
        }
    }
}

#[test]
fn a_full_disk_leaves_whole_records_only() {
    let disks: Vec<(&str, FullDisk)> = FREQUENCIES
        .iter()
        .map_while(|hz| Some((*hz, FullDisk::mount(&format!("fds-fulldisk-{hz}"))?)))
        .collect();
    if disks.len() < FREQUENCIES.len() {
        return;
    }
    let at: Vec<(String, PathBuf)> = disks
        .iter()
        .map(|(hz, disk)| (hz.to_string(), disk.path().join("p.prof")))
        .collect();
    let compared = at_each_frequency("fulldisk")
        .profile_at(move |name| at.iter().find(|(hz, _)| hz == name).unwrap().1.clone())
        .run(|run| run_program(&program(), &["distinct", "1"], &run.env, &[]));
    let profiles: Vec<Vec<u8>> = compared
        .profiled
        .iter()
        .map(|p| std::fs::read(&p.profile).unwrap())
        .collect();
    drop(disks);
    for (p, bytes) in compared.profiled.iter().zip(&profiles) {
        let what = &p.run.what;
        assert_whole_records(what, bytes);
        // 4000 samples over 4096 chains need more than 16 KiB.
        if p.run.setting("CPUPROFILE_FREQUENCY") == Some("4000") || Profile::parse(bytes).is_err() {
            assert_loss_reported(what, &p.out, "No space left on device");
        }
    }
}
