//! The profiler.h API of libcpuprof.so beyond start/stop, its exported symbols, and the
//! environment variables that change how a preloaded program is profiled.

mod support;

use cpuprof::format::Profile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::*;

const FP_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

#[test]
fn exports_exactly_the_profiler_h_functions() {
    let out = run_ok(Path::new("nm"), &["-D", "--defined-only", lib().to_str().unwrap()], &[]);
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    exported.sort();
    let mut expected = vec![
        "ProfilerDisable",
        "ProfilerEnable",
        "ProfilerFlush",
        "ProfilerGetCurrentState",
        "ProfilerGetStackTrace",
        "ProfilerRegisterThread",
        "ProfilerStart",
        "ProfilerStartWithOptions",
        "ProfilerStop",
        "ProfilingIsEnabledForAllThreads",
        // Interposed so that threads get their sampling timer as they start (issue 4).
        "pthread_create",
        // include/cpuprof.h: the on-demand HTTP endpoint (issue 8).
        "CpuprofServeHttp",
        // include/cpuprof.h: epoch mode into a profile database (issue 15).
        "CpuprofStartDatabase",
        // include/cpuprof.h: wall-clock profiles, alone or beside the CPU profile (issue 16).
        "CpuprofStartWall",
        // Interposed so that our signals wait while the program's handlers run on their
        // (possibly tiny) alternate signal stacks, and so that the ending signals whose default
        // action cpuprof holds (to complete the profile first) read back as SIG_DFL.
        "sigaction",
        "signal",
        // Interposed so that the ends of the process atexit does not see complete the profile.
        "_exit",
        "_Exit",
        "quick_exit",
        // Interposed so that no profiling signal reaches an exec'd image and the samples before
        // the exec are written.
        "execve",
        "execv",
        "execvp",
        "execvpe",
        "fexecve",
        "execveat",
        // C-variadic: naked functions jumping to C that gathers the arguments (execl*), or that
        // starts a waiting writer before a thread is cloned (clone).
        "execl",
        "execlp",
        "execle",
        "clone",
        // Interposed so that a profiling signal left pending by a thread that blocks it does not
        // interrupt the program's waits nor get handed to its sigwait (issue 16).
        "ppoll",
        "pselect",
        "epoll_pwait",
        "epoll_pwait2",
        "sigsuspend",
        "sigwait",
        "sigwaitinfo",
        "sigtimedwait",
        // Interposed so that a signalfd never yields the profiling signal (issue 24).
        "signalfd",
        // Interposed so that code unloaded in a process without a writer thread keeps its maps
        // line and build-id (issue 24).
        "dlclose",
        // Interposed so that a wall-clock profile keeps seeing blocked threads after the
        // program changes its credentials and stops being dumpable (issue 24).
        "setuid",
        "setgid",
        "seteuid",
        "setegid",
        "setreuid",
        "setregid",
        "setresuid",
        "setresgid",
        "setfsuid",
        "setfsgid",
        "prctl",
        // gperftools' heap-profiler.h, and the allocator's functions, counted for heap
        // profiles and passed to the next allocator (issue 27).
        "HeapProfilerStart",
        "HeapProfilerStop",
        "HeapProfilerDump",
        "IsHeapProfilerRunning",
        "GetHeapProfile",
        "malloc",
        "free",
        "calloc",
        "realloc",
        "reallocarray",
        "memalign",
        "posix_memalign",
        "aligned_alloc",
        "valloc",
        "pvalloc",
        "malloc_usable_size",
        // Labels on samples (issue 28): include/cpuprof.h.
        "CpuprofLabelsIntern",
        "CpuprofLabelsSwap",
        // Where threads wait, for contention profiles (issue 29): tried first, timed when they
        // would block; syscall for the futex waits of Rust's locks (C-variadic).
        "pthread_mutex_lock",
        "pthread_mutex_timedlock",
        "pthread_mutex_clocklock",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_wrlock",
        "sem_wait",
        "sem_timedwait",
        "syscall",
        // And where they let others go, for the holders' view: charged before passing on.
        "pthread_mutex_unlock",
        "pthread_rwlock_unlock",
        "sem_post",
        // include/cpuprof.h: contention profiles started and written by the program.
        "CpuprofStartContention",
        "CpuprofStopContention",
    ];
    expected.sort();
    assert_eq!(exported, expected);
}

#[test]
fn filter_in_thread_drops_the_excluded_threads_samples() {
    let dir = scratch_dir("filter");
    let prog = compile_c(&dir, "capi.c", "capi", FP_FLAGS, true);
    let profile = dir.join("filter.prof");
    run_ok(&prog, &["filter", profile.to_str().unwrap()], &[]);
    let top = cpuprof_top(&profile);
    assert!(share(&top, "allowed_work") > 90.0, "{top:?}");
    assert_eq!(share(&top, "excluded_work"), 0.0, "{top:?}");
}

#[test]
fn current_state_and_flush() {
    let dir = scratch_dir("state");
    let prog = compile_c(&dir, "capi.c", "capi", FP_FLAGS, true);
    let profile = dir.join("state.prof");
    let v = values(&run_ok(&prog, &["state", profile.to_str().unwrap()], &[]));
    assert_eq!(v["before_enabled"], "0");
    assert_eq!(v["during_enabled"], "1");
    assert_eq!(v["during_name"], profile.to_str().unwrap());
    assert!(v["during_samples"].parse::<i32>().unwrap() >= 20, "{v:?}");
    assert!((0..=5).contains(&v["during_age"].parse::<i64>().unwrap()), "{v:?}");
    assert_eq!(v["after_enabled"], "0");
    assert_eq!(v["after_samples"], "0");

    // What ProfilerFlush wrote: every sample so far, completed by a checkpoint's tail.
    let flushed = std::fs::read(dir.join("state.prof.flushed")).unwrap();
    let (partial, defect) = Profile::parse_lenient(&flushed).unwrap();
    assert!(defect.is_none(), "a flushed file is a complete profile: {defect:?}");
    let complete = read_profile(&profile);
    assert!(partial.total_samples() >= 20 && partial.total_samples() <= complete.total_samples());
}

#[test]
fn an_application_owned_sigprof_is_left_alone() {
    let dir = scratch_dir("ownsig");
    let prog = compile_c(&dir, "capi.c", "capi", FP_FLAGS, true);

    // Per-thread timers (the default) sample with a real-time signal of their own.
    let profile = dir.join("ownsig.prof");
    let out = run_ok(&prog, &["ownsig", profile.to_str().unwrap()], &[]);
    let v = values(&out);
    assert_eq!(
        (
            v["start"].as_str(),
            v["own_handler_calls"].as_str(),
            v["handler_kept"].as_str()
        ),
        ("1", "1", "1")
    );
    assert!(read_profile(&profile).total_samples() >= 20);

    // The process-wide timer can only use SIGPROF: profiling does not start.
    let profile = dir.join("itimer.prof");
    let out = run_ok(
        &prog,
        &["ownsig", profile.to_str().unwrap()],
        &[("CPUPROFILE_TIMER", "itimer")],
    );
    let v = values(&out);
    assert_eq!(
        (
            v["start"].as_str(),
            v["own_handler_calls"].as_str(),
            v["handler_kept"].as_str()
        ),
        ("0", "1", "1")
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SIGPROF") && stderr.contains("already has a handler"),
        "{stderr}"
    );
    assert!(!profile.exists(), "no file is created when profiling cannot start");
}

#[test]
fn get_stack_trace_returns_the_callers() {
    let dir = scratch_dir("stack");
    let prog = compile_c(&dir, "capi.c", "capi", &["-O1", "-fno-omit-frame-pointer"], true);
    let v = values(&run_ok(&prog, &["stack"], &[]));
    assert!(v["depth"].parse::<i32>().unwrap() >= 4, "{v:?}");
    for i in 0..3 {
        let offset: i64 = v[&format!("frame{i}_offset")].parse().unwrap();
        assert!((1..256).contains(&offset), "frame {i} is not inside f{}: {v:?}", 3 - i);
    }
}

#[test]
fn profiling_signal_toggles_numbered_profiles() {
    let dir = scratch_dir("toggle");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    // A CPU profile alone, then a CPU profile with the wall-clock one beside it: both files
    // numbered alike.
    for beside in [false, true] {
        let base = dir.join(format!("toggle-{beside}.prof"));
        let wall = dir.join(format!("wall-{beside}.prof"));
        let mut command = Command::new(&hot);
        command
            .arg("4")
            .env("LD_PRELOAD", lib())
            .env("CPUPROFILE", &base)
            .env("CPUPROFILESIGNAL", libc::SIGUSR2.to_string())
            .stdout(std::process::Stdio::null());
        if beside {
            command.env("CPUPROFILE_WALL", &wall);
        }
        let mut child = command.spawn().unwrap();
        let pid = child.id() as i32;
        for wait_ms in [500, 1200, 300, 1200] {
            std::thread::sleep(Duration::from_millis(wait_ms));
            assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
        }
        assert!(
            child.wait().unwrap().success(),
            "the toggle signal must not kill the program"
        );
        assert!(
            !base.exists() && !wall.exists(),
            "with CPUPROFILESIGNAL nothing is profiled until the signal"
        );
        // Each window is 1.2 s of wall time: ~120 samples on an idle machine, fewer CPU samples
        // when the program shares the CPU. What matters here is that each window was profiled.
        let numbered = |p: &Path, n: u32| PathBuf::from(format!("{}.{n}", p.display()));
        for n in 0..2 {
            let p = read_profile(&numbered(&base, n));
            assert!(
                p.total_samples() >= 20,
                "beside={beside} profile .{n}: {} samples",
                p.total_samples()
            );
            assert!(p.maps.contexts.is_empty(), "a CPU profile carries no states");
            if beside {
                // The wall profile counts the window's wall time whatever the load: 1.2 s at
                // 100 Hz of the one thread, within the toggle thread's reaction time.
                let w = read_profile(&numbered(&wall, n));
                let seconds = w.total_samples() as f64 * w.period_us as f64 / 1e6;
                assert!((0.9..=1.5).contains(&seconds), "wall profile .{n}: {seconds:.2} s");
                assert!(!w.maps.contexts.is_empty(), "wall profile .{n} carries states");
            }
        }
        assert!(!numbered(&base, 2).exists() && !numbered(&wall, 2).exists());
        assert_eq!(beside, numbered(&wall, 0).exists());
    }
}

#[test]
fn realtime_samples_wall_clock_time() {
    let dir = scratch_dir("realtime");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    let (cpu_prof, real_prof) = (dir.join("cpu.prof"), dir.join("real.prof"));
    // 0.5 s of CPU, then 1.5 s asleep. The program reports its CPU and wall time: on a busy
    // machine the CPU half takes longer than 0.5 s of wall time.
    let cpu_run = run_preloaded(&hot, &["0.5", "sleep", "1.5"], &cpu_prof, &[]);
    let real_run = run_preloaded(
        &hot,
        &["0.5", "sleep", "1.5"],
        &real_prof,
        &[("CPUPROFILE_REALTIME", "1")],
    );
    let seconds = |p: &Path| {
        let p = read_profile(p);
        p.total_samples() as f64 * p.period_us as f64 / 1e6
    };
    let wall = |out: &std::process::Output| -> f64 {
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("wall "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let (cpu, real) = (seconds(&cpu_prof), seconds(&real_prof));
    let cpu_used = reported_cpu_seconds(&cpu_run);
    assert!(
        (cpu - cpu_used).abs() < 0.15 * cpu_used,
        "CPU-time profile covers {cpu:.2} s of {cpu_used:.2} s CPU"
    );
    let elapsed = wall(&real_run);
    assert!(
        (real - elapsed).abs() < 0.15 * elapsed,
        "wall-clock profile covers {real:.2} s of {elapsed:.2} s"
    );
}

#[test]
fn use_pid_names_the_file_after_the_process() {
    let dir = scratch_dir("usepid");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    let base = dir.join("pid.prof");
    let child = Command::new(&hot)
        .arg("0.2")
        .env("LD_PRELOAD", lib())
        .env("CPUPROFILE", &base)
        .env("CPUPROFILE_USE_PID", "1")
        .output()
        .unwrap();
    assert!(child.status.success());
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let with_pid: Vec<_> = files.iter().filter(|f| f.starts_with("pid.prof_")).collect();
    assert_eq!(with_pid.len(), 1, "{files:?}");
    assert!(with_pid[0]["pid.prof_".len()..].parse::<u32>().is_ok());
    assert!(!base.exists());
}

/// `CpuprofStartWall` (include/cpuprof.h): main burns 1.5 s in `burn` while a thread blocks
/// 1.5 s in `read` under `wait_for_input`: alone, the wall profile gives each 1.5 s ± 10 %,
/// `wait_for_input` blocked in read; with a CPU file, that one holds `burn` only.
#[test]
fn start_wall_takes_a_wall_profile_alone_or_beside_the_cpu_one() {
    let dir = scratch_dir("wall-api");
    let prog = compile_c(&dir, "wall_api.c", "wall_api", &["-O2"], true);
    let (wall, cpu) = (dir.join("wall.prof"), dir.join("cpu.prof"));
    for beside in [false, true] {
        let mut args = vec![wall.to_str().unwrap()];
        if beside {
            args.push(cpu.to_str().unwrap());
        }
        let out = run_ok(&prog, &args, &[]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "read x\n");
        let profile = read_profile(&wall);
        assert!(!profile.maps.contexts.is_empty(), "samples carry thread states");
        let total = profile.total_samples() as f64 * profile.period_us as f64 / 1e6;
        let cum = cpuprof_top(&wall);
        let seconds_of = |f: &str| share(&cum, f) / 100.0 * total;
        for f in ["burn", "wait_for_input"] {
            assert!(
                (seconds_of(f) - 1.5).abs() <= 0.15,
                "beside={beside}: {f} {:.3} s",
                seconds_of(f)
            );
        }
        let blocked_in_read = profile
            .samples
            .iter()
            .filter(|s| s.context.as_ref().and_then(|c| c.syscall()) == Some("read"))
            .map(|s| s.count)
            .sum::<u64>() as f64
            * profile.period_us as f64
            / 1e6;
        assert!(
            (blocked_in_read - 1.5).abs() <= 0.15,
            "beside={beside}: {blocked_in_read:.3} s in read"
        );
        if beside {
            let on_cpu = cpuprof_top(&cpu);
            assert!(share(&on_cpu, "burn") > 90.0, "CPU profile: {on_cpu:?}");
            assert!(share(&on_cpu, "wait_for_input") < 1.0, "CPU profile: {on_cpu:?}");
        }
    }
}
