//! Programs that own their signals and descriptors (tests/c/hostile_fds.c): with the profiler
//! they must behave exactly as without it, and every loss of profile data must be reported.
//! Each case runs at 100 and 4000 samples per second.

mod support;

use cpuprof::format::Profile;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

const FREQUENCIES: &[&str] = &["100", "4000"];
/// A program still running after this has hung; it is killed so the test fails instead.
const HANG: Duration = Duration::from_secs(120);

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

fn profiled(profile: &Path, frequency: &str) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), lib().to_str().unwrap().into()),
        ("CPUPROFILE".into(), profile.to_str().unwrap().into()),
        ("CPUPROFILE_FREQUENCY".into(), frequency.into()),
    ]
}

/// Programs that close or `dup2` over descriptors run under the default timer (POSIX CPU timers,
/// no descriptors) and under perf events, whose descriptors are identified by event id before
/// every use and re-armed when the program takes them.
const TAKEOVER_RUNS: &[(&str, &str)] = &[("auto", "100"), ("auto", "4000"), ("perf", "100"), ("perf", "4000")];

fn profiled_with_timer(profile: &Path, timer: &str, frequency: &str) -> Vec<(String, String)> {
    let mut env = profiled(profile, frequency);
    env.push(("CPUPROFILE_TIMER".into(), timer.into()));
    env
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

/// A command for `program args` with `env` and the soft resource limits `limits`.
fn command(
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
    limits: &[(libc::__rlimit_resource_t, u64)],
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    let limits = limits.to_vec();
    // SAFETY: only getrlimit/setrlimit, which are async-signal-safe, run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for &(resource, soft) in &limits {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(resource, &mut limit);
                limit.rlim_cur = soft;
                if libc::setrlimit(resource, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}

/// Kills `child` if it is still running after [`HANG`]; drop the guard once it has ended.
struct HangGuard(Arc<AtomicBool>);

impl HangGuard {
    fn watch(child: &Child) -> HangGuard {
        let (done, pid) = (Arc::new(AtomicBool::new(false)), child.id() as i32);
        let flag = done.clone();
        std::thread::spawn(move || {
            let step = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !flag.load(Ordering::Acquire) && waited < HANG {
                std::thread::sleep(step);
                waited += step;
            }
            if !flag.load(Ordering::Acquire) {
                // SAFETY: kills our own child, which has not been reaped (the flag is unset).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        HangGuard(done)
    }
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn output(mut cmd: Command) -> Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let _guard = HangGuard::watch(&child);
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that `profiled` behaved as `plain`: same exit status, same output.
fn same_behaviour(what: &str, plain: &Output, profiled: &Output) {
    assert_eq!(
        profiled.status.to_string(),
        plain.status.to_string(),
        "{what}: exit status; stderr: {}",
        stderr(profiled)
    );
    assert_eq!(
        stdout(profiled),
        stdout(plain),
        "{what}: output; stderr: {}",
        stderr(profiled)
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
    let plain = signal_daemon(mode, &[]);
    assert!(stdout(&plain).ends_with("hups 3 usr1s 3\n"), "{}", stdout(&plain));
    let dir = scratch_dir(&format!("fds-{mode}"));
    for frequency in FREQUENCIES {
        let profile = dir.join(format!("{frequency}.prof"));
        let out = signal_daemon(mode, &profiled(&profile, frequency));
        let what = format!("{mode} at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_complete(&what, &profile, &out);
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
    let run = |dir: &Path, env: &[(String, String)]| {
        let out = output(command(&program(), &["closerange", dir.to_str().unwrap()], env, &[]));
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
    };
    let plain = run(&scratch_dir("fds-closerange-plain"), &[]);
    assert!(
        stdout(&plain).contains("lowest numbers: yes") && stdout(&plain).contains("files intact 8 of 8"),
        "{}",
        stdout(&plain)
    );
    for &(timer, frequency) in TAKEOVER_RUNS {
        let dir = scratch_dir(&format!("fds-closerange-{timer}-{frequency}"));
        let profile = dir.join("p.prof");
        let out = run(&dir, &profiled_with_timer(&profile, timer, frequency));
        let what = format!("closerange under {timer} at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_loss_reported(&what, &out, "was closed or replaced by the program");
        assert_whole_records(&what, &std::fs::read(&profile).unwrap());
    }
}

#[test]
fn open_returns_the_lowest_free_descriptor_while_profiling() {
    let plain = output(command(&program(), &["lowestfd"], &[], &[]));
    assert_eq!(stdout(&plain), "lowest-free violations 0\n");
    let dir = scratch_dir("fds-lowest");
    for frequency in FREQUENCIES {
        let profile = dir.join(format!("{frequency}.prof"));
        let out = output(command(&program(), &["lowestfd"], &profiled(&profile, frequency), &[]));
        let what = format!("lowestfd at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_complete(&what, &profile, &out);
    }
}

#[test]
fn a_file_size_limit_ends_the_profile_cleanly() {
    const LIMIT: u64 = 64 * 1024;
    let fsize = [(libc::RLIMIT_FSIZE, LIMIT)];
    let plain = output(command(&program(), &["distinct", "2"], &[], &fsize));
    assert_eq!(stdout(&plain), "distinct done\n");
    let dir = scratch_dir("fds-fsize");
    for frequency in FREQUENCIES {
        let profile = dir.join(format!("{frequency}.prof"));
        let out = output(command(
            &program(),
            &["distinct", "2"],
            &profiled(&profile, frequency),
            &fsize,
        ));
        let what = format!("RLIMIT_FSIZE at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        let bytes = std::fs::read(&profile).unwrap();
        assert!(bytes.len() as u64 <= LIMIT, "{what}: {} bytes", bytes.len());
        assert_whole_records(&what, &bytes);
        // 4000 samples a second over 4096 chains need more than 64 KiB, but on a busy machine
        // fewer signals come; a profile that fits is complete, one that does not says so.
        if Profile::parse(&bytes).is_err() {
            assert_loss_reported(&what, &out, "File too large");
        }
    }
}

#[test]
fn a_fifo_as_profile_path_is_refused_without_blocking() {
    let plain = output(command(&program(), &["distinct", "0.3"], &[], &[]));
    let dir = scratch_dir("fds-fifo");
    let fifo = dir.join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    for frequency in FREQUENCIES {
        let out = output(command(
            &program(),
            &["distinct", "0.3"],
            &profiled(&fifo, frequency),
            &[],
        ));
        let what = format!("FIFO at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        let err = stderr(&out);
        assert!(
            err.contains("not a regular file") && err.contains("fifo"),
            "{what}: {err}"
        );
    }
}

#[test]
fn a_profile_directory_deleted_while_profiling_is_reported() {
    let plain_dir = scratch_dir("fds-rmdir-plain");
    let plain = output(command(&program(), &["rmdir", plain_dir.to_str().unwrap()], &[], &[]));
    assert_eq!(stdout(&plain), "rmdir ok\n");
    for frequency in FREQUENCIES {
        let dir = scratch_dir(&format!("fds-rmdir-{frequency}"));
        let out = output(command(
            &program(),
            &["rmdir", dir.to_str().unwrap()],
            &profiled(&dir.join("p.prof"), frequency),
            &[],
        ));
        let what = format!("rmdir at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_loss_reported(&what, &out, "deleted while profiling");
    }
}

fn expected_log() -> String {
    (0..30).map(|line| format!("log line {line}\n")).collect()
}

#[test]
fn a_log_dup2ed_onto_low_descriptors_gets_no_profile_bytes() {
    let plain_dir = scratch_dir("fds-dup2low-plain");
    let plain = output(command(
        &program(),
        &["dup2low", plain_dir.join("log").to_str().unwrap()],
        &[],
        &[],
    ));
    for &(timer, frequency) in TAKEOVER_RUNS {
        let dir = scratch_dir(&format!("fds-dup2low-{timer}-{frequency}"));
        let (log, profile) = (dir.join("log"), dir.join("p.prof"));
        let out = output(command(
            &program(),
            &["dup2low", log.to_str().unwrap()],
            &profiled_with_timer(&profile, timer, frequency),
            &[],
        ));
        let what = format!("dup2low under {timer} at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), expected_log(), "{what}");
        assert_complete(&what, &profile, &out);
        // Two threads burn ~1.4 s of CPU each, 1.2 s of it after the dup2s.
        assert_sampled(&what, &profile, 1.0);
    }
}

#[test]
fn a_log_dup2ed_onto_every_descriptor_gets_no_profile_bytes_and_the_loss_is_reported() {
    // Every number up to the limit, cpuprof's included. 4096 keeps the run short whatever
    // limit the test runs with, and puts cpuprof's descriptors above FD_SETSIZE.
    let nofile = [(libc::RLIMIT_NOFILE, 4096)];
    let plain_dir = scratch_dir("fds-dup2all-plain");
    let plain = output(command(
        &program(),
        &["dup2all", plain_dir.join("log").to_str().unwrap()],
        &[],
        &nofile,
    ));
    for &(timer, frequency) in TAKEOVER_RUNS {
        let dir = scratch_dir(&format!("fds-dup2all-{timer}-{frequency}"));
        let (log, profile) = (dir.join("log"), dir.join("p.prof"));
        let out = output(command(
            &program(),
            &["dup2all", log.to_str().unwrap()],
            &profiled_with_timer(&profile, timer, frequency),
            &nofile,
        ));
        let what = format!("dup2all under {timer} at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), expected_log(), "{what}");
        assert_loss_reported(&what, &out, "was closed or replaced by the program");
        assert_whole_records(&what, &std::fs::read(&profile).unwrap());
    }
}

#[test]
fn a_shell_exec_3_redirect_gets_no_profile_bytes() {
    // The loop burns ~1 s of CPU after the redirection.
    let script = "exec 3>\"$1\"; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo log >&3; echo out $i";
    for &(timer, frequency) in TAKEOVER_RUNS {
        let dir = scratch_dir(&format!("fds-bash-{timer}-{frequency}"));
        let (log, profile) = (dir.join("log"), dir.join("p.prof"));
        let args = ["-c", script, "bash", log.to_str().unwrap()];
        let plain = output(command(Path::new("/bin/bash"), &args, &[], &[]));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "log\n");
        let env = profiled_with_timer(&profile, timer, frequency);
        let out = output(command(Path::new("/bin/bash"), &args, &env, &[]));
        let what = format!("bash exec 3> under {timer} at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "log\n", "{what}");
        assert_complete(&what, &profile, &out);
        assert_sampled(&what, &profile, 0.3);
    }
}

#[test]
fn a_full_disk_leaves_whole_records_only() {
    let plain = output(command(&program(), &["distinct", "1"], &[], &[]));
    for frequency in FREQUENCIES {
        let dir = scratch_dir(&format!("fds-fulldisk-{frequency}"));
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
            .arg(&dir)
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
            return;
        }
        let profile = dir.join("p.prof");
        let out = output(command(
            &program(),
            &["distinct", "1"],
            &profiled(&profile, frequency),
            &[],
        ));
        let bytes = std::fs::read(&profile).unwrap();
        let _ = Command::new("umount").arg(&dir).status();
        let what = format!("full disk at {frequency} Hz");
        same_behaviour(&what, &plain, &out);
        assert_whole_records(&what, &bytes);
        // 4000 samples over 4096 chains need more than 16 KiB.
        if *frequency == "4000" || Profile::parse(&bytes).is_err() {
            assert_loss_reported(&what, &out, "No space left on device");
        }
    }
}
