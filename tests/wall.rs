//! Wall-clock profiling (`CPUPROFILE_WALL`, issue 16): every thread sampled at a wall
//! interval, blocked ones included, without ever interrupting a system call.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};
use support::*;

/// Runs `program` under LD_PRELOAD with `env`, while no other profiled run of this file runs.
fn run_profiled(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![("LD_PRELOAD", lib().to_str().unwrap())];
    all.extend_from_slice(env);
    run_alone(program, args, &all)
}

/// `function -> cumulative samples` and the period in seconds, from `cpuprof top --cum`.
fn cum_samples(profile: &Path) -> (HashMap<String, f64>, f64) {
    let out = run_ok(cli(), &["top", "--cum", "-n", "1000", profile.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let period_us: f64 = text
        .lines()
        .find_map(|l| {
            l.split(" at ")
                .nth(1)?
                .split(" us per sample")
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no period in:\n{text}"));
    let mut counts = HashMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 6 && cols[4].ends_with('%') {
            if let Ok(n) = cols[3].parse::<f64>() {
                counts.entry(cols[5..].join(" ")).or_insert(n);
            }
        }
    }
    (counts, period_us * 1e-6)
}

fn stderr_value(out: &Output, key: &str) -> f64 {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} on stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Thread A burns 2 s in `burn`, B blocks 2 s in `read` under `wait_for_input`, C 2 s in
/// `pthread_cond_timedwait` under `wait_for_work`: each blocked function gets 2 s ± 10 % of
/// wall samples, `burn` its thread's CPU time ± 10 % (time spent runnable, waiting for a CPU,
/// is not counted yet), with stacks to clone3, and google-pprof and go tool pprof read the
/// same shares.
#[test]
fn each_thread_gets_its_wall_time_blocked_or_burning() {
    let dir = scratch_dir("wall-known");
    let program = compile_c(&dir, "wall_known.c", "wall_known", &["-O2"], false);
    let plain = run_ok(&program, &[], &[]);
    for hz in ["100", "1000"] {
        let profile = dir.join(format!("wall-{hz}.prof"));
        let out = run_profiled(
            &program,
            &[],
            &[
                ("CPUPROFILE_WALL", profile.to_str().unwrap()),
                ("CPUPROFILE_WALL_FREQUENCY", hz),
            ],
        );
        assert_eq!(out.stdout, plain.stdout, "{hz} Hz: output differs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cpuprof: wall-clock sampler: ") && !stderr.contains("missing"),
            "{hz} Hz: {stderr}"
        );
        read_profile(&profile);
        let (counts, period) = cum_samples(&profile);
        let seconds = |f: &str| counts.get(f).copied().unwrap_or(0.0) * period;
        for f in ["wait_for_input", "wait_for_work"] {
            assert!(
                (seconds(f) - 2.0).abs() <= 0.2,
                "{hz} Hz: {f} has {:.3} s, want 2 s ± 10 %: {counts:?}",
                seconds(f)
            );
        }
        let a_cpu = stderr_value(&out, "a_cpu");
        assert!(
            (seconds("burn") - a_cpu).abs() <= 0.1 * a_cpu,
            "{hz} Hz: burn has {:.3} s for {a_cpu} s of CPU: {counts:?}",
            seconds("burn")
        );
        let threads = seconds("burn") + seconds("wait_for_input") + seconds("wait_for_work");
        assert!(
            seconds("clone3") >= 0.99 * threads,
            "{hz} Hz: only {:.3} of {threads:.3} s of the threads' samples reach clone3: {counts:?}",
            seconds("clone3")
        );
        let ours = cpuprof_top(&profile);
        for (reader, table) in [
            ("google-pprof", google_pprof(&program, &profile)),
            ("go tool pprof", go_pprof(&program, &profile)),
        ] {
            for f in ["burn", "wait_for_input", "wait_for_work"] {
                assert!(
                    (share(&table, f) - share(&ours, f)).abs() <= 1.0,
                    "{hz} Hz: {reader} gives {f} {}%, cpuprof {}%: {table:?}",
                    share(&table, f),
                    share(&ours, f)
                );
            }
        }
    }
}

/// Threads blocked in nanosleep, epoll_wait, poll, select, accept, futex waits, sem_timedwait
/// and a pipe read, each aborting on EINTR or an early return: the same output and exit status
/// under wall profiling at 100 and 1000 Hz, and under CPU profiling at 100 and 4000 Hz.
#[test]
fn no_blocked_call_is_interrupted_under_wall_or_cpu_profiling() {
    let dir = scratch_dir("wall-eintr");
    let program = compile_c(&dir, "eintr_sentinel.c", "eintr_sentinel", &["-O2"], false);
    let plain = run_ok(&program, &["3"], &[]);
    for (variable, rate, hz) in [
        ("CPUPROFILE_WALL", "CPUPROFILE_WALL_FREQUENCY", "100"),
        ("CPUPROFILE_WALL", "CPUPROFILE_WALL_FREQUENCY", "1000"),
        ("CPUPROFILE", "CPUPROFILE_FREQUENCY", "100"),
        ("CPUPROFILE", "CPUPROFILE_FREQUENCY", "4000"),
    ] {
        let profile = dir.join(format!("{variable}-{hz}.prof"));
        let out = run_profiled(&program, &["3"], &[(variable, profile.to_str().unwrap()), (rate, hz)]);
        assert_eq!(out.stdout, plain.stdout, "{variable} at {hz} Hz: output differs");
        let parsed = read_profile(&profile);
        assert!(parsed.records > 0, "{variable} at {hz} Hz: empty profile");
    }
}

/// The sentinel's checks can fail: signalled by the program itself (an `SA_RESTART` handler),
/// its blocked threads see EINTR and it aborts.
#[test]
fn the_sentinel_aborts_when_a_blocked_call_is_interrupted() {
    let dir = scratch_dir("wall-sentinel-self-test");
    let program = compile_c(&dir, "eintr_sentinel.c", "eintr_sentinel", &["-O2"], false);
    let out = Command::new(&program)
        .arg("1")
        .env("SENTINEL_SELF_TEST", "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("Interrupted system call"));
}
