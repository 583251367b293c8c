#!/usr/bin/env python3
"""cpuprof's Rust API beside pprof-rs 0.15: dependencies, clean release build time, samples per
CPU-second at 1000 Hz (one thread and four), and the lines a user writes for start, stop, a
flame graph and a pprof protobuf. Prints markdown tables on stdout (progress on stderr).

    python3 bench/compare_pprof_rs.py [--workdir /tmp/cmp-pprof-rs] [--build-rounds 2]
                                      [--rounds 5] [--seconds 3] [--threads 4] [--jobs 2]
                                      [--skip-build-timing]

It writes two small cargo projects under --workdir, each a binary that profiles the same
workload at 1000 Hz: two functions, hot_a doing three times the work of hot_b, called in
rounds until each thread has used --seconds of CPU (one thread, then --threads threads named
worker-N, each --seconds). One project uses pprof-rs 0.15 (features flamegraph and
prost-codec, the blocklist its documentation suggests), the other cpuprof through a path
dependency on this repository. Each run prints the samples it got, the signals behind them and
the process CPU time between start and stop.

Measurements are interleaved (A B A B ...) so that drift on a shared machine hits both alike;
tables show medians over rounds and the median of the per-round ratios. Clean builds run
`cargo clean` then `cargo build --release -j JOBS` with a target directory per project, after
`cargo fetch` (no download is timed). The load average is recorded before and after each
timed phase. Needs cargo with crates.io reachable (once, for the fetch); go tool pprof, when
present, is used to check both protobufs."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKLIST = '&["libc", "libgcc", "pthread", "vdso"]'

# The same workload in both projects.
WORKLOAD_RS = r'''//! The profiled work: hot_a does three times hot_b's work, in rounds, until the thread has
//! used the asked CPU time (read with getrusage(RUSAGE_THREAD), which does not make the
//! scheduler preempt the loop at a round's end).
use std::hint::black_box;

const ROUND: u64 = 20_000;

#[inline(never)]
pub fn hot_a(n: u64) -> u64 {
    (0..3 * n).fold(1u64, |h, i| black_box(h.wrapping_mul(0x100000001b3) ^ i))
}

#[inline(never)]
pub fn hot_b(n: u64) -> u64 {
    (0..n).fold(7u64, |h, i| black_box(h.wrapping_mul(0x100000001b3) ^ i))
}

fn cpu_seconds(who: libc::c_int) -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// CPU time of the whole process (every thread, the profiler's own included).
pub fn process_cpu() -> f64 {
    cpu_seconds(libc::RUSAGE_SELF)
}

fn spin(seconds: f64) -> u64 {
    let start = cpu_seconds(libc::RUSAGE_THREAD);
    let mut total = 0u64;
    while cpu_seconds(libc::RUSAGE_THREAD) - start < seconds {
        total = total.wrapping_add(hot_a(ROUND)).wrapping_add(hot_b(ROUND));
    }
    total
}

/// One thread: the calling one. More: that many threads named worker-N, each `seconds` of CPU.
pub fn run(threads: usize, seconds: f64) -> u64 {
    if threads <= 1 {
        return spin(seconds);
    }
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("worker-{i}"))
                    .spawn_scoped(s, move || spin(seconds))
                    .unwrap()
            })
            .collect();
        workers.into_iter().fold(0u64, |t, w| t.wrapping_add(w.join().unwrap()))
    })
}
'''

PPROF_TOML = '''[package]
name = "cmp-pprof-rs"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
pprof = { version = "0.15", features = ["flamegraph", "prost-codec"] }
libc = "0.2"

[workspace]
'''

CPUPROF_TOML = '''[package]
name = "cmp-cpuprof"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
cpuprof = { path = "@ROOT@" }
libc = "0.2"

[workspace]
'''

PPROF_MAIN = r'''mod workload;

use std::collections::BTreeSet;
use std::error::Error;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args[1].parse()?;
    let seconds: f64 = args[2].parse()?;
    let before_start = workload::process_cpu();
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(1000)
        .blocklist(@BLOCKLIST@)
        .build()?;
    // The rate's CPU time counts from here: the timer is armed last in build().
    let (cpu0, wall0) = (workload::process_cpu(), Instant::now());
    let checksum = workload::run(threads, seconds);
    let (cpu, wall) = (workload::process_cpu() - cpu0, wall0.elapsed().as_secs_f64());
    let report = guard.report().build()?;
    drop(guard);
    let (mut samples, mut hot_a, mut hot_b) = (0i64, 0i64, 0i64);
    let mut names = BTreeSet::new();
    for (frames, count) in &report.data {
        let count = *count as i64;
        samples += count;
        names.insert(frames.thread_name_or_id());
        // The stack may start with the signal handler's own frames: look at every frame (hot_a
        // and hot_b call nothing that is not inlined, and never each other).
        let has = |f: &str| frames.frames.iter().flatten().any(|s| s.name().contains(f));
        if has("hot_a") {
            hot_a += count;
        } else if has("hot_b") {
            hot_b += count;
        }
    }
    println!(
        "{{\"samples\": {samples}, \"signals\": {samples}, \"cpu_s\": {cpu:.4}, \"wall_s\": {wall:.4}, \
         \"start_cpu_s\": {:.4}, \"hot_a\": {hot_a}, \"hot_b\": {hot_b}, \"thread_names\": {}, \"checksum\": \"{checksum:x}\"}}",
        cpu0 - before_start,
        names.len()
    );
    Ok(())
}
'''

CPUPROF_MAIN = r'''mod workload;

use cpuprof::TimerChoice;
use std::error::Error;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args[1].parse()?;
    let seconds: f64 = args[2].parse()?;
    let path = &args[3];
    let timer = match args.get(4).map(String::as_str) {
        Some("itimer") => TimerChoice::Itimer,
        Some("perf") => TimerChoice::Perf,
        _ => TimerChoice::Auto,
    };
    let before_start = workload::process_cpu();
    let guard = cpuprof::Profiler::builder()
        .frequency(1000)
        .timer(timer)
        .report_on_stderr(false)
        .start(path)?;
    let (cpu0, wall0) = (workload::process_cpu(), Instant::now());
    let checksum = workload::run(threads, seconds);
    let (cpu, wall) = (workload::process_cpu() - cpu0, wall0.elapsed().as_secs_f64());
    let report = guard.stop()?;
    let profile = cpuprof::format::Profile::parse(&std::fs::read(path)?)?;
    println!(
        "{{\"samples\": {}, \"signals\": {}, \"cpu_s\": {cpu:.4}, \"wall_s\": {wall:.4}, \
         \"lost\": {}, \"unsampled_threads\": {}, \"start_cpu_s\": {:.4}, \"checksum\": \"{checksum:x}\"}}",
        profile.total_samples(),
        report.interrupts,
        report.lost,
        report.unsampled_threads,
        cpu0 - before_start
    );
    Ok(())
}
'''

# What a user writes: start, stop, a flame graph and a pprof protobuf. Lines counted: all but
# blank lines, comments, `fn main`'s skeleton and the workload call.
PPROF_USAGE = '''#[path = "../src/workload.rs"]
mod workload;

use pprof::protos::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let guard = pprof::ProfilerGuardBuilder::default().frequency(1000).blocklist(@BLOCKLIST@).build()?;
    workload::run(1, 1.0);
    let report = guard.report().build()?;
    report.flamegraph(std::fs::File::create("flamegraph.svg")?)?;
    std::fs::write("profile.pb", report.pprof()?.encode_to_vec())?;
    Ok(())
}
'''

CPUPROF_USAGE = '''#[path = "../src/workload.rs"]
mod workload;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let guard = cpuprof::Profiler::builder().frequency(1000).start("cpu.prof")?;
    workload::run(1, 1.0);
    guard.stop()?;
    Ok(())
}
'''

# cpuprof today draws the flame graph and writes protobuf with its command-line tool.
CPUPROF_USAGE_SH = '''cpuprof flamegraph cpu.prof -o flamegraph.svg
cpuprof convert cpu.prof --to pprof -o profile.pb.gz
'''

SKELETON = re.compile(r'^\s*(fn main\(|Ok\(\(\)\)$|\}$|workload::run|mod workload;|#\[path)')


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, cwd=None, env=None, capture=True, check=True):
    return subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **(env or {})), text=True, check=check,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def make_projects(workdir):
    pprof_dir, cpuprof_dir = os.path.join(workdir, "pprof-rs"), os.path.join(workdir, "cpuprof")
    for d in (pprof_dir, cpuprof_dir):
        write(os.path.join(d, "src/workload.rs"), WORKLOAD_RS)
    write(os.path.join(pprof_dir, "Cargo.toml"), PPROF_TOML)
    write(os.path.join(pprof_dir, "src/main.rs"), PPROF_MAIN.replace("@BLOCKLIST@", BLOCKLIST))
    write(os.path.join(pprof_dir, "examples/usage.rs"), PPROF_USAGE.replace("@BLOCKLIST@", BLOCKLIST))
    write(os.path.join(cpuprof_dir, "Cargo.toml"), CPUPROF_TOML.replace("@ROOT@", ROOT))
    write(os.path.join(cpuprof_dir, "src/main.rs"), CPUPROF_MAIN)
    write(os.path.join(cpuprof_dir, "examples/usage.rs"), CPUPROF_USAGE)
    write(os.path.join(cpuprof_dir, "examples/usage.sh"), CPUPROF_USAGE_SH)
    return {"pprof-rs": pprof_dir, "cpuprof": cpuprof_dir}


def target_env(workdir, name):
    return {"CARGO_TARGET_DIR": os.path.join(workdir, "target-" + name)}


def dependencies(project):
    """Distinct packages (name and version) in the dependency graph, the project excluded."""
    out = {}
    for edges in ("normal", "normal,build"):
        lines = run(["cargo", "tree", "--frozen", "-e", edges, "--prefix", "none"], cwd=project).stdout.splitlines()
        packages = {" ".join(line.split()[:2]) for line in lines if line.strip()}
        packages.discard(" ".join(lines[0].split()[:2]))
        out[edges] = sorted(packages)
    return out


def clean_build(project, env, jobs):
    run(["cargo", "clean"], cwd=project, env=env)
    before = load()
    start = time.monotonic()
    proc = run(["cargo", "build", "--release", "--frozen", "-j", str(jobs)], cwd=project, env=env)
    seconds = time.monotonic() - start
    compiled = sum(1 for line in proc.stderr.splitlines() if line.strip().startswith("Compiling "))
    return {"seconds": seconds, "compiled": compiled - 1, "load_before": before, "load_after": load()}


def count_lines(text):
    return sum(1 for line in text.splitlines()
               if line.strip() and not line.strip().startswith("//") and not SKELETON.match(line))


def median(values):
    return statistics.median(values) if values else float("nan")


def hot_a_share_cpuprof(cli, profile):
    """hot_a's flat share of hot_a + hot_b, from `cpuprof top`."""
    out = run([cli, "top", profile, "-n", "50"]).stdout
    flat = {}
    for line in out.splitlines():
        fields = line.split()
        for name in ("hot_a", "hot_b"):
            if fields and fields[-1].endswith("workload::" + name) and fields[0].isdigit():
                flat[name] = int(fields[0])
    a, b = flat.get("hot_a", 0), flat.get("hot_b", 0)
    return a / (a + b) if a + b else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/cmp-pprof-rs")
    parser.add_argument("--build-rounds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per thread")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--skip-build-timing", action="store_true",
                        help="build once without timing (for trying the rest quickly)")
    args = parser.parse_args()
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    projects = make_projects(workdir)
    results = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cores": os.cpu_count(), "uname": os.uname().release}

    log("fetching and resolving (not timed)")
    for name, project in projects.items():
        run(["cargo", "generate-lockfile"], cwd=project)
        run(["cargo", "fetch", "--locked"], cwd=project)
    results["pprof_version"] = next(line.split()[1] for line in run(
        ["cargo", "tree", "--frozen", "-e", "normal", "--prefix", "none", "-i", "pprof"],
        cwd=projects["pprof-rs"]).stdout.splitlines() if line.startswith("pprof "))
    results["dependencies"] = {name: dependencies(p) for name, p in projects.items()}

    # (b) clean release builds, interleaved.
    builds = {name: [] for name in projects}
    if args.skip_build_timing:
        for name, project in projects.items():
            run(["cargo", "build", "--release", "--frozen", "-j", str(args.jobs)], cwd=project,
                env=target_env(workdir, name))
    else:
        for r in range(args.build_rounds):
            for name, project in projects.items():
                log(f"clean build {r + 1}/{args.build_rounds}: {name}")
                builds[name].append(clean_build(project, target_env(workdir, name), args.jobs))
                log(f"  {builds[name][-1]}")
    results["builds"] = builds

    # The cpuprof command-line tool, for the usage example and hot_a's share (not timed).
    log("building the cpuprof command-line tool (not timed)")
    cli_target = os.path.join(workdir, "cli-target")
    run(["nice", "-n", "19", "cargo", "build", "--release", "-p", "cpuprof-cli"], cwd=ROOT,
        env={"CARGO_TARGET_DIR": cli_target})
    cli = os.path.join(cli_target, "release", "cpuprof")

    # (c) samples per CPU-second, interleaved: in each round every configuration once.
    exes = {name: os.path.join(workdir, "target-" + name, "release", "cmp-" + name) for name in projects}
    configs = [("pprof-rs", None), ("cpuprof", "auto"), ("cpuprof", "itimer"), ("cpuprof", "perf")]
    runs = {}
    prof = os.path.join(workdir, "run.prof")
    results["rate_load_before"] = load()
    for r in range(args.rounds):
        for threads in (1, args.threads):
            for name, timer in configs:
                key = f"{name} {timer}" if timer else name
                log(f"round {r + 1}/{args.rounds}, {threads} thread(s): {key}")
                cmd = [exes[name], str(threads), str(args.seconds)] + ([prof, timer] if timer else [])
                out = json.loads(run(cmd, cwd=workdir).stdout)
                out["rate"] = out["samples"] / out["cpu_s"]
                out["signal_rate"] = out["signals"] / out["cpu_s"]
                if name == "pprof-rs":
                    out["hot_a_share"] = out["hot_a"] / (out["hot_a"] + out["hot_b"]) if out["hot_a"] + out["hot_b"] else float("nan")
                else:
                    out["hot_a_share"] = hot_a_share_cpuprof(cli, prof)
                runs.setdefault((key, threads), []).append(out)
    results["rate_load_after"] = load()

    # (d) lines a user writes, and a check that each example does what it claims.
    usage = {
        "pprof-rs": count_lines(PPROF_USAGE),
        "cpuprof": count_lines(CPUPROF_USAGE) + count_lines(CPUPROF_USAGE_SH),
    }
    checks = []
    go = shutil.which("go")
    for name, project in projects.items():
        env = target_env(workdir, name)
        run(["nice", "-n", "19", "cargo", "build", "--release", "--frozen", "--example", "usage"], cwd=project, env=env)
        out_dir = os.path.join(workdir, "usage-" + name)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        exe = os.path.join(env["CARGO_TARGET_DIR"], "release", "examples", "usage")
        run([exe], cwd=out_dir)
        if name == "cpuprof":
            for line in CPUPROF_USAGE_SH.splitlines():
                run([cli] + line.split()[1:], cwd=out_dir)
        pb = "profile.pb" if name == "pprof-rs" else "profile.pb.gz"
        ok = all(os.path.getsize(os.path.join(out_dir, f)) > 0 for f in ("flamegraph.svg", pb))
        if go and ok:
            top = run([go, "tool", "pprof", "-top", os.path.join(out_dir, pb)], check=False)
            ok = top.returncode == 0 and "hot_a" in top.stdout
        checks.append(f"{name}: flamegraph.svg and {pb} written" + (", go tool pprof -top names hot_a" if go else "")
                      + (": yes" if ok else ": NO"))
    results["usage_lines"] = usage
    results["usage_checks"] = checks
    results["runs"] = {f"{k[0]} | {k[1]}": v for k, v in runs.items()}
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    # The tables.
    deps = results["dependencies"]
    print(f"Measured {results['date']}, {results['cores']} cores, Linux {results['uname']}, "
          f"pprof {results['pprof_version']}, cpuprof at {run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT).stdout.strip()}.\n")
    print("| | pprof-rs | cpuprof | cpuprof / pprof-rs |")
    print("|---|---|---|---|")
    n_p, n_c = len(deps["pprof-rs"]["normal"]), len(deps["cpuprof"]["normal"])
    print(f"| crates depended on (`cargo tree -e normal`; the profiler crate counted, the scratch project not) | {n_p} | {n_c} | {n_c / n_p:.2f} |")
    b_p, b_c = len(deps["pprof-rs"]["normal,build"]), len(deps["cpuprof"]["normal,build"])
    print(f"| with build-dependencies (`-e normal,build`) | {b_p} | {b_c} | {b_c / b_p:.2f} |")
    if not args.skip_build_timing:
        c_p, c_c = builds["pprof-rs"][0]["compiled"], builds["cpuprof"][0]["compiled"]
        print(f"| crates compiled by a clean release build | {c_p} | {c_c} | {c_c / c_p:.2f} |")
        t_p = [b["seconds"] for b in builds["pprof-rs"]]
        t_c = [b["seconds"] for b in builds["cpuprof"]]
        ratios = [c / p for c, p in zip(t_c, t_p)]
        print(f"| clean release build, -j {args.jobs}, s (median of {args.build_rounds}; each: "
              f"{', '.join(f'{t:.0f}' for t in t_p)} / {', '.join(f'{t:.0f}' for t in t_c)}) "
              f"| {median(t_p):.0f} | {median(t_c):.0f} | {median(ratios):.2f} (per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}) |")
    print(f"| lines written for start, stop, flame graph, pprof protobuf | {usage['pprof-rs']} "
          f"| {usage['cpuprof']} (2 Rust + 2 `cpuprof` commands) | |")
    print()
    print(f"Samples per CPU-second at 1000 Hz (medians of {args.rounds} interleaved rounds; "
          f"{args.seconds:g} CPU-s per thread; ratio: median of per-round ratios to pprof-rs; "
          f"load average before/after: {results['rate_load_before']} / {results['rate_load_after']})\n")
    print("| threads | profiler | samples / CPU-s | signals / CPU-s | ratio to pprof-rs (samples) "
          "| hot_a share (75 % expected) | CPU-s profiled | CPU ms to start | range of samples / CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads in (1, args.threads):
        base = runs[("pprof-rs", threads)]
        for name, timer in configs:
            key = f"{name} {timer}" if timer else name
            rs = runs[(key, threads)]
            rates = [x["rate"] for x in rs]
            ratio = median([x["rate"] / b["rate"] for x, b in zip(rs, base)])
            label = "pprof-rs" if not timer else ("cpuprof (default timer)" if timer == "auto" else f"cpuprof ({timer} timer)")
            print(f"| {threads} | {label} | {median(rates):.0f} | {median([x['signal_rate'] for x in rs]):.0f} "
                  f"| {ratio:.2f} | {100 * median([x['hot_a_share'] for x in rs]):.1f} % "
                  f"| {median([x['cpu_s'] for x in rs]):.2f} | {1000 * median([x['start_cpu_s'] for x in rs]):.0f} "
                  f"| {min(rates):.0f}-{max(rates):.0f} |")
    print()
    names = sorted({x.get("thread_names") for x in runs[("pprof-rs", args.threads)]})
    print(f"pprof-rs labelled its {args.threads}-thread samples with {names} distinct thread name(s).")
    for check in checks:
        print(f"- {check}")
    if not args.skip_build_timing:
        print("\nLoad average before/after each clean build: " + "; ".join(
            f"{name} {i + 1}: {b['load_before']} / {b['load_after']}"
            for i in range(args.build_rounds) for name in projects for b in [builds[name][i]]))
    print(f"\nRaw results: {os.path.join(workdir, 'results.json')}")


if __name__ == "__main__":
    main()
