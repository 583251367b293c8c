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

/// A row of `cpuprof top` of a wall profile: cumulative samples and their split by thread
/// state (percentages of them), with the system call most blocked samples waited in.
#[derive(Debug, Default)]
struct Row {
    cum: f64,
    on_cpu: f64,
    runnable: f64,
    blocked: f64,
    waited_in: String,
}

/// `function -> row` and the period in seconds, from `cpuprof top --cum`.
fn top_rows(profile: &Path) -> (HashMap<String, Row>, f64) {
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
    assert!(
        text.contains(" on-CPU runnable blocked in "),
        "no thread states:\n{text}"
    );
    let pct = |s: &str| s.trim_end_matches('%').parse::<f64>().ok();
    let mut rows = HashMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 10 || !cols[4].ends_with('%') {
            continue;
        }
        let (Ok(cum), Some(on_cpu), Some(runnable), Some(blocked)) =
            (cols[3].parse(), pct(cols[5]), pct(cols[6]), pct(cols[7]))
        else {
            continue;
        };
        let row = Row {
            cum,
            on_cpu,
            runnable,
            blocked,
            waited_in: cols[8].to_string(),
        };
        rows.entry(cols[9..].join(" ")).or_insert(row);
    }
    (rows, period_us * 1e-6)
}

/// `key -> value -> seconds` from `go tool pprof -tags` of a protobuf profile.
fn go_tags(pprof: &Path) -> HashMap<String, HashMap<String, f64>> {
    let out = run_ok(
        Path::new("go"),
        &["tool", "pprof", "-tags", pprof.to_str().unwrap()],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut tags: HashMap<String, HashMap<String, f64>> = HashMap::new();
    let mut key = String::new();
    for line in text.lines() {
        if let Some((k, _)) = line.trim().split_once(": Total") {
            key = k.to_string();
        } else if let Some((amount, value)) = line.trim().split_once(" (") {
            let value = value.split_once("): ").map_or("", |(_, v)| v).to_string();
            let seconds = match amount.strip_suffix("ms") {
                Some(ms) => ms.parse::<f64>().unwrap_or(0.0) / 1000.0,
                None => amount.trim_end_matches('s').parse().unwrap_or(0.0),
            };
            tags.entry(key.clone()).or_default().insert(value, seconds);
        }
    }
    assert!(!tags.is_empty(), "no tags in:\n{text}");
    tags
}

fn stderr_value(out: &Output, key: &str) -> f64 {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} on stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Thread A burns 2 s in `burn`, B blocks 2 s in `read` under `wait_for_input`, C 2 s in
/// `pthread_cond_timedwait` under `wait_for_work`: each function gets 2 s ± 10 % of wall
/// samples, `burn` on a CPU for its thread's CPU time ± 10 % and runnable for the rest, the
/// blocked ones blocked in their system calls, with stacks to clone3; google-pprof and go tool
/// pprof read the same shares, and go tool pprof the thread, state and call labels. Crowded:
/// A shares one CPU with a rival burning thread, so about half of each one's 2 s is spent
/// runnable, waiting for the CPU, and must still be counted.
#[test]
fn each_thread_gets_its_wall_time_blocked_or_burning() {
    let dir = scratch_dir("wall-known");
    let program = compile_c(&dir, "wall_known.c", "wall_known", &["-O2"], false);
    for (hz, crowded) in [("100", false), ("1000", false), ("100", true)] {
        let args: &[&str] = if crowded { &["2", "crowded"] } else { &[] };
        let hz_label = if crowded {
            format!("{hz} crowded")
        } else {
            hz.to_string()
        };
        let hz = hz_label.as_str();
        let plain = run_ok(&program, args, &[]);
        let profile = dir.join(format!("wall-{}.prof", hz.replace(' ', "-")));
        let out = run_profiled(
            &program,
            args,
            &[
                ("CPUPROFILE_WALL", profile.to_str().unwrap()),
                ("CPUPROFILE_WALL_FREQUENCY", &hz[..hz.find(' ').unwrap_or(hz.len())]),
            ],
        );
        assert_eq!(out.stdout, plain.stdout, "{hz} Hz: output differs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cpuprof: wall-clock sampler: ") && !stderr.contains("looks could not read"),
            "{hz} Hz: {stderr}"
        );
        read_profile(&profile);
        let (rows, period) = top_rows(&profile);
        let counts: HashMap<&String, f64> = rows.iter().map(|(f, r)| (f, r.cum)).collect();
        let seconds = |f: &str| rows.get(f).map_or(0.0, |r| r.cum) * period;
        let burners: &[&str] = if crowded { &["burn", "rival_burn"] } else { &["burn"] };
        for f in ["wait_for_input", "wait_for_work"].iter().chain(burners) {
            assert!(
                (seconds(f) - 2.0).abs() <= 0.2,
                "{hz} Hz: {f} has {:.3} s, want 2 s ± 10 %: {counts:?}",
                seconds(f)
            );
        }
        let a_cpu = stderr_value(&out, "a_cpu");
        let burn_on_cpu = seconds("burn") * rows["burn"].on_cpu / 100.0;
        assert!(
            (burn_on_cpu - a_cpu).abs() <= 0.1 * a_cpu,
            "{hz} Hz: burn is on a CPU for {burn_on_cpu:.3} s, its thread's CPU time is {a_cpu} s: {:?}",
            rows["burn"]
        );
        if crowded {
            assert!(rows["burn"].runnable >= 25.0, "{hz} Hz: {:?}", rows["burn"]);
        }
        let threads = seconds("burn") + seconds("wait_for_input") + seconds("wait_for_work");
        assert!(
            seconds("clone3") >= 0.99 * threads,
            "{hz} Hz: only {:.3} of {threads:.3} s of the threads' samples reach clone3: {counts:?}",
            seconds("clone3")
        );
        // Thread states: each function's time where it was spent, and the call it waited in.
        for (f, call) in [("wait_for_input", "read"), ("wait_for_work", "futex")] {
            let row = &rows[f];
            assert!(row.blocked >= 99.0 && row.waited_in == call, "{hz} Hz: {f}: {row:?}");
        }
        assert!(
            rows["burn"].on_cpu + rows["burn"].runnable >= 99.0,
            "{hz} Hz: burn: {:?}",
            rows["burn"]
        );
        // The same as labels in protobuf, read by go tool pprof: threads by name, states, calls.
        let pprof = dir.join(format!("wall-{hz}.pb.gz"));
        run_ok(
            cli(),
            &[
                "convert",
                "--to",
                "pprof",
                "--output",
                pprof.to_str().unwrap(),
                profile.to_str().unwrap(),
            ],
            &[],
        );
        let tags = go_tags(&pprof);
        let tag = |key: &str, value: &str| tags.get(key).and_then(|v| v.get(value)).copied().unwrap_or(0.0);
        for (thread, want) in [("reader", 2.0), ("waiter", 2.0), ("burner", seconds("burn"))] {
            assert!(
                (tag("thread", thread) - want).abs() <= 0.1 * want + 0.02,
                "{hz} Hz: thread {thread} has {} s, want {want:.2}: {tags:?}",
                tag("thread", thread)
            );
        }
        assert!((tag("syscall", "read") - 2.0).abs() <= 0.2, "{hz} Hz: {tags:?}");
        assert!(tag("syscall", "futex") >= 1.8, "{hz} Hz: {tags:?}");
        let burning: f64 = burners.iter().map(|f| seconds(f)).sum();
        assert!(
            (tag("state", "on-cpu") + tag("state", "runnable") - burning).abs() <= 0.1 * burning,
            "{hz} Hz: {tags:?}"
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

/// Code built with frame pointers: a blocked function that called a wrapper which does not
/// save rbp (glibc's `read`) is stepped by its proven frame record, so its stack still reaches
/// clone3 (before: 0 of 200 of `wait_for_input`'s stacks did). `main`, which libc calls
/// through a pointer, cannot be proven and may end its stack.
#[test]
fn blocked_stacks_of_frame_pointer_code_reach_their_roots() {
    let dir = scratch_dir("wall-fp");
    let program = compile_c(
        &dir,
        "wall_known.c",
        "wall_known",
        &["-O2", "-fno-omit-frame-pointer"],
        false,
    );
    let profile = dir.join("wall.prof");
    let out = run_profiled(
        &program,
        &["1"],
        &[
            ("CPUPROFILE_WALL", profile.to_str().unwrap()),
            ("CPUPROFILE_WALL_FREQUENCY", "100"),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let collapsed = run_ok(cli(), &["collapse", profile.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&collapsed.stdout);
    for f in ["wait_for_input", "wait_for_work", "burn"] {
        let (mut all, mut rooted) = (0u64, 0u64);
        for line in text
            .lines()
            .filter(|l| l.contains(&format!(";{f};")) || l.contains(&format!(";{f} ")))
        {
            let count: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            all += count;
            if line.starts_with("clone3;") {
                rooted += count;
            }
        }
        assert!(
            all > 50 && rooted as f64 >= 0.99 * all as f64,
            "{f}: {rooted} of {all} reach clone3:\n{text}"
        );
    }
}

/// Both profiles from one run (`CPUPROFILE` and `CPUPROFILE_WALL`), on the crowded known
/// answer: the CPU profile holds CPU time only (burn and rival_burn half each, nothing of the
/// blocked threads, no thread states), the wall profile every thread's 2 s with its states,
/// burn on a CPU for its thread's CPU time; every reader reads both.
#[test]
fn cpu_and_wall_profiles_from_one_run() {
    let dir = scratch_dir("wall-beside");
    let program = compile_c(&dir, "wall_known.c", "wall_known", &["-O2"], false);
    let (cpu, wall) = (dir.join("cpu.prof"), dir.join("wall.prof"));
    let args = ["2", "crowded"];
    let plain = run_ok(&program, &args, &[]);
    let out = run_profiled(
        &program,
        &args,
        &[
            ("CPUPROFILE", cpu.to_str().unwrap()),
            ("CPUPROFILE_FREQUENCY", "250"),
            ("CPUPROFILE_WALL", wall.to_str().unwrap()),
            ("CPUPROFILE_WALL_FREQUENCY", "100"),
        ],
    );
    assert_eq!(out.stdout, plain.stdout, "output differs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("PROFILE: interrupts") && stderr.contains("cpuprof: wall-clock profile '"),
        "{stderr}"
    );
    let (cpu_profile, wall_profile) = (read_profile(&cpu), read_profile(&wall));
    assert_eq!((cpu_profile.period_us, wall_profile.period_us), (4000, 10000));
    assert!(cpu_profile.maps.contexts.is_empty() && !wall_profile.maps.contexts.is_empty());

    let on_cpu = cpuprof_top(&cpu);
    for f in ["burn", "rival_burn"] {
        assert!((share(&on_cpu, f) - 50.0).abs() <= 8.0, "CPU profile: {f}: {on_cpu:?}");
    }
    for f in ["wait_for_input", "wait_for_work"] {
        assert!(share(&on_cpu, f) < 1.0, "CPU profile: {f} used no CPU: {on_cpu:?}");
    }
    let (rows, period) = top_rows(&wall);
    let seconds = |f: &str| rows.get(f).map_or(0.0, |r| r.cum) * period;
    for f in ["burn", "rival_burn", "wait_for_input", "wait_for_work"] {
        assert!(
            (seconds(f) - 2.0).abs() <= 0.2,
            "wall profile: {f} has {:.3} s: {rows:?}",
            seconds(f)
        );
    }
    let a_cpu = stderr_value(&out, "a_cpu");
    let burn_on_cpu = seconds("burn") * rows["burn"].on_cpu / 100.0;
    // Each of burn's wall samples on a CPU stands for a wall period (10 ms) of its CPU time.
    assert!(
        (burn_on_cpu - a_cpu).abs() <= (0.1 * a_cpu).max(3.0 * period),
        "wall profile: burn on a CPU {burn_on_cpu:.3} s, its thread's CPU time {a_cpu} s: {:?}",
        rows["burn"]
    );
    for (profile, reader, table) in [
        (&cpu, "google-pprof", google_pprof(&program, &cpu)),
        (&cpu, "go tool pprof", go_pprof(&program, &cpu)),
        (&wall, "google-pprof", google_pprof(&program, &wall)),
        (&wall, "go tool pprof", go_pprof(&program, &wall)),
    ] {
        let ours = cpuprof_top(profile);
        for f in ["burn", "rival_burn"] {
            assert!(
                (share(&table, f) - share(&ours, f)).abs() <= 1.0,
                "{}: {reader} gives {f} {}%, cpuprof {}%",
                profile.display(),
                share(&table, f),
                share(&ours, f)
            );
        }
    }
}

/// Threads blocked in nanosleep, epoll_wait, poll, select, accept, futex waits, sem_timedwait
/// and a pipe read, each aborting on EINTR or an early return: the same output and exit status
/// under wall profiling at 100 and 1000 Hz, under CPU profiling at 100 and 4000 Hz, and under
/// both at once.
#[test]
fn no_blocked_call_is_interrupted_under_wall_or_cpu_profiling() {
    let dir = scratch_dir("wall-eintr");
    let program = compile_c(&dir, "eintr_sentinel.c", "eintr_sentinel", &["-O2"], false);
    let plain = run_ok(&program, &["3"], &[]);
    let (wall, cpu) = (dir.join("wall.prof"), dir.join("cpu.prof"));
    let (wall, cpu) = (wall.to_str().unwrap(), cpu.to_str().unwrap());
    let runs: [&[(&str, &str)]; 5] = [
        &[("CPUPROFILE_WALL", wall), ("CPUPROFILE_WALL_FREQUENCY", "100")],
        &[("CPUPROFILE_WALL", wall), ("CPUPROFILE_WALL_FREQUENCY", "1000")],
        &[("CPUPROFILE", cpu), ("CPUPROFILE_FREQUENCY", "100")],
        &[("CPUPROFILE", cpu), ("CPUPROFILE_FREQUENCY", "4000")],
        &[
            ("CPUPROFILE", cpu),
            ("CPUPROFILE_FREQUENCY", "4000"),
            ("CPUPROFILE_WALL", wall),
            ("CPUPROFILE_WALL_FREQUENCY", "1000"),
        ],
    ];
    for env in runs {
        let _ = (std::fs::remove_file(wall), std::fs::remove_file(cpu));
        let out = run_profiled(&program, &["3"], env);
        assert_eq!(out.stdout, plain.stdout, "{env:?}: output differs");
        for (variable, path) in env.iter().filter(|(v, _)| !v.ends_with("FREQUENCY")) {
            let parsed = read_profile(Path::new(path));
            assert!(parsed.records > 0, "{env:?}: empty {variable} profile");
        }
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

/// The wall profile of `tests/c/wall_privdrop.c`, started as root, which drops to `nobody`
/// after starting one thread and starts three more (issue 24: `memcached -u memcache`).
/// `None` (the test is skipped, with a message) unless running as root with a `nobody` user.
fn privdrop_program(dir: &Path) -> Option<std::path::PathBuf> {
    if !require_root("dropping privileges") {
        return None;
    }
    // SAFETY: a constant NUL-terminated name; the result is only compared with NULL.
    if unsafe { libc::getpwnam(c"nobody".as_ptr()) }.is_null() {
        skip("no user 'nobody' to drop to");
        return None;
    }
    Some(compile_c(dir, "wall_privdrop.c", "wall_privdrop", &["-O2"], false))
}

/// After `setgid`+`setuid` the process is not dumpable and its threads' syscall files are
/// root's: the thread started before the drop is read through the descriptor opened for it
/// before the change, the three started after through their context switches. Each thread's
/// blocked time is in the profile (2 s ± 10 %, the early one 50 ms more), blocked in its call,
/// none of the sampler's looks is missing, and `cpuprof check` calls the profile valid.
#[test]
fn threads_blocked_after_a_privilege_drop_keep_their_wall_time() {
    let dir = scratch_dir("wall-privdrop");
    let Some(program) = privdrop_program(&dir) else { return };
    let profile = dir.join("wall.prof");
    let out = run_profiled(
        &program,
        &["nobody", "2"],
        &[
            ("CPUPROFILE_WALL", profile.to_str().unwrap()),
            ("CPUPROFILE_WALL_FREQUENCY", "100"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(String::from_utf8_lossy(&out.stdout).contains("dumpable 0"), "{out:?}");
    assert!(
        stderr.contains("took their registers from context switches (0 in a system call that could not be named")
            && !stderr.contains("could not read the thread's state"),
        "{stderr}"
    );
    let (rows, period) = top_rows(&profile);
    let seconds = |f: &str| rows.get(f).map_or(0.0, |r| r.cum) * period;
    for (f, call, want) in [
        ("wait_early", "read", 2.05),
        ("wait_in_read", "read", 2.0),
        ("wait_in_sleep", "clock_nanosleep", 2.0),
        ("wait_in_cond", "futex", 2.0),
    ] {
        assert!(
            (seconds(f) - want).abs() <= 0.1 * want,
            "{f} has {:.3} s, want {want} s ± 10 %: {rows:?}",
            seconds(f)
        );
        let row = &rows[f];
        assert!(row.blocked >= 99.0 && row.waited_in == call, "{f}: {row:?}");
    }
    let threads: f64 = ["wait_early", "wait_in_read", "wait_in_sleep", "wait_in_cond"]
        .iter()
        .map(|f| seconds(f))
        .sum();
    // Every thread's stack reaches its start: cpuprof's start wrapper, and clone3 through it
    // when the switch records give the frame pointer, which a syscall line lacks. The early
    // thread's walks may stop at the wrapper (all of its 2 s did in one CI rehearsal, where
    // the other three threads reached clone3): clone3 is asserted for those three.
    let reach_start = seconds("cpuprof::start_thread");
    assert!(
        reach_start >= 0.97 * threads,
        "only {reach_start:.3} of {threads:.3} s reach the thread's start: {rows:?}"
    );
    let later: f64 = ["wait_in_read", "wait_in_sleep", "wait_in_cond"]
        .iter()
        .map(|f| seconds(f))
        .sum();
    assert!(
        seconds("clone3") >= 0.97 * later,
        "only {:.3} of {later:.3} s reach clone3: {rows:?}",
        seconds("clone3")
    );
    let looks = read_profile(&profile).maps.wall_looks.expect("a # wall-looks line");
    assert!(looks.looks > 500 && looks.missing == 0, "{looks:?}");
    let check = run_ok(cli(), &["check", profile.to_str().unwrap()], &[]);
    assert!(
        String::from_utf8_lossy(&check.stdout).contains(": valid ") && check.stderr.is_empty(),
        "{check:?}"
    );
}

/// The same program starting its wall profile itself after the drop (`CpuprofStartWall`):
/// nothing was opened before the change, so no blocked thread can be seen. The missing looks
/// are counted by thread and reason at stop, recorded in the profile, and `cpuprof check`
/// calls the profile INCOMPLETE (exit status 1) instead of valid.
#[test]
fn a_wall_profile_that_cannot_see_blocked_threads_says_so() {
    let dir = scratch_dir("wall-privdrop-late");
    let Some(program) = privdrop_program(&dir) else { return };
    // Written after the drop: a directory `nobody` may write in.
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let profile = open.join("late.prof");
    let out = run_profiled(
        &program,
        &["nobody", "1", "late"],
        &[("WALL_LATE_PROFILE", profile.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "looks at 5 threads could not read the thread's state and are missing: the process is not dumpable"
        ) && stderr.contains("saw no credential change"),
        "{stderr}"
    );
    let looks = read_profile(&profile).maps.wall_looks.expect("a # wall-looks line");
    // Looks that found a thread running (its CPU timer samples it) are not missing.
    assert!(
        looks.looks > 100
            && looks.missing as f64 >= 0.9 * looks.looks as f64
            && looks.reasons == [("denied".to_string(), looks.missing)],
        "{looks:?}"
    );
    let check = Command::new(cli())
        .args(["check", profile.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.code() == Some(1)
            && said.contains(": INCOMPLETE ")
            && said.contains(&format!(
                "{} of {} looks at threads ({:.1} %) are missing",
                looks.missing,
                looks.looks,
                100.0 * looks.missing_share()
            )),
        "{check:?}"
    );
}
