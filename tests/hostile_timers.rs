//! Server habits that the profiler's timers must not disturb (tests/c/timer_hazards.c): a low
//! descriptor limit, thousands of threads beside `select()`, a full real-time signal queue, and
//! seccomp sandboxes that kill on `perf_event_open`. Each case runs plainly and profiled, at 100
//! and 4000 Hz, with the default timer and with perf events asked for, under the resource limits
//! the test sets, and must behave the same: exit status and output, a valid profile, and every
//! loss said on stderr.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use support::*;

/// The real-time signal queue limit counts every process of the user: cases run one at a time so
/// that one case's timers do not fill another's queue.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const FREQUENCIES: &[&str] = &["100", "4000"];

fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            compile_c(
                &scratch_dir("timer-hazards-bin"),
                "timer_hazards.c",
                "timer_hazards",
                &["-O1"],
                false,
            )
        })
        .clone()
}

/// Runs `args` with `limits` (soft and hard) plainly, then profiled under each timer and
/// frequency; compares each profiled run with the plain one through `same` (stdout of both) and
/// returns the profiled runs as (timer, what, stderr).
fn behaves_the_same(
    args: &[&str],
    limits: &[(libc::__rlimit_resource_t, u64)],
    timers: &[&str],
    same: impl Fn(&str, &str) -> bool + 'static,
) -> Vec<(String, String, String)> {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let limits: Vec<Limit> = limits
        .iter()
        .map(|&(resource, value)| Limit::both(resource, value))
        .collect();
    let prog = program();
    let compared = PlainVsProfiled::new(
        &format!("{args:?}"),
        &scratch_dir(&format!("timer-hazards-{}", args.join("-"))),
    )
    .across("CPUPROFILE_TIMER", timers)
    .across("CPUPROFILE_FREQUENCY", FREQUENCIES)
    .plain_succeeds()
    .stdout_same_if(same)
    .run(|run| run_program(&prog, args, &run.env, &limits));
    compared
        .profiled
        .into_iter()
        .map(|p| {
            assert_valid(&p.profile, args[0] == "sandboxed");
            let timer = p.run.setting("CPUPROFILE_TIMER").unwrap().to_string();
            (timer, p.run.what, stderr(&p.out))
        })
        .collect()
}

/// `exec`: the process exec'd itself at once, so the profile that counts is the new image's
/// own `<profile>_<pid>` file.
fn assert_valid(profile: &Path, exec: bool) {
    if !exec {
        read_profile(profile);
        return;
    }
    let prefix = format!("{}_", profile.file_name().unwrap().to_string_lossy());
    let children: Vec<PathBuf> = std::fs::read_dir(profile.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .collect();
    assert_eq!(children.len(), 1, "the exec'd image's profile: {children:?}");
    read_profile(&children[0]);
}

fn identical(a: &str, b: &str) -> bool {
    a == b
}

/// The number after `opened` in the fdlimit mode's line.
fn opened(out: &str) -> i64 {
    let words: Vec<&str> = out.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "opened").expect("an 'opened N' line");
    words[at + 1].parse().unwrap()
}

#[test]
fn a_low_descriptor_limit_is_left_to_the_program() {
    // 40 and 70 idle threads under RLIMIT_NOFILE=64: the program opens as many files as without
    // the profiler, less cpuprof's four own descriptors (the profile; /proc/self/maps and
    // /proc/self/task kept open so that re-reading them never takes a low number; /proc/self/mem
    // for fault-safe stack reads; gperftools holds three), whatever the number of threads. Perf events have no descriptor numbers
    // to spare under this limit.
    for threads in ["40", "70"] {
        let stderrs = behaves_the_same(
            &["fdlimit", threads],
            &[(libc::RLIMIT_NOFILE, 64)],
            &["auto", "perf"],
            |plain, profiled| {
                plain.split(" opened").next() == profiled.split(" opened").next()
                    && (opened(plain) - opened(profiled)) <= 4
            },
        );
        for (_, what, err) in stderrs.iter().filter(|(timer, _, _)| timer == "perf") {
            assert!(err.contains("no descriptor numbers to spare"), "{what}: {err}");
        }
    }
}

#[test]
fn thousands_of_threads_leave_select_its_low_descriptors() {
    // 2,000 threads under RLIMIT_NOFILE=4096: a pipe made afterwards still gets descriptors
    // that select() can watch. Perf events live at the top of the limit, within a budget
    // (threads beyond it get POSIX timers, and say so).
    let stderrs = behaves_the_same(
        &["select", "2000"],
        &[(libc::RLIMIT_NOFILE, 4096)],
        &["auto", "perf"],
        identical,
    );
    for (_, what, err) in stderrs.iter().filter(|(timer, _, _)| timer == "perf") {
        assert!(err.contains("budget spent"), "{what}: {err}");
    }
}

#[test]
fn a_full_realtime_signal_queue_kills_nothing() {
    // The program fills the queue (RLIMIT_SIGPENDING, 4000 for this test) with a blocked signal
    // of its own, burns CPU in new threads, and takes every signal back. POSIX timers hold a
    // preallocated signal each and never fall back to SIGIO: a thread whose timer cannot be
    // created is left unsampled and counted. (Perf events are not run here: a full queue makes
    // the kernel send SIGIO in place of their signal; docs/HOSTILE.md.)
    let stderrs = behaves_the_same(
        &["sigqueue"],
        &[(libc::RLIMIT_SIGPENDING, 4000)],
        &["auto", "itimer"],
        identical,
    );
    for (_, what, err) in stderrs.iter().filter(|(timer, _, _)| timer == "auto") {
        assert!(
            err.contains("threads were not sampled"),
            "{what}: the unsampled threads are reported: {err}"
        );
    }
}

#[test]
fn a_seccomp_filter_that_kills_perf_event_open_is_respected() {
    // Installed by the program while profiled (new threads inherit it), and before the profiler
    // starts (the program execs itself inside the sandbox). Asked for perf events, the profiler
    // gives filtered threads POSIX timers instead and says why.
    for mode in ["seccomp", "sandboxed"] {
        let stderrs = behaves_the_same(&[mode], &[], &["auto", "perf"], identical);
        for (_, what, err) in stderrs.iter().filter(|(timer, _, _)| timer == "perf") {
            assert!(err.contains("seccomp filter"), "{what}: {err}");
        }
    }
}

#[test]
fn a_descriptor_limit_lowered_after_start_gives_new_threads_posix_timers() {
    // The program lowers its RLIMIT_NOFILE soft limit from 4096 to 256 after the profiler placed
    // its perf descriptors' budget near the top of 4096, then burns 0.5 s in each of four new
    // threads (and main). The new threads cannot have perf events (F_DUPFD to a number above
    // the limit fails with EINVAL): they get POSIX CPU timers, the message names the limit, and
    // their CPU time is in the profile, within 10 %.
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch_dir("timer-hazards-lowerlimit");
    for hz in FREQUENCIES {
        let profile = dir.join(format!("perf-{hz}.prof"));
        let env = profiler_env(&profile, &[("CPUPROFILE_FREQUENCY", hz), ("CPUPROFILE_TIMER", "perf")]);
        let out = run_program(
            &program(),
            &["lowerlimit", "256"],
            &env,
            &[Limit::both(libc::RLIMIT_NOFILE, 4096)],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{hz} Hz: {out:?}");
        assert!(
            err.contains(
                "the program lowered RLIMIT_NOFILE to 256: no descriptor numbers above FD_SETSIZE left; \
                 threads from now on get POSIX CPU timers"
            ) && err.contains("4 threads got POSIX CPU timers instead of perf events"),
            "{hz} Hz: {err}"
        );
        let cpu: f64 = err
            .lines()
            .find_map(|l| l.strip_prefix("cpu ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no cpu line: {err}"));
        let p = read_profile(&profile);
        let sampled = p.total_samples() as f64 * p.period_us as f64 * 1e-6;
        assert!(
            (sampled - cpu).abs() <= 0.1 * cpu,
            "{hz} Hz: {sampled:.3} s sampled, {cpu:.3} s of CPU time: {err}"
        );
    }
}
