//! Lock contention profiles (`CPUPROFILE_CONTENTION`, `CpuprofStartContention`,
//! `cpuprof::contention::Mutex`, `/pprof/contention`, `/debug/pprof/mutex` and `/block`): known
//! answers from `tests/c/contention_known.c` and `examples/contention_mutex.rs`, whose threads
//! take one lock in turn, each holding it 1 ms asleep, and time their own waits. The profile's
//! total delay must be within 20 % of what they measured, the waiting function on top, in our
//! reader, google-pprof (`--total_delay`) and go tool pprof; the holders' view (`FILE.holders`,
//! `/debug/pprof/mutex`) the same less the hand-offs, the releasing function on top. The
//! interposed calls keep glibc's answers (`semantics`); a forked child writes its own files.

mod support;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::*;

fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = scratch_dir("contention");
            compile_c(
                &dir,
                "contention_known.c",
                "contention_known",
                &["-O2", "-pthread"],
                false,
            )
        })
        .clone()
}

/// `5.97s`, `597ms`, `12us`, `5.969 seconds` as seconds.
fn seconds_in(text: &str) -> f64 {
    let text = text.trim().trim_end_matches(" seconds");
    for (suffix, scale) in [("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0)] {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().unwrap() * scale;
        }
    }
    text.parse().unwrap()
}

/// The total delay `cpuprof top`, `google-pprof --text --total_delay` and `go tool pprof -top`
/// read in `profile` of `binary`, with each reader's cumulative shares.
fn readers(binary: &Path, profile: &Path) -> Vec<(&'static str, f64, String)> {
    let file = profile.to_str().unwrap();
    let ours = String::from_utf8_lossy(&run_ok(cli(), &["top", "--cum", "-n", "1000", file], &[]).stdout).into_owned();
    let total = ours
        .lines()
        .find_map(|l| l.strip_prefix("Total: ")?.strip_suffix(" delay"))
        .map(seconds_in)
        .unwrap_or_else(|| panic!("no total in {ours}"));
    let mut all = vec![("cpuprof top", total, ours)];
    if require_tools(&["google-pprof", "go"]) {
        let google = run_ok(
            Path::new("google-pprof"),
            &["--text", "--cum", "--total_delay", binary.to_str().unwrap(), file],
            &[],
        );
        let google = String::from_utf8_lossy(&google.stdout).into_owned();
        let total = google
            .lines()
            .find_map(|l| l.strip_prefix("Total: "))
            .map(seconds_in)
            .unwrap_or_else(|| panic!("no total in {google}"));
        all.push(("google-pprof", total, google));
        let go = run_ok(
            Path::new("go"),
            &[
                "tool",
                "pprof",
                "-top",
                "-cum",
                "-nodecount=1000",
                binary.to_str().unwrap(),
                file,
            ],
            &[("HOME", std::env::temp_dir().to_str().unwrap())],
        );
        let go = String::from_utf8_lossy(&go.stdout).into_owned();
        let total = go
            .lines()
            .find_map(|l| l.split("Total samples = ").nth(1)?.split_whitespace().next())
            .map(seconds_in)
            .unwrap_or_else(|| panic!("no total in {go}"));
        all.push(("go tool pprof", total, go));
    }
    all
}

/// Asserts the known answer: the profile's delay within 20 % of `waited_ns` (what the
/// program measured), and `waiter` on every chain.
fn assert_known_answer(binary: &Path, profile: &Path, waited_ns: u64, waiter: &str) {
    let truth = waited_ns as f64 / 1e9;
    assert!(
        truth > 1.0,
        "the program waited only {truth} s: no contention to measure"
    );
    let readers = readers(binary, profile);
    // The readers read one file: they agree with each other to their rounding (pprof prints
    // three significant digits).
    let ours = readers[0].1;
    for (reader, total, table) in &readers {
        assert!(
            (total / ours - 1.0).abs() <= 0.01,
            "{reader}: {total} s of delay where cpuprof top reads {ours} s\n{table}"
        );
    }
    for (reader, total, table) in readers {
        assert!(
            (total / truth - 1.0).abs() <= 0.2,
            "{reader}: {total} s of delay, the program measured {truth} s\n{table}"
        );
        let share = share(&cum_percentages(&table), waiter);
        assert!(share >= 95.0, "{reader}: {waiter} holds {share}% of the delay\n{table}");
    }
}

/// `mode`'s known answer in both views: the waiters' (`waits.txt`: `waiter` on top, the delay
/// what the threads measured) and the holders' (`waits.txt.holders`: `holder` on top, the
/// delay what they measured less the hand-offs, from a release to the waiter's return).
fn contended(mode: &str, waiter: &str, holder: &str) {
    let prog = program();
    let profile = scratch_dir(&format!("contention_{mode}")).join("waits.txt");
    let out = run_alone(
        &prog,
        &[mode, "4", "2", "1000"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    let waited: u64 = values(&out)["waited_ns"].parse().unwrap();
    assert_known_answer(&prog, &profile, waited, waiter);
    let handoff: u64 = values(&out)["handoff_ns"].parse().unwrap();
    assert_known_answer(&prog, &holders_file(&profile), waited - handoff, holder);
}

/// The holders' twin of a contention profile's file, `FILE.holders`.
fn holders_file(profile: &Path) -> PathBuf {
    let mut name = profile.as_os_str().to_owned();
    name.push(".holders");
    PathBuf::from(name)
}

fn parse_contention(file: &Path) -> cpuprof::format::contention::ContentionProfile {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    cpuprof::format::contention::ContentionProfile::parse(&bytes).unwrap()
}

#[test]
fn four_threads_on_one_pthread_mutex() {
    contended("mutex", "take_mutex", "release_mutex");
}

/// The CLI's other commands on a contention profile: `report` (the HTML page, and against a
/// base), `flamegraph`, `collapse`, `diff` and `convert --to pprof`, each with the waiting
/// function, each value (`delay`, `contentions`) where it applies.
#[test]
fn the_cli_draws_collapses_compares_and_converts_a_contention_profile() {
    let prog = program();
    let dir = scratch_dir("contention_cli");
    let profile = dir.join("waits.txt");
    run_alone(
        &prog,
        &["mutex", "4", "1", "1000"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    let file = profile.to_str().unwrap();
    let text = |args: &[&str]| String::from_utf8_lossy(&run_ok(cli(), args, &[]).stdout).into_owned();
    let html = dir.join("waits.html");
    let html_path = html.to_str().unwrap();
    for value in ["delay", "contentions"] {
        text(&["report", "--sample-index", value, file, "-o", html_path]);
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(
            page.contains(&format!("Contention profile: {value}")) && page.contains("take_mutex"),
            "{value}: {page}"
        );
    }
    text(&["report", file, "--base", file, "-o", html_path]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("id=\"diff\"") && page.contains("against"), "{page}");
    let svg = dir.join("waits.svg");
    text(&["flamegraph", file, "-o", svg.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("take_mutex"));
    let folded = text(&["collapse", file]);
    assert!(folded.lines().all(|l| l.contains("take_mutex")), "{folded}");
    let run = |args: &[&str]| std::process::Command::new(cli()).args(args).output().unwrap();
    let diff = run(&["diff", file, file]);
    assert_eq!(diff.status.code(), Some(0), "{}", String::from_utf8_lossy(&diff.stdout));
    let pb = dir.join("waits.pb.gz");
    text(&["convert", "--to", "pprof", file, "-o", pb.to_str().unwrap()]);
    if require_tools(&["go"]) {
        let go = run_ok(
            Path::new("go"),
            &["tool", "pprof", "-top", "-sample_index=delay", pb.to_str().unwrap()],
            &[("HOME", std::env::temp_dir().to_str().unwrap())],
        );
        assert!(String::from_utf8_lossy(&go.stdout).contains("take_mutex"));
    }
    // A CPU profile is no base for it.
    let cpu = dir.join("cpu.prof");
    run_preloaded(&prog, &["mutex", "2", "0.2", "100"], &cpu, &[]);
    let refused = run(&["report", file, "--base", cpu.to_str().unwrap(), "-o", html_path]);
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("a contention profile is compared with a contention profile"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn four_threads_on_one_rwlock_and_one_semaphore() {
    contended("rwlock", "take_rwlock", "release_rwlock");
    contended("sem", "take_sem", "release_sem");
}

#[test]
fn four_threads_on_one_rust_std_mutex() {
    let example = build_example("contention_mutex", &[]);
    let profile = scratch_dir("contention_rust").join("waits.txt");
    let out = run_alone(
        &example,
        &["4", "2", "1000"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    let waited: u64 = values(&out)["waited_ns"].parse().unwrap();
    assert_known_answer(&example, &profile, waited, "take_std_mutex");
    // The holders' view: std's unlock wakes a waiter with FUTEX_WAKE from release_lock.
    let handoff: u64 = values(&out)["handoff_ns"].parse().unwrap();
    assert_known_answer(&example, &holders_file(&profile), waited - handoff, "release_lock");
}

#[test]
fn a_rust_program_without_preloading_profiles_its_own_mutex() {
    let example = build_example("contention_mutex", &[]);
    let profile = scratch_dir("contention_rust_wrapper").join("waits.txt");
    let out = run_alone(&example, &["4", "2", "1000", profile.to_str().unwrap()], &[]);
    let waited: u64 = values(&out)["waited_ns"].parse().unwrap();
    assert_known_answer(&example, &profile, waited, "take_cpuprof_mutex");
    // The holders' view: the wrapper's guard charges its release.
    let handoff: u64 = values(&out)["handoff_ns"].parse().unwrap();
    assert_known_answer(&example, &holders_file(&profile), waited - handoff, "release_lock");
}

#[test]
fn the_c_api_starts_and_writes_a_profile() {
    let dir = scratch_dir("contention_api");
    let prog = compile_c(&dir, "contention_known.c", "contention_api", &["-O2", "-pthread"], true);
    let profile = dir.join("api.txt");
    let out = run_alone(&prog, &["api", profile.to_str().unwrap()], &[]);
    let waited: u64 = values(&out)["waited_ns"].parse().unwrap();
    assert_known_answer(&prog, &profile, waited, "take_mutex");
}

/// A thread cancelled inside `sem_wait` (a cancellation point) ends as without the profiler,
/// its cleanup run, and stops being a waiter: the post 0.3 s later is charged nothing. Were it
/// still counted, the post would be charged the 0.4 s since its wait began.
#[test]
fn a_thread_cancelled_in_a_wait_stops_waiting() {
    let prog = program();
    let profile = scratch_dir("contention_cancel").join("waits.txt");
    let out = run_alone(
        &prog,
        &["cancel"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    assert_eq!(values(&out)["cancelled"], "1");
    let holders = parse_contention(&holders_file(&profile));
    assert_eq!(holders.totals(), (0, 0), "{holders:?}");
}

/// A program that closes every descriptor it did not open, wherever they sit (Chromium's
/// zygote), and ends with `_exit`: both files are written by their paths, with the waits (they
/// were left empty).
#[test]
fn a_program_closing_our_descriptors_still_gets_its_files() {
    let prog = program();
    let profile = scratch_dir("contention_closefds").join("waits.txt");
    let out = run_alone(
        &prog,
        &["closefds"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    let waited: u64 = values(&out)["waited_ns"].parse().unwrap();
    for file in [profile.clone(), holders_file(&profile)] {
        let (delay, _) = parse_contention(&file).totals();
        assert!(
            delay > 0 && delay <= waited * 12 / 10,
            "{}: {delay} ns, {waited} waited",
            file.display()
        );
    }
}

#[test]
fn interposed_calls_answer_as_glibcs() {
    let prog = program();
    let plain = run_ok(&prog, &["semantics"], &[]);
    let profile = scratch_dir("contention_semantics").join("waits.txt");
    let profiled = run_alone(
        &prog,
        &["semantics"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&profiled.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let text = String::from_utf8_lossy(&plain.stdout);
    for answer in [
        "errorcheck_relock EDEADLK",
        "timedlock_held ETIMEDOUT",
        "sem_timedwait -1 ETIMEDOUT",
    ] {
        assert!(text.contains(answer), "{text}");
    }
    // The timed lock that timed out waited ~20 ms in lock_by.
    let top = String::from_utf8_lossy(&run_ok(cli(), &["top", profile.to_str().unwrap()], &[]).stdout).into_owned();
    assert!(top.contains("lock_by"), "{top}");
    // Commands that read CPU profiles only say so.
    let list = std::process::Command::new(cli())
        .args(["list", "lock_by", profile.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(list.status.code(), Some(1));
    let message = String::from_utf8_lossy(&list.stderr);
    assert!(
        message.contains("a contention profile, where a CPU profile is needed"),
        "{message}"
    );
}

#[test]
fn a_forked_child_writes_its_own_profile() {
    forked_child_writes("fork");
}

/// The child becomes nobody (so it could not create a file in the test's directory) and ends
/// with `_exit` (no atexit handlers): its file was created at the fork, and is written at
/// `_exit` without allocating.
#[test]
fn a_child_that_drops_root_and_ends_with_exit_keeps_its_profile() {
    if require_root("a child that becomes nobody") {
        forked_child_writes("drop");
    }
}

fn forked_child_writes(mode: &str) {
    let prog = program();
    let dir = scratch_dir(&format!("contention_{mode}"));
    let profile = dir.join("waits.txt");
    let out = run_alone(
        &prog,
        &[mode, "1", "1000"],
        &[
            ("LD_PRELOAD", lib().to_str().unwrap()),
            ("CPUPROFILE_CONTENTION", profile.to_str().unwrap()),
        ],
    );
    // The child's output comes first: two `waited_ns` lines, each ~1 s of two threads' waits.
    let text = String::from_utf8_lossy(&out.stdout);
    let numbers = |key: &str| -> Vec<u64> { text.lines().filter_map(|l| l.strip_prefix(key)?.parse().ok()).collect() };
    let (waited, handoff) = (numbers("waited_ns "), numbers("handoff_ns "));
    assert!(waited.len() == 2 && handoff.len() == 2, "{text}");
    let child_file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("waits.txt_") && !name.ends_with(".holders")
        })
        .expect("the child's file, waits.txt_PID");
    // Each process's holders' view is its own too: its waits less their hand-offs.
    let files = [(&child_file, 0), (&profile, 1)];
    for (file, i) in files {
        for (view, truth) in [(file.clone(), waited[i]), (holders_file(file), waited[i] - handoff[i])] {
            let delay = parse_contention(&view).totals().0 as f64;
            assert!(
                (delay / truth as f64 - 1.0).abs() <= 0.2,
                "{}: {delay} ns of delay, its process measured {truth}",
                view.display()
            );
        }
    }
}

/// Four threads contending for ten seconds, ended after two by SIGTERM, which the program
/// leaves at its default action: the process still dies by SIGTERM, and its file holds the
/// waits so far (about 3 s of delay: three threads wait while one holds), read by every
/// reader.
#[test]
fn a_process_ended_by_sigterm_writes_its_profile_first() {
    use std::os::unix::process::ExitStatusExt;
    let prog = program();
    let profile = scratch_dir("contention_sigterm").join("waits.txt");
    let _alone = alone();
    let mut child = std::process::Command::new(&prog)
        .args(["mutex", "4", "10", "1000"])
        .env("LD_PRELOAD", lib())
        .env("CPUPROFILE_CONTENTION", &profile)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signals the child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    for (reader, total, table) in readers(&prog, &profile) {
        assert!(
            (1.0..8.0).contains(&total),
            "{reader}: {total} s of delay in 2 s of three threads waiting\n{table}"
        );
        let share = share(&cum_percentages(&table), "take_mutex");
        assert!(share >= 95.0, "{reader}: take_mutex holds {share}%\n{table}");
    }
}

/// The same killed by SIGKILL after 3 s: the checkpoint at 2 s (`CPUPROFILE_CHECKPOINT`'s
/// default) left the waits until then, read by every reader; with checkpoints off the file
/// stays empty.
#[test]
fn a_process_killed_by_sigkill_leaves_its_last_checkpoint() {
    use std::os::unix::process::ExitStatusExt;
    let prog = program();
    let dir = scratch_dir("contention_sigkill");
    let _alone = alone();
    // Four threads; the same without checkpoints; two single-threaded processes taking a
    // semaphore in shared memory in turn, whose checkpoints their own waits write (cpuprof
    // adds no thread to a single-threaded process).
    let cases = [
        ("mutex", "2", "take_mutex", 1.0),
        ("mutex", "off", "", 0.0),
        ("procs", "2", "take_shared_sem", 0.3),
    ];
    for (mode, checkpoint, waiter, least) in cases {
        let profile = dir.join(format!("waits-{mode}-{checkpoint}.txt"));
        let args: &[&str] = if mode == "procs" {
            &["procs", "10", "1000"]
        } else {
            &["mutex", "4", "10", "1000"]
        };
        let mut child = std::process::Command::new(&prog)
            .args(args)
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE_CONTENTION", &profile)
            .env("CPUPROFILE_CHECKPOINT", checkpoint)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_secs(3));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        let written = std::fs::read(&profile).unwrap();
        if checkpoint == "off" {
            assert!(written.is_empty(), "{}", String::from_utf8_lossy(&written));
            continue;
        }
        for (reader, total, table) in readers(&prog, &profile) {
            // Three threads waiting for the ~2 s before the checkpoint (less the start); one
            // process waiting half of them.
            assert!(
                (least..7.0).contains(&total),
                "{reader}: {total} s of delay at the checkpoint of {mode}\n{table}"
            );
            let share = share(&cum_percentages(&table), waiter);
            assert!(share >= 95.0, "{reader}: {waiter} holds {share}%\n{table}");
        }
    }
}

#[test]
fn contention_endpoints_serve_text_and_protobuf() {
    let prog = program();
    let dir = scratch_dir("contention_http");
    let _alone = alone();
    // On demand: no profile runs until the request.
    let child = HttpChild::start(&prog, &["mutex", "4", "8", "1000"], &[]);
    let (status, body) = http_exchange(
        &child.address,
        b"GET /pprof/contention?seconds=2 HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let text = dir.join("on_demand.txt");
    std::fs::write(&text, &body).unwrap();
    // Four threads waiting ~3/4 of the time for 2 s: ~6 s of delay.
    let (_, total, table) = readers(&prog, &text).remove(0);
    assert!((4.0..8.0).contains(&total), "{total} s over 2 s\n{table}");
    let (status, body) = http_exchange(
        &child.address,
        b"GET /debug/pprof/mutex?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    assert_eq!(status, 200);
    let pb = dir.join("mutex.pb.gz");
    std::fs::write(&pb, &body).unwrap();
    if require_tools(&["go"]) {
        let top = run_ok(
            Path::new("go"),
            &["tool", "pprof", "-top", pb.to_str().unwrap()],
            &[("HOME", std::env::temp_dir().to_str().unwrap())],
        );
        let top = String::from_utf8_lossy(&top.stdout);
        // Go's mutex profile is the holders' view: the releasing function.
        assert!(top.contains("Type: delay") && top.contains("release_mutex"), "{top}");
        assert!(!top.contains("take_mutex"), "{top}");
    }
    let (out, _) = child.finish();
    assert!(out.status.success());
    // Continuous (CPUPROFILE_CONTENTION): the profile so far.
    let child = HttpChild::start(
        &prog,
        &["mutex", "4", "4", "1000"],
        &[("CPUPROFILE_CONTENTION", dir.join("run.txt").to_str().unwrap())],
    );
    std::thread::sleep(Duration::from_secs(2));
    let (status, body) = http_exchange(
        &child.address,
        b"GET /debug/pprof/block HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(60),
    );
    assert_eq!(status, 200);
    assert!(body.len() > 100);
    let (out, _) = child.finish();
    assert!(out.status.success());
    assert!(dir.join("run.txt").exists());
}
