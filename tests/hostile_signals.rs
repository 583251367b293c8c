//! Programs whose own use of signals meets cpuprof's (issue 24): a daemon that blocks every
//! signal and reads them all from a signalfd (tests/c/signalfd_daemon.c), threads cancelled
//! asynchronously while they compute (tests/c/async_cancel.c), and threads cancelled while
//! blocked in the waits libcpuprof.so interposes (tests/c/cancel_points.c).
//!
//! Each program runs plainly once, then 20 times at 4000 Hz under the default timer, and under
//! perf events and the process-wide timer where the case concerns them: every run must give the
//! plain run's output and exit status, and a valid profile holding samples of the code that
//! computes. All runs are made before judging, so a failure says how many runs of each kind
//! went wrong.

mod support;

use cpuprof::format::Profile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// Runs at 4000 Hz under the default timer, as the issue asks.
const RUNS: usize = 20;
/// A run still going after this has hung: it is killed, and counted as a failure.
const HANG: Duration = Duration::from_secs(60);

/// `source` compiled without PIE (so `nm` gives the addresses samples hold), with `-DUSE_API`
/// and `-lcpuprof` if `api`.
fn program(source: &str, api: bool) -> PathBuf {
    let name = format!("{}{}", source.trim_end_matches(".c"), if api { "_api" } else { "" });
    let dir = scratch_dir(&format!("hostile-signals-{name}"));
    compile_c(&dir, source, &name, &["-O1", "-fno-omit-frame-pointer", "-no-pie"], api)
}

/// `[start, end)` of `symbol` in a non-PIE `binary`, from `nm -S`.
fn symbol_range(binary: &Path, symbol: &str) -> (u64, u64) {
    let out = run_ok(
        Path::new("nm"),
        &["-S", "--defined-only", binary.to_str().unwrap()],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let fields = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 4 && f[3] == symbol)
        .unwrap_or_else(|| panic!("{symbol} not in nm output"));
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
    (hex(fields[0]), hex(fields[0]) + hex(fields[1]))
}

/// Samples whose chain passes through `range`.
fn samples_in(profile: &Profile, (start, end): (u64, u64)) -> u64 {
    profile
        .samples
        .iter()
        .filter(|s| s.pcs.iter().any(|&pc| (start..end).contains(&pc)))
        .map(|s| s.count)
        .sum()
}

/// One run: what it printed, how it ended, how long it took.
struct Run {
    out: Output,
    elapsed: Duration,
}

/// Runs `program args` with `env`, killed after [`HANG`]; one profiled run at a time in this
/// test binary, so that runs do not crowd each other off the 2 CPUs.
fn run(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let _alone = alone();
    let started = Instant::now();
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + HANG;
        // SAFETY: polls our own child without reaping it (WNOWAIT), then kills it if it hangs;
        // the pid cannot be reused before `wait_with_output` reaps it.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            while Instant::now() < deadline {
                let r = libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                );
                if r != 0 || info.si_pid() != 0 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            libc::kill(pid, libc::SIGKILL);
        }
    });
    let out = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    watchdog.join().unwrap();
    Run { out, elapsed }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Profiled runs of one program, judged together against its plain run.
struct Trial {
    program: PathBuf,
    args: Vec<String>,
    plain: Output,
    dir: PathBuf,
    /// What went wrong, one line per failed run.
    failures: Vec<String>,
    runs: usize,
    /// Each profiled run's kind and wall time.
    times: Vec<(String, Duration)>,
}

impl Trial {
    fn new(program: PathBuf, args: &[&str], want: &str) -> Trial {
        let plain = run(&program, args, &[]).out;
        assert!(
            plain.status.success() && stdout(&plain) == want,
            "without the profiler: {:?} {}",
            plain.status,
            stdout(&plain)
        );
        let name = program.file_name().unwrap().to_string_lossy().into_owned();
        Trial {
            dir: scratch_dir(&format!("hostile-signals-{name}-runs")),
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            plain,
            failures: Vec::new(),
            runs: 0,
            times: Vec::new(),
        }
    }

    /// `runs` profiled runs under `timer` at `hz`; `profile_env` names the variable that gives
    /// the profile's path (CPUPROFILE, or the program's own for ProfilerStart). `check` judges
    /// each run's profile and stderr, returning what is wrong.
    fn runs(
        &mut self,
        timer: &str,
        hz: &str,
        runs: usize,
        profile_env: &str,
        check: &dyn Fn(&Profile, &str) -> Result<(), String>,
    ) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        for i in 0..runs {
            let kind = format!("{timer} at {hz} Hz");
            let profile = self.dir.join(format!("{timer}-{hz}-{i}.prof"));
            let mut env = vec![
                (profile_env, profile.to_str().unwrap()),
                ("CPUPROFILE_FREQUENCY", hz),
                ("CPUPROFILE_TIMER", timer),
            ];
            let libdir = lib().parent().unwrap().to_str().unwrap();
            if profile_env == "CPUPROFILE" {
                env.push(("LD_PRELOAD", lib().to_str().unwrap()));
            } else {
                // Linked with -lcpuprof: this library, not one cargo's LD_LIBRARY_PATH finds
                // first (its RUNPATH comes after LD_LIBRARY_PATH).
                env.push(("LD_LIBRARY_PATH", libdir));
            }
            let Run { out, elapsed } = run(&self.program, &args, &env);
            self.runs += 1;
            self.times.push((kind.clone(), elapsed));
            let verdict = if out.status.to_string() != self.plain.status.to_string() {
                Err(format!("{} (plain: {})", out.status, self.plain.status))
            } else if out.stdout != self.plain.stdout {
                Err(format!("output {:?}", stdout(&out)))
            } else {
                match std::fs::read(&profile)
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| Profile::parse(&bytes).map_err(|e| format!("profile: {e}")))
                {
                    Ok(p) => check(&p, &stderr(&out)),
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = verdict {
                let err = stderr(&out);
                let tail = &err[err.len().saturating_sub(300)..];
                self.failures.push(format!("{kind} run {i}: {e}; stderr: {tail}"));
            }
        }
    }

    /// Fails with every failed run, counted by kind; prints the wall times.
    fn judge(self) {
        let mut kinds: Vec<&str> = self.times.iter().map(|(k, _)| k.as_str()).collect();
        kinds.dedup();
        for kind in kinds {
            let times: Vec<f64> = self
                .times
                .iter()
                .filter(|(k, _)| k == kind)
                .map(|(_, t)| t.as_secs_f64())
                .collect();
            let slowest = times.iter().cloned().fold(0.0, f64::max);
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            eprintln!("{kind}: {} runs, mean {mean:.2} s, slowest {slowest:.2} s", times.len());
        }
        assert!(
            self.failures.is_empty(),
            "{} of {} profiled runs differ from the plain run:\n{}",
            self.failures.len(),
            self.runs,
            self.failures.join("\n")
        );
    }
}

/// The profile holds samples of `symbol`'s code.
fn computes_in(symbol: &'static str, range: (u64, u64)) -> impl Fn(&Profile) -> Result<(), String> {
    move |p: &Profile| match samples_in(p, range) {
        0 => Err(format!("no sample in {symbol} ({} in all)", p.total_samples())),
        _ => Ok(()),
    }
}

/// What the stop message must say about the daemon's held-back samples: its main thread
/// computes with every signal blocked, so under per-thread timers exactly one thread (the
/// sender, which blocks them too, has ended) keeps the profiling signal pending; under the
/// process timer, SIGPROF is pending for the process.
fn held_back_said(timer: &str, err: &str) -> Result<(), String> {
    let want = match timer {
        "itimer" => "the process timer's signal (SIGPROF) is pending",
        _ => "cpuprof: 1 threads keep the profiling signal blocked while they run",
    };
    match err.contains(want) {
        true => Ok(()),
        false => Err(format!("no '{want}'")),
    }
}

#[test]
fn a_signalfd_daemon_never_reads_the_profiling_signal() {
    let prog = program("signalfd_daemon.c", false);
    let worker = computes_in("worker_compute", symbol_range(&prog, "worker_compute"));
    let mut trial = Trial::new(prog, &[], "hups 20 usr1s 20\n");
    for (timer, hz, runs) in [
        ("auto", "4000", RUNS),
        ("perf", "4000", 10),
        ("itimer", "4000", 10),
        ("auto", "100", 2),
        ("perf", "100", 2),
        ("itimer", "100", 2),
    ] {
        trial.runs(timer, hz, runs, "CPUPROFILE", &|p, err| {
            worker(p)?;
            held_back_said(timer, err)
        });
    }
    trial.judge();
}

#[test]
fn a_signalfd_made_before_profiling_started_never_reads_the_profiling_signal() {
    // ProfilerStart once the signalfd exists: the signal is chosen then, and taken out of the
    // masks of the signalfds already open.
    let prog = program("signalfd_daemon.c", true);
    let worker = computes_in("worker_compute", symbol_range(&prog, "worker_compute"));
    let mut trial = Trial::new(prog, &[], "hups 20 usr1s 20\n");
    for (timer, runs) in [("auto", 10), ("itimer", 5)] {
        trial.runs(timer, "4000", runs, "DAEMON_PROFILE", &|p, err| {
            worker(p)?;
            held_back_said(timer, err)
        });
    }
    trial.judge();
}

#[test]
fn asynchronously_cancelled_threads_never_abort() {
    // glibc unwinds an asynchronously cancelled thread from its SIGCANCEL handler: one that
    // landed on our handler unwound through it (before: exit 134 in 1 of 12 runs under the
    // default timer, 5 of 12 under perf events), or left it without returning, which held the
    // profile's end for the 2 s cpuprof waits for handlers to finish.
    let prog = program("async_cancel.c", false);
    let spin = computes_in("spin_cancellable", symbol_range(&prog, "spin_cancellable"));
    let mut trial = Trial::new(prog, &[], "cancelled 100 of 100\n");
    for (timer, hz, runs) in [
        ("auto", "4000", RUNS),
        ("perf", "4000", RUNS),
        ("itimer", "4000", 5),
        ("auto", "100", 2),
    ] {
        trial.runs(timer, hz, runs, "CPUPROFILE", &|p, _| spin(p));
    }
    // A handler left without returning holds IN_FLIGHT up for good: the end of the profile then
    // waits 2 s for it (twice with DWARF unwinding).
    let mut sorted: Vec<f64> = trial.times.iter().map(|(_, t)| t.as_secs_f64()).collect();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let slow: Vec<String> = trial
        .times
        .iter()
        .enumerate()
        .filter(|(_, (_, t))| t.as_secs_f64() > median + 1.5)
        .map(|(i, (kind, t))| format!("run {i} ({kind}): {:.2} s", t.as_secs_f64()))
        .collect();
    trial.failures.extend(
        slow.into_iter()
            .map(|s| format!("{s}, median {median:.2} s: a handler that never returned?")),
    );
    trial.judge();
}

#[test]
fn threads_cancelled_in_interposed_waits_unwind_cleanly() {
    // Deferred cancellation of a thread blocked in sigwait, sigwaitinfo, sigtimedwait, ppoll,
    // pselect, epoll_pwait, epoll_pwait2 and sigsuspend unwinds through libcpuprof.so's
    // interposer of the call; a read of a signalfd made through its interposer for comparison.
    let prog = program("cancel_points.c", false);
    let mut want = String::new();
    for call in [
        "sigwait",
        "sigwaitinfo",
        "sigtimedwait",
        "ppoll",
        "pselect",
        "epoll_pwait",
        "epoll_pwait2",
        "sigsuspend",
        "signalfd read",
    ] {
        want.push_str(&format!("{call}: 3 of 3 cancelled, cleanup run\n"));
    }
    let mut trial = Trial::new(prog, &[], &want);
    let any = |p: &Profile| match p.total_samples() {
        0 => Err("no samples".to_string()),
        _ => Ok(()),
    };
    for (timer, runs) in [("auto", RUNS), ("perf", 5), ("itimer", 5)] {
        trial.runs(timer, "4000", runs, "CPUPROFILE", &|p, _| any(p));
    }
    trial.judge();
}
