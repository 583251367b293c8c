#!/usr/bin/env python3
"""Profiler overhead, cpuprof beside gperftools' libprofiler.so in the same run.

For fixed work (bench/overhead.c: a frame-pointer build, a build without frame pointers, and
the frame-pointer build on 4 threads) it measures, at 100 Hz and 1000 Hz requested:
  * CPU overhead: CPU time (user + system, from wait4) over the unprofiled run's, minus one;
  * samples per CPU-second actually taken;
  * cost per sample: the extra CPU time divided by the samples in the profile;
  * resident memory added (peak RSS over the unprofiled run's) and profile bytes per sample.
Every configuration runs once per round, interleaved, and ratios are taken within a round, so
drift on a shared machine hits all of them alike; tables show medians over rounds. Then it
times ProfilerStop with 2^20 distinct stacks in the profile (bench/distinct_stacks.c).

    python3 bench/overhead.py [--rounds 5] [--cpu-seconds 1.5] [--stack-bits 20]
                              [--configs "gperftools,cpuprof epochs of 1 s"] [--skip-overhead]

Needs cc and libgoogle-perftools-dev (for /usr/lib/x86_64-linux-gnu/libprofiler.so)."""
import argparse
import os
import shutil
import statistics
import struct
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPERFTOOLS = "/usr/lib/x86_64-linux-gnu/libprofiler.so"
CPUPROF = os.path.join(ROOT, "target/release/libcpuprof.so")

# name -> (library, environment). The unprofiled program runs first in every round as the
# baseline; running it again as a "configuration" shows the noise of a ratio on this machine.
CONFIGS = {
    "no profiler (again)": (None, {}),
    "gperftools": (GPERFTOOLS, {}),
    "cpuprof default (thread+dwarf)": (CPUPROF, {}),
    "cpuprof thread+fp": (CPUPROF, {"CPUPROFILE_UNWINDER": "fp"}),
    "cpuprof perf+dwarf": (CPUPROF, {"CPUPROFILE_TIMER": "perf"}),
    "cpuprof itimer+dwarf": (CPUPROF, {"CPUPROFILE_TIMER": "itimer"}),
    # Epoch mode (CPUPROFILE_DB): the same sampling, the profile rolled over into a database
    # every epoch. 0.1-s epochs roll over ~15 times in a 1.5-s run, to show a roll-over's cost.
    "cpuprof epochs of 1 s": (CPUPROF, {"CPUPROFILE_DB": "", "CPUPROFILE_EPOCH": "1"}),
    "cpuprof epochs of 0.1 s": (CPUPROF, {"CPUPROFILE_DB": "", "CPUPROFILE_EPOCH": "0.1"}),
}


def build(workdir):
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    exes = {}
    for name, flags in [("fp", ["-fno-omit-frame-pointer"]), ("nofp", ["-fomit-frame-pointer"])]:
        exes[name] = os.path.join(workdir, "overhead_" + name)
        subprocess.run(["cc", "-O2", "-g", *flags, os.path.join(ROOT, "bench/overhead.c"), "-o", exes[name],
                        "-lpthread"], check=True)
    exes["floor"] = os.path.join(workdir, "signal_floor")
    subprocess.run(["cc", "-O2", os.path.join(ROOT, "bench/signal_floor.c"), "-o", exes["floor"]], check=True)
    exes["stacks"] = os.path.join(workdir, "distinct_stacks")
    subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", os.path.join(ROOT, "bench/distinct_stacks.c"),
                    "-o", exes["stacks"], "-ldl"], check=True)
    return exes


def run(argv, env):
    """Runs argv to completion; returns (cpu seconds, stdout as a dict of "key value" lines)."""
    with subprocess.Popen(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as proc:
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited with {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, dict(line.split(None, 1) for line in out.splitlines())


def profile_samples(path):
    """Total sample count of a legacy profile with native 8-byte slots."""
    with open(path, "rb") as f:
        data = f.read()
    words = struct.unpack_from(f"<{len(data) // 8}Q", data)
    i, total = 5, 0
    while i + 1 < len(words):
        count, depth = words[i], words[i + 1]
        if count == 0 and depth == 1:
            break
        total += count
        i += 2 + depth
    return total


def measure(exe, args, config, hz, workdir):
    library, extra = CONFIGS[config] if config else (None, {})
    env = {}
    if library is not None:
        profile = os.path.join(workdir, "bench.prof")
        env = dict(extra, LD_PRELOAD=library, CPUPROFILE=profile, CPUPROFILE_FREQUENCY=str(hz))
        if "CPUPROFILE_DB" in extra:
            profile = os.path.join(workdir, "bench.db")
            shutil.rmtree(profile, ignore_errors=True)
            env["CPUPROFILE_DB"] = profile
    cpu, out = run([exe, *args], env)
    rss = int(out["peak_rss_kib"])
    if library is None:
        return {"cpu": cpu, "rss": rss, "samples": 1, "bytes": 0}
    files = [profile]
    if os.path.isdir(profile):
        files = [os.path.join(d, f) for d, _, names in os.walk(profile) for f in names if f.endswith(".prof")]
    return {"cpu": cpu, "rss": rss, "samples": sum(map(profile_samples, files)),
            "bytes": sum(map(os.path.getsize, files))}


def calibrate(exe, cpu_seconds):
    units = 200
    cpu, _ = run([exe, str(units)], {})
    return max(1, int(units * cpu_seconds / max(cpu, 1e-3)))


def overhead_tables(exes, rounds, cpu_seconds, workdir):
    units = calibrate(exes["fp"], cpu_seconds)
    workloads = {
        "frame pointers": (exes["fp"], [str(units)]),
        "no frame pointers": (exes["nofp"], [str(units)]),
        "4 threads": (exes["fp"], [str(2 * units), "4"]),
    }
    rows = []
    for workload, (exe, args) in workloads.items():
        runs = {c: [] for c in CONFIGS}
        for _ in range(rounds):
            base = measure(exe, args, None, 0, workdir)
            for config in CONFIGS:
                got = {hz: measure(exe, args, config, hz, workdir) for hz in (100, 1000)}
                runs[config].append((base, got[100], got[1000]))
        for config, per_round in runs.items():
            med = lambda f: statistics.median(f(b, lo, hi) for b, lo, hi in per_round)
            row = {
                "rate100": med(lambda b, lo, hi: lo["samples"] / lo["cpu"]),
                "rate1000": med(lambda b, lo, hi: hi["samples"] / hi["cpu"]),
                "over100": med(lambda b, lo, hi: lo["cpu"] / b["cpu"] - 1),
                "over1000": med(lambda b, lo, hi: hi["cpu"] / b["cpu"] - 1),
                "rss": med(lambda b, lo, hi: hi["rss"] - b["rss"]),
                "bytes": med(lambda b, lo, hi: hi["bytes"] / max(hi["samples"], 1)),
            }
            # The cost of one more sample: the slope between the two frequencies, which
            # leaves out what does not grow with samples (loading the library, start, stop).
            if CONFIGS[config][0]:
                row["per_sample"] = med(lambda b, lo, hi: (hi["cpu"] - lo["cpu"]) / max(hi["samples"] - lo["samples"], 1) * 1e9)
            rows.append((workload, config, row))
        print(f"... {workload} done", flush=True)
    print(f"\nCPU overhead, fixed work of ~{cpu_seconds} CPU-s unprofiled (median of {rounds} rounds, ratios "
          "within a round)\n")
    print("| workload | profiler | samples per CPU-s at 100 Hz | overhead at 100 Hz | samples per CPU-s at 1000 Hz "
          "| overhead at 1000 Hz | ns per extra sample | RSS added (KiB) | bytes per sample at 1000 Hz |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, config, r in rows:
        if "per_sample" not in r:
            print(f"| {workload} | {config} | | {100 * r['over100']:+.2f} % | | {100 * r['over1000']:+.2f} % | "
                  f"| {r['rss']:.0f} | |")
            continue
        print(f"| {workload} | {config} | {r['rate100']:.0f} | {100 * r['over100']:+.2f} % | {r['rate1000']:.0f} "
              f"| {100 * r['over1000']:+.2f} % | {r['per_sample']:.0f} | {r['rss']:.0f} | {r['bytes']:.1f} |")


def floor_table(exes, rounds, cpu_seconds):
    """The platform's cost per timer signal with an empty handler (no profiler)."""
    units, modes = 200, ["none", "posix", "perf"]
    cpu, _ = run([exes["floor"], "none", "1000", str(units)], {})
    units = max(1, int(units * cpu_seconds / max(cpu, 1e-3)))
    print(f"\nThe platform's floor: an empty handler on each timer, {cpu_seconds} CPU-s of work "
          f"(median of {rounds} rounds)\n")
    print("| timer | requested Hz | signals per CPU-s | CPU overhead | ns per signal |")
    print("|---|---|---|---|---|")
    for hz in (100, 1000):
        results = {m: [] for m in modes}
        for _ in range(rounds):
            for mode in modes:
                c, out = run([exes["floor"], mode, str(hz), str(units)], {})
                results[mode].append((c, int(out["signals"])))
        for mode in modes[1:]:
            ratios = [r[0] / b[0] - 1 for r, b in zip(results[mode], results["none"])]
            per = [(r[0] - b[0]) / max(r[1], 1) * 1e9 for r, b in zip(results[mode], results["none"])]
            rate = statistics.median(r[1] / r[0] for r in results[mode])
            print(f"| {mode} | {hz} | {rate:.0f} | {100 * statistics.median(ratios):+.2f} % "
                  f"| {statistics.median(per):.0f} |")


def stop_table(exes, rounds, bits, workdir):
    env = {"CPUPROFILE_FREQUENCY": "1"}
    print(f"\nStopping with 2^{bits} = {1 << bits} distinct stacks of {bits + 3} frames "
          f"(median of {rounds} runs)\n")
    print("| profiler | ProfilerStop ms | 2^bits signals ms | samples in file | records in file |")
    print("|---|---|---|---|---|")
    for name, library, extra in [("gperftools", GPERFTOOLS, {}),
                                 ("cpuprof (itimer, dwarf)", CPUPROF, {"CPUPROFILE_TIMER": "itimer"})]:
        stops, sampling, samples, records = [], [], 0, 0
        for _ in range(rounds):
            profile = os.path.join(workdir, "stacks.prof")
            _, values = run([exes["stacks"], library, profile, str(bits)], dict(env, **extra))
            stops.append(float(values["stop_ms"]))
            sampling.append(float(values["sampling_ms"]))
            samples, records = profile_samples(profile), count_records(profile)
        print(f"| {name} | {statistics.median(stops):.1f} | {statistics.median(sampling):.0f} | {samples} "
              f"| {records} |")


def count_records(path):
    with open(path, "rb") as f:
        data = f.read()
    words = struct.unpack_from(f"<{len(data) // 8}Q", data)
    i, n = 5, 0
    while i + 1 < len(words) and not (words[i] == 0 and words[i + 1] == 1):
        n += 1
        i += 2 + words[i + 1]
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu-seconds", type=float, default=1.5)
    parser.add_argument("--stack-bits", type=int, default=20)
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--configs", help="comma-separated names of CONFIGS to run (default: all)")
    args = parser.parse_args()
    if args.configs:
        wanted = args.configs.split(",")
        for name in list(CONFIGS):
            if name not in wanted and name != "no profiler (again)":
                del CONFIGS[name]
    started = time.time()
    with tempfile.TemporaryDirectory() as workdir:
        exes = build(workdir)
        # With --configs, only the overhead table of those configurations.
        if not args.skip_overhead:
            if not args.configs:
                floor_table(exes, args.rounds, args.cpu_seconds)
            overhead_tables(exes, args.rounds, args.cpu_seconds, workdir)
        if not args.configs:
            stop_table(exes, 3, args.stack_bits, workdir)
    print(f"\n({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
