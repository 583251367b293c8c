//! Ends of a process that `atexit` does not see (tests/c/process_end.c): `_exit` (also from a
//! signal handler, a forked child and a vfork child), the application taking the profiling
//! signal over, and `exec`. Each runs plainly and under the profiler, requiring the same exit
//! status and output, at 100 and 4000 Hz.

mod support;

use cpuprof::format::Profile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::*;

const FREQUENCIES: &[&str] = &["100", "4000"];

fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("process-end-bin");
            compile_c(
                &dir,
                "process_end.c",
                "process_end",
                &["-O1", "-fno-omit-frame-pointer"],
                false,
            )
        })
        .clone()
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(program())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs `args` plainly and profiled into `profile`; asserts the same status and stdout.
/// Returns the profiled run's output.
fn same_as_plain(args: &[&str], profile: &Path, timer: &str, frequency: &str) -> Output {
    let plain = run(args, &[]);
    let profiled = run(
        args,
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE", profile.to_str().unwrap()),
            ("CPUPROFILE_TIMER", timer),
            ("CPUPROFILE_FREQUENCY", frequency),
        ],
    );
    let what = format!("{args:?} under {timer} at {frequency} Hz");
    assert_eq!(profiled.status.to_string(), plain.status.to_string(), "{what}: status");
    assert_eq!(
        String::from_utf8_lossy(&profiled.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "{what}: output; stderr: {}",
        String::from_utf8_lossy(&profiled.stderr)
    );
    profiled
}

/// `cpuprof check` accepts the file (records, trailer and maps).
fn assert_complete(profile: &Path) -> Profile {
    let out = Command::new(cli()).arg("check").arg(profile).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}{}",
        profile.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    read_profile(profile)
}

fn seconds(profile: &Profile) -> f64 {
    profile.total_samples() as f64 * profile.period_us as f64 / 1e6
}

/// Whether the timer samples at most once per kernel tick (the process-wide timer, like
/// gperftools' setitimer): above the tick rate, samples no longer add up to CPU time.
fn tick_limited(timer: &str, frequency: &str) -> bool {
    timer == "itimer" && frequency != "100"
}

#[test]
fn exit_and_underscore_exit_keep_the_same_samples() {
    let dir = scratch_dir("underscore-exit");
    for frequency in FREQUENCIES {
        let mut counts = Vec::new();
        for mode in ["exit", "_exit"] {
            let profile = dir.join(format!("{mode}-{frequency}.prof"));
            same_as_plain(&[mode, "1.5"], &profile, "auto", frequency);
            counts.push(assert_complete(&profile).total_samples() as f64);
            if mode == "_exit" {
                let table = google_pprof(&program(), &profile);
                assert!(share(&table, "burn_main") > 90.0, "google-pprof: {table:?}");
            }
        }
        let ratio = counts[1] / counts[0];
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{frequency} Hz: exit {} samples, _exit {} samples",
            counts[0],
            counts[1]
        );
    }
}

#[test]
fn underscore_exit_from_a_sigterm_handler_completes_the_profile() {
    let dir = scratch_dir("sigterm-exit");
    for frequency in FREQUENCIES {
        let profile = dir.join(format!("{frequency}.prof"));
        same_as_plain(&["sigterm"], &profile, "auto", frequency);
        let s = seconds(&assert_complete(&profile));
        assert!((0.85..1.2).contains(&s), "{frequency} Hz: {s:.2} s of the 1 s burnt");
    }
}

#[test]
fn a_forked_childs_underscore_exit_completes_its_own_file_not_the_parents() {
    for frequency in FREQUENCIES {
        let dir = scratch_dir(&format!("fork-exit-{frequency}"));
        let profile = dir.join("parent.prof");
        same_as_plain(&["fork"], &profile, "auto", frequency);
        let parent = assert_complete(&profile);
        // The parent burnt 0.6 s; had the child completed "its" copy of the profile, the file
        // would hold the child's 0.4 s or be corrupt.
        let s = seconds(&parent);
        assert!((0.5..0.75).contains(&s), "{frequency} Hz: {s:.2} s");
        let cum = cpuprof_top(&profile);
        assert_eq!(share(&cum, "burn_child"), 0.0, "{cum:?}");
        // The child's own profile (session::children), completed by its _exit.
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 2, "{files:?}");
        let child = files.iter().find(|f| **f != profile).unwrap();
        let child_cum = cpuprof_top(child);
        assert!(share(&child_cum, "burn_child") >= 90.0, "{child_cum:?}");
    }
}

#[test]
fn vfork_children_that_exit_or_exec_change_nothing() {
    for frequency in FREQUENCIES {
        let dir = scratch_dir(&format!("vfork-{frequency}"));
        let profile = dir.join("parent.prof");
        let out = same_as_plain(&["vfork"], &profile, "auto", frequency);
        assert!(String::from_utf8_lossy(&out.stdout).contains("40 of 40"));
        let s = seconds(&assert_complete(&profile));
        assert!((0.5..0.8).contains(&s), "{frequency} Hz: {s:.2} s of the 0.6 s burnt");
    }
}

#[test]
fn a_taken_over_signal_still_ends_in_a_complete_file() {
    let dir = scratch_dir("takeover");
    for timer in ["auto", "perf", "itimer"] {
        for frequency in FREQUENCIES {
            let profile = dir.join(format!("{timer}-{frequency}.prof"));
            let out = same_as_plain(&["allsig"], &profile, timer, frequency);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("installed its own handler") && stderr.contains("runtime/pprof"),
                "{stderr}"
            );
            // The 0.6 s before the takeover are in (the 0.6 s after are not, but for the
            // signals in flight until the writer noticed).
            let s = seconds(&assert_complete(&profile));
            assert!(
                tick_limited(timer, frequency) || (0.5..0.9).contains(&s),
                "{timer} {frequency} Hz: {s:.2} s; {stderr}"
            );
            let cum = cpuprof_top(&profile);
            assert!(share(&cum, "burn_main") > 65.0, "{timer} {frequency} Hz: {cum:?}");
        }
    }
}

#[test]
fn exec_leaves_no_profiling_signal_to_the_new_image_and_the_samples_before_it_in_the_file() {
    let dir = scratch_dir("exec");
    for timer in ["auto", "perf", "itimer"] {
        for frequency in FREQUENCIES {
            for blocked in ["usr1", "all"] {
                let profile = dir.join(format!("{timer}-{frequency}-{blocked}.prof"));
                // The exec'd image prints what is pending and blocked in it: the plain run's
                // output (nothing pending, SIGUSR1 or everything blocked) is the answer.
                let out = same_as_plain(&["exec", blocked], &profile, timer, frequency);
                assert!(String::from_utf8_lossy(&out.stdout).contains("pending:\n"));
                // The image's profile is completed before the exec.
                let written = assert_complete(&profile);
                let s = seconds(&written);
                // With every signal blocked the program is never sampled, but for the signal
                // queued meanwhile, which is taken off the queue and counted (a POSIX timer's
                // with its overruns; at 100 Hz the 0.6 s are up to 60 periods).
                // Perf events count kernel time only as weight on the next user-mode sample,
                // which the exec may cut off (0.49 s of 0.6 seen in a CI rehearsal).
                let expected = match blocked {
                    "all" => 0.0..0.65,
                    _ if tick_limited(timer, frequency) => 0.01..0.75,
                    _ if timer == "perf" => 0.4..0.75,
                    _ => 0.5..0.75,
                };
                assert!(
                    expected.contains(&s),
                    "{timer} {frequency} Hz, {blocked} blocked: {s:.2} s written before exec"
                );
            }
        }
    }
}

#[test]
fn a_failed_exec_leaves_profiling_running() {
    let dir = scratch_dir("exec-fails");
    for timer in ["auto", "perf", "itimer"] {
        for frequency in FREQUENCIES {
            let profile = dir.join(format!("{timer}-{frequency}.prof"));
            let out = same_as_plain(&["execfail"], &profile, timer, frequency);
            assert!(String::from_utf8_lossy(&out.stdout).contains("mask kept 1"));
            let s = seconds(&assert_complete(&profile));
            assert!(
                tick_limited(timer, frequency) || (1.3..1.7).contains(&s),
                "{timer} {frequency} Hz: {s:.2} s of 1.5 s"
            );
            let cum = cpuprof_top(&profile);
            let after = share(&cum, "burn_after");
            assert!(
                (55.0..80.0).contains(&after),
                "{timer} {frequency} Hz: burn_after {after}%"
            );
        }
    }
}

/// Runs the program with `ulimit -c unlimited` (so that `wait` says whether a signal dumped
/// core), in `dir` (where a core file may go); `env` is the program's alone, not the shell's.
fn run_with_core(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -c unlimited 2>/dev/null; exec env \"$@\"")
        .arg("sh")
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(program())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// The CPU seconds the program printed (`cpu S`) before it ended.
fn printed_cpu(out: &Output) -> f64 {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("cpu ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no cpu line: {out:?}"))
}

#[test]
fn ending_signals_at_their_default_action_complete_the_profile() {
    let dir = scratch_dir("ending-signals");
    for (signal, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGSEGV, "SIGSEGV"),
    ] {
        let sig = signal.to_string();
        let plain = run_with_core(&dir, &["raise", &sig, "0.1", "1"], &[]);
        // Without a writer thread (one thread) and with one.
        for threads in ["1", "2"] {
            let profile = dir.join(format!("{name}-{threads}.prof"));
            let out = run_with_core(
                &dir,
                &["raise", &sig, "2", threads],
                &[
                    ("LD_PRELOAD", lib().to_str().unwrap()),
                    ("CPUPROFILE", profile.to_str().unwrap()),
                ],
            );
            let what = format!("{name} with {threads} threads");
            assert_eq!(out.status.to_string(), plain.status.to_string(), "{what}: {out:?}");
            let p = assert_complete(&profile);
            let cpu = printed_cpu(&out);
            let sampled = seconds(&p);
            assert!(
                (sampled - cpu).abs() <= 0.1 * cpu,
                "{what}: {sampled:.2} s of samples, {cpu:.2} s of CPU"
            );
            // Named with no binary given: the profile's maps and build-ids find it.
            let top = cpuprof_top(&profile);
            let named = share(&top, "burn_main") + share(&top, "burn_child");
            assert!(named >= 90.0, "{what}: {named}% named burn_*: {top:?}");
            let table = google_pprof(&program(), &profile);
            assert!(share(&table, "burn_main") > 40.0, "{what}: google-pprof {table:?}");
        }
    }
}

/// Utime + stime of a running process, in seconds, from /proc.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn sigkill_leaves_a_complete_profile_of_all_but_the_last_checkpoint_interval() {
    let dir = scratch_dir("sigkill-checkpoint");
    for threads in ["1", "2"] {
        let profile = dir.join(format!("killed-{threads}.prof"));
        let mut child = Command::new(program())
            .args(["spin", threads])
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE", &profile)
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(4500));
        let cpu = process_cpu(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        let what = format!("SIGKILL with {threads} threads");
        let p = assert_complete(&profile);
        let sampled = seconds(&p);
        // The default checkpoint interval is 2 s; the writer's tick and the kernel's
        // accounting add a little.
        assert!(
            sampled >= cpu - 2.3 && sampled <= cpu * 1.1,
            "{what}: {sampled:.2} s of samples, {cpu:.2} s of CPU"
        );
        let table = google_pprof(&program(), &profile);
        assert!(
            share(&table, "burn_main") + share(&table, "burn_child") >= 90.0,
            "{what}: google-pprof {table:?}"
        );
    }
}

#[test]
fn a_process_that_ends_at_once_leaves_a_complete_profile_or_none() {
    let dir = scratch_dir("ends-at-once");
    for frequency in FREQUENCIES {
        for i in 0..100 {
            let profile = dir.join(format!("now-{frequency}-{i}.prof"));
            let out = run(
                &["now"],
                &[
                    ("LD_PRELOAD", lib().to_str().unwrap()),
                    ("CPUPROFILE", profile.to_str().unwrap()),
                    ("CPUPROFILE_FREQUENCY", frequency),
                ],
            );
            assert!(out.status.success(), "{out:?}");
            if profile.exists() {
                let bytes = std::fs::read(&profile).unwrap();
                Profile::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e} ({} bytes)", profile.display(), bytes.len()));
            }
        }
    }
}

#[test]
fn three_hundred_system_calls_leave_only_complete_profiles() {
    let dir = scratch_dir("system-300");
    let out = run(
        &["system", "300"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE", dir.join("prof").to_str().unwrap()),
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("300 of 300 ran"),
        "{out:?}"
    );
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        Profile::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e} ({} bytes)", path.display(), bytes.len()));
        files += 1;
    }
    assert!(files >= 1, "no profile at all");
}
