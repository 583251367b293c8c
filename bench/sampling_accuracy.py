#!/usr/bin/env python3
"""Sampling accuracy: samples per CPU-second at several requested frequencies (1 and 4
threads), per-thread shares of a 1:2:3:4 workload, kernel time charged to the system call (the
share of read(2) against the system-time share), a strictly periodic loop (aliasing with the
kernel tick), and the same work split over 16, 256 and 1,000 short threads, for gperftools' libprofiler.so and each cpuprof timer, interleaved in the same
run; medians over rounds.

    python3 bench/sampling_accuracy.py [--rounds 3]

Needs cc and libgoogle-perftools-dev."""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPERFTOOLS = "/usr/lib/x86_64-linux-gnu/libprofiler.so"
CONFIGS = {
    "gperftools setitimer": (GPERFTOOLS, {}),
    "gperftools per-thread": (GPERFTOOLS, {"CPUPROFILE_PER_THREAD_TIMERS": "1"}),
    "cpuprof itimer": (None, {"CPUPROFILE_TIMER": "itimer"}),
    "cpuprof default (thread)": (None, {}),
    "cpuprof perf": (None, {"CPUPROFILE_TIMER": "perf"}),
}


def build(workdir):
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload", "-p", "cpuprof-cli"], cwd=ROOT,
                   check=True)
    exes = {}
    for name in ["hot", "threads", "kernel_time", "short_threads"]:
        exes[name] = os.path.join(workdir, name)
        subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", os.path.join(ROOT, f"tests/c/{name}.c"), "-o",
                        exes[name], "-lpthread"], check=True)
    return exes


def run(exe, args, library, env, hz, profile, keys=("cpu",)):
    """Runs the workload profiled; returns the value it printed for `keys[0]` (or a tuple)."""
    full_env = dict(os.environ, LD_PRELOAD=library, CPUPROFILE=profile, CPUPROFILE_FREQUENCY=str(hz), **env)
    out = subprocess.run([exe] + args, capture_output=True, text=True, check=True, env=full_env).stdout
    values = tuple(float(re.search(rf"^{key} (\S+)", out, re.M).group(1)) for key in keys)
    return values if len(keys) > 1 else values[0]


def flat(profile, names):
    """The largest flat share among `names` in cpuprof top."""
    cli = os.path.join(ROOT, "target/release/cpuprof")
    out = subprocess.run([cli, "top", "-n", "1000", profile], capture_output=True, text=True).stdout
    best = 0.0
    for line in out.splitlines()[2:]:
        cols = line.split()
        if len(cols) >= 6 and cols[5] in names:
            best = max(best, float(cols[1].rstrip("%")))
    return best


def top(profile):
    """cpuprof top --cum as {function: (samples, cum%)}."""
    cli = os.path.join(ROOT, "target/release/cpuprof")
    out = subprocess.run([cli, "top", "--cum", "-n", "1000", profile], capture_output=True, text=True).stdout
    total = re.search(r"Total: (\d+) samples", out)
    rows = {}
    for line in out.splitlines()[2:]:
        cols = line.split()
        if len(cols) >= 6:
            rows[cols[5]] = float(cols[4].rstrip("%"))
    return (int(total.group(1)) if total else 0), rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        exes = build(workdir)
        cpuprof = os.path.join(ROOT, "target/release/libcpuprof.so")
        profile = os.path.join(workdir, "bench.prof")
        rates = {(name, threads, hz): [] for name in CONFIGS for threads in (1, 4) for hz in (100, 1000, 4000)}
        shares = {name: {k: [] for k in range(1, 5)} for name in CONFIGS}
        kernel = {(name, hz): [] for name in CONFIGS for hz in (100, 1000, 4000)}
        short = {(name, n): [] for name in CONFIGS for n in (16, 256, 1000)}
        periodic = {name: [] for name in CONFIGS}
        for _ in range(args.rounds):
            for name, (library, env) in CONFIGS.items():
                library = library or cpuprof
                for hz in (100, 1000, 4000):
                    for threads, exe, exe_args in ((1, exes["hot"], ["2"]), (4, exes["threads"], ["4", "0.25"])):
                        cpu = run(exe, exe_args, library, env, hz, profile)
                        rates[(name, threads, hz)].append(top(profile)[0] / cpu)
                run(exes["threads"], ["4", "0.5"], library, env, 1000, profile)
                _, rows = top(profile)
                for k in range(1, 5):
                    shares[name][k].append(rows.get(f"burn_{k}", 0.0))
                for hz in (100, 1000, 4000):
                    cpu, sys = run(exes["kernel_time"], ["3"], library, env, hz, profile, keys=("cpu", "sys"))
                    read = flat(profile, {"read", "__read", "__libc_read", "__GI___libc_read"})
                    kernel[(name, hz)].append(read - 100 * sys / cpu)
                run(exes["hot"], ["2"], library, dict(env, CPUPROF_PERIODIC="1"), 250, profile)
                periodic[name].append(top(profile)[1].get("hot_a", 0.0))
                for n in (16, 256, 1000):
                    cpu = run(exes["short_threads"], [str(n), "4"], library, env, 100, profile)
                    short[(name, n)].append(top(profile)[0] / 100 / cpu)
        print(f"Samples per CPU-second (median of {args.rounds} rounds; ideal = requested)\n")
        print("| timer | 1 thread 100 Hz | 1 thread 1000 Hz | 1 thread 4000 Hz | 4 threads 100 Hz | 4 threads 1000 Hz "
              "| 4 threads 4000 Hz |")
        print("|---|---|---|---|---|---|---|")
        for name in CONFIGS:
            cells = [f"{statistics.median(rates[(name, t, hz)]):.0f}" for t in (1, 4) for hz in (100, 1000, 4000)]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print(f"\nShares of 4 threads doing 1:2:3:4 units of work at 1000 Hz (ideal 10/20/30/40 %)\n")
        print("| timer | thread 1 | thread 2 | thread 3 | thread 4 | worst error (points) |")
        print("|---|---|---|---|---|---|")
        for name in CONFIGS:
            med = [statistics.median(shares[name][k]) for k in range(1, 5)]
            worst = max(abs(m - 10 * k) for k, m in zip(range(1, 5), med))
            print(f"| {name} | " + " | ".join(f"{m:.1f}" for m in med) + f" | {worst:.1f} |")
        print("\nKernel time: flat share of read(2) minus the system-time share (getrusage), in points, of a"
              " workload with ~35 % system time (ideal 0)\n")
        print("| timer | 100 Hz | 1000 Hz | 4000 Hz |")
        print("|---|---|---|---|")
        for name in CONFIGS:
            print(f"| {name} | " + " | ".join(f"{statistics.median(kernel[(name, hz)]):+.1f}"
                                                for hz in (100, 1000, 4000)) + " |")
        print("\nA strictly periodic loop (fixed 3:1 rounds of ~0.8 ms), 250 Hz: hot_a's share (truth 75 %),"
              " median and range over rounds. Timers driven by the kernel tick sample it at the same points"
              " tick after tick\n")
        print("| timer | median | lowest | highest |")
        print("|---|---|---|---|")
        for name in CONFIGS:
            v = periodic[name]
            print(f"| {name} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} |")
        print("\nShort threads: samples x period / CPU time for 4 CPU-s split over N threads, 100 Hz (ideal 1.00)\n")
        print("| timer | 16 threads | 256 threads | 1,000 threads |")
        print("|---|---|---|---|")
        for name in CONFIGS:
            print(f"| {name} | " + " | ".join(f"{statistics.median(short[(name, n)]):.2f}" for n in (16, 256, 1000))
                  + " |")


if __name__ == "__main__":
    main()
