//! Accurate sample counts: per-thread timers for every thread, overrun weighting, the
//! high-resolution perf timer, and timers that never outlive their threads.

mod support;

use cpuprof::format::Profile;
use std::path::Path;
use support::*;

const FP_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

fn sampled_seconds(profile: &Path) -> f64 {
    let p = Profile::parse(&std::fs::read(profile).unwrap()).unwrap();
    p.total_samples() as f64 * p.period_us as f64 / 1e6
}

fn assert_total_matches_cpu(what: &str, profile: &Path, out: &std::process::Output) {
    let (sampled, cpu) = (sampled_seconds(profile), reported_cpu_seconds(out));
    assert!(
        (sampled - cpu).abs() <= 0.05 * cpu,
        "{what}: samples x period = {sampled:.3} s, CPU = {cpu:.3} s"
    );
}

#[test]
fn totals_match_cpu_time_at_every_frequency_single_threaded() {
    let dir = scratch_dir("totals1");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    for hz in ["100", "1000", "4000"] {
        let profile = dir.join(format!("{hz}.prof"));
        let out = run_preloaded(&hot, &["2"], &profile, &[("CPUPROFILE_FREQUENCY", hz)]);
        assert_total_matches_cpu(&format!("1 thread at {hz} Hz"), &profile, &out);
    }
}

#[test]
fn totals_match_cpu_time_at_every_frequency_with_four_threads() {
    let dir = scratch_dir("totals4");
    let prog = compile_c(&dir, "threads.c", "threads", FP_FLAGS, false);
    for hz in ["100", "1000", "4000"] {
        let profile = dir.join(format!("{hz}.prof"));
        let out = run_preloaded(&prog, &["4", "0.25"], &profile, &[("CPUPROFILE_FREQUENCY", hz)]);
        assert_total_matches_cpu(&format!("4 threads at {hz} Hz"), &profile, &out);
    }
}

/// Kernel time lands on the code that entered the kernel. The default timer (a POSIX CPU
/// timer per thread) counts it and interrupts at the system call's return, so `read`'s flat
/// share must match the run's system-time share (getrusage), at every frequency: above the
/// 250 Hz tick each signal stands for its missed expirations too.
#[test]
fn kernel_time_is_charged_to_the_system_call_at_every_frequency() {
    let dir = scratch_dir("kernel_time");
    let prog = compile_c(&dir, "kernel_time.c", "kernel_time", &["-O2"], false);
    // 100 Hz runs longer: the share's sampling error is sqrt(p(1-p)/n), ~2 points at 600 samples.
    for (hz, seconds) in [("100", "6"), ("1000", "3"), ("4000", "3")] {
        let profile = dir.join(format!("{hz}.prof"));
        let out = run_preloaded(&prog, &[seconds], &profile, &[("CPUPROFILE_FREQUENCY", hz)]);
        let (cpu, sys) = kernel_share(&out);
        assert_total_matches_cpu(
            &format!("{hz} Hz, {sys:.2} of {cpu:.2} s in the kernel"),
            &profile,
            &out,
        );
        let want = 100.0 * sys / cpu;
        for (reader, table) in [
            ("cpuprof", flat_percentages(&profile)),
            ("google-pprof", google_pprof(&prog, &profile)),
        ] {
            let read = ["read", "__read", "__libc_read", "__GI___libc_read"]
                .iter()
                .map(|f| share(&table, f))
                .fold(0.0, f64::max);
            assert!(
                (read - want).abs() <= 5.0,
                "{hz} Hz, {reader}: read has {read}% flat, the kernel {want:.1}%: {table:?}"
            );
        }
    }
}

/// The perf timer signals in user mode only (no EINTR), and weights each sample with the periods
/// its thread spent in the kernel since the last one, so its totals count kernel time too.
#[test]
fn perf_timer_totals_include_kernel_time() {
    let dir = scratch_dir("kernel_time_perf");
    let prog = compile_c(&dir, "kernel_time.c", "kernel_time", &["-O2"], false);
    let profile = dir.join("perf.prof");
    let out = run_preloaded(
        &prog,
        &["2"],
        &profile,
        &[("CPUPROFILE_FREQUENCY", "1000"), ("CPUPROFILE_TIMER", "perf")],
    );
    let (cpu, sys) = kernel_share(&out);
    assert_total_matches_cpu(
        &format!("perf timer, {sys:.2} of {cpu:.2} s in the kernel"),
        &profile,
        &out,
    );
}

/// CPU and system seconds the kernel_time workload reports; it must spend enough in the kernel.
fn kernel_share(out: &std::process::Output) -> (f64, f64) {
    let (cpu, sys): (f64, f64) = (reported_cpu_seconds(out), values(out)["sys"].parse().unwrap());
    assert!(
        sys > 0.15 * cpu,
        "workload spent too little time in the kernel to tell: {sys} of {cpu} s"
    );
    (cpu, sys)
}

/// Threads that live for less than a kernel tick are counted: the same 5 CPU-seconds split over
/// 16, 256 and 1,000 threads (~5 ms each), default timer at 100 Hz. A POSIX CPU timer's expiry is
/// only noticed on the tick, so most of the short threads exit with their sample undelivered;
/// each settles what its timer owed as it exits.
#[test]
fn short_lived_threads_are_counted() {
    let dir = scratch_dir("short_threads");
    let prog = compile_c(&dir, "short_threads.c", "short_threads", FP_FLAGS, false);
    for threads in ["16", "256", "1000"] {
        let profile = dir.join(format!("{threads}.prof"));
        let out = run_preloaded(&prog, &[threads, "5"], &profile, &[]);
        let (sampled, cpu) = (sampled_seconds(&profile), reported_cpu_seconds(&out));
        assert!(
            (sampled - cpu).abs() <= 0.10 * cpu,
            "{threads} threads: samples x period = {sampled:.3} s, CPU = {cpu:.3} s"
        );
        // The settled samples name the thread's start routine, so the work stays attributed to
        // the program's code, not to the profiler.
        let table = cpuprof_top(&profile);
        assert!(share(&table, "worker") >= 80.0, "{threads} threads: {table:?}");
    }
}

#[test]
fn per_thread_shares_follow_the_work() {
    let dir = scratch_dir("split");
    let prog = compile_c(&dir, "threads.c", "threads", FP_FLAGS, false);
    for timer in ["auto", "perf"] {
        let profile = dir.join(format!("{timer}.prof"));
        run_preloaded(
            &prog,
            &["4", "0.5"],
            &profile,
            &[("CPUPROFILE_FREQUENCY", "1000"), ("CPUPROFILE_TIMER", timer)],
        );
        let table = cpuprof_top(&profile);
        for (k, want) in [(1, 10.0), (2, 20.0), (3, 30.0), (4, 40.0)] {
            let got = share(&table, &format!("burn_{k}"));
            assert!(
                (got - want).abs() <= 3.0,
                "{timer}: thread {k} has {got}% (want {want} ± 3): {table:?}"
            );
        }
    }
}

#[test]
fn thirty_thousand_short_threads_leave_no_timers_behind() {
    let dir = scratch_dir("churn");
    let prog = compile_c(&dir, "churn.c", "churn", &["-O2"], false);
    for timer in ["thread", "perf"] {
        let out = run_preloaded(
            &prog,
            &["30000"],
            &dir.join(format!("{timer}.prof")),
            &[("CPUPROFILE_TIMER", timer)],
        );
        let v = values(&out);
        let threads: usize = v["threads"].parse().unwrap();
        let timers: usize = v["timers"].parse().unwrap();
        let perf_fds: usize = v["perf_fds"].parse().unwrap();
        assert!(timers <= threads && perf_fds <= threads, "{timer}: {v:?}");
        assert_eq!(
            v["sigqueue_ok"], "100/100 received 100",
            "{timer}: the application's sigqueue must work"
        );
    }
}

#[test]
fn itimer_is_still_available_and_capped_by_the_tick() {
    // The gperftools-compatible timer, for comparison: at 1000 Hz it delivers at most one
    // signal per kernel tick, so its total falls far short (the reason for per-thread timers).
    let dir = scratch_dir("itimer");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    let profile = dir.join("itimer.prof");
    let out = run_preloaded(
        &hot,
        &["1"],
        &profile,
        &[("CPUPROFILE_FREQUENCY", "1000"), ("CPUPROFILE_TIMER", "itimer")],
    );
    let (sampled, cpu) = (sampled_seconds(&profile), reported_cpu_seconds(&out));
    assert!(
        sampled < 0.5 * cpu,
        "itimer at 1000 Hz covers {sampled:.2} s of {cpu:.2} s CPU"
    );
}

#[test]
fn overrun_weighting_keeps_posix_timer_totals_right() {
    // POSIX thread timers fire on the 250 Hz tick; at 1000 and 4000 Hz each signal must count
    // 1 + si_overrun samples for the total to match the CPU time.
    let dir = scratch_dir("overrun");
    let hot = compile_c(&dir, "hot.c", "hot", FP_FLAGS, false);
    for hz in ["1000", "4000"] {
        let profile = dir.join(format!("{hz}.prof"));
        let out = run_preloaded(
            &hot,
            &["1.5"],
            &profile,
            &[("CPUPROFILE_FREQUENCY", hz), ("CPUPROFILE_TIMER", "thread")],
        );
        assert_total_matches_cpu(&format!("POSIX thread timer at {hz} Hz"), &profile, &out);
    }
}
