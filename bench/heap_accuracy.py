#!/usr/bin/env python3
"""Heap profile accuracy: the bytes in use and allocated per function of a program that
counts them itself (tests/c/heap_known.c: big_a allocates three bytes for every one of
big_b's, 16 B - 1 MiB, and half of big_b's blocks are freed), against what cpuprof's sampled
heap profile says, and what gperftools' heap profiler (tcmalloc, which records every
allocation) says, read by google-pprof and by `cpuprof top`.

cpuprof runs --runs times (a different random countdown each run: its seed comes from
addresses, which ASLR moves) at each sampling period of --periods; gperftools runs once (its
profile is exact up to the MiB rounding of the readers, and it takes ~40 s here). Each table
cell is the relative error of a reader's cumulative bytes for the function against the
program's own count; for cpuprof the mean and the largest |error| over the runs, then the
mean signed error and its standard deviation (bias and spread).

    python3 bench/heap_accuracy.py [--runs 10] [--rounds 100] [--periods 524288,65536]
                                   [--skip-gperftools]

Needs cc, google-pprof and libgoogle-perftools4 (/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4)."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUPROF_LIB = os.path.join(ROOT, "target/release/libcpuprof.so")
CPUPROF_CLI = os.path.join(ROOT, "target/release/cpuprof")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
ONE_FILE = {"HEAP_PROFILE_INUSE_INTERVAL": "0", "HEAP_PROFILE_ALLOCATION_INTERVAL": "0"}
CLEARED_PREFIXES = ("LD_PRELOAD", "CPUPROFILE", "CPUPROF_", "HEAPPROFILE", "HEAP_PROFILE_", "HEAPCHECK", "TCMALLOC_")
# (label, function, pprof's value, index into the truth line: alloc a, alloc b, inuse a, inuse b)
QUANTITIES = [("big_a in use", "big_a", "inuse_space", 2), ("big_b in use", "big_b", "inuse_space", 3),
              ("big_a allocated", "big_a", "alloc_space", 0), ("big_b allocated", "big_b", "alloc_space", 1)]
UNITS = {"B": 1, "kB": 1 << 10, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def build():
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload", "-p", "cpuprof-cli"], cwd=ROOT,
                   check=True)


def compile_program(workdir):
    exe = os.path.join(workdir, "heap_known")
    subprocess.run(["cc", "-O2", "-fno-omit-frame-pointer", os.path.join(ROOT, "tests/c/heap_known.c"), "-o", exe],
                   check=True)
    return exe


def profiled(exe, rounds, env, prefix):
    """Runs the program under a heap profiler: (truth, profile path, seconds)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    started = time.monotonic()
    out = subprocess.run([exe, str(rounds)], env=dict(base, HEAPPROFILE=prefix, **ONE_FILE, **env),
                         capture_output=True, text=True)
    seconds = time.monotonic() - started
    if out.returncode != 0:
        sys.exit(f"{exe} {rounds} under {env}: exit status {out.returncode}\n{out.stderr}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("alloc "))
    truth = [float(w.split("=")[1]) for w in line.split() if "=" in w]
    profile = prefix + ".0001.heap"
    if not os.path.exists(profile):
        sys.exit(f"no {profile}: {out.stderr}")
    return truth, profile, seconds


def value_in_bytes(text):
    """`17529.3` (google-pprof: MiB), `13.53GB`, `3736250.48kB`, `0` -> bytes."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not m:
        return None
    number, unit = float(m.group(1)), m.group(2)
    return number * (UNITS[unit] if unit else 1)


def cumulative(table, function, plain_unit):
    """The cum column (the fourth) of `function`'s line in a pprof-style text table."""
    for line in table.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1].endswith("%") and cols[5] == function:
            v = value_in_bytes(cols[3])
            if v is not None:
                return v * (plain_unit if re.fullmatch(r"[0-9.]+", cols[3]) else 1)
    return 0.0


def read_google_pprof(exe, profile, value, function):
    out = subprocess.run(["google-pprof", "--text", "--cum", f"--{value}", exe, profile], capture_output=True,
                         text=True, check=True)
    # google-pprof prints MB (2^20 bytes) without a unit.
    return cumulative(out.stdout, function, 1 << 20)


def read_cpuprof(exe, profile, value, function):
    out = subprocess.run([CPUPROF_CLI, "top", "--cum", "-n", "100", "--sample-index", value, "--binary", exe,
                          profile], capture_output=True, text=True, check=True)
    return cumulative(out.stdout, function, 1)


READERS = {"google-pprof": read_google_pprof, "cpuprof top": read_cpuprof}


def errors(exe, profile, truth):
    """reader -> [relative error of each quantity]."""
    got = {}
    for reader, read in READERS.items():
        row = []
        for _, function, value, index in QUANTITIES:
            measured = read(exe, profile, value, function)
            row.append(measured / truth[index] - 1)
        got[reader] = row
    return got


def pct(x):
    return f"{100 * x:+.2f} %"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="cpuprof runs per sampling period")
    parser.add_argument("--rounds", type=int, default=100, help="heap_known.c's argument")
    parser.add_argument("--periods", default="524288,65536", help="cpuprof's HEAP_PROFILE_SAMPLE values, bytes")
    parser.add_argument("--skip-gperftools", action="store_true")
    args = parser.parse_args()
    started = time.time()
    build()
    periods = [int(p) for p in args.periods.split(",")]
    results = []  # (profiler label, reader, runs, [[errors per quantity] per run], seconds)
    with tempfile.TemporaryDirectory(prefix="heap_accuracy.") as workdir:
        exe = compile_program(workdir)
        truth = None
        plain = []
        for _ in range(3):
            t0 = time.monotonic()
            subprocess.run([exe, str(args.rounds)], capture_output=True, check=True,
                           env={k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)})
            plain.append(time.monotonic() - t0)
        for period in periods:
            per_reader = {r: [] for r in READERS}
            seconds = []
            for i in range(args.runs):
                t, profile, s = profiled(exe, args.rounds, {"LD_PRELOAD": CPUPROF_LIB,
                                                            "HEAP_PROFILE_SAMPLE": str(period)},
                                         os.path.join(workdir, f"cpuprof_{period}_{i}"))
                truth = truth or t
                assert t == truth, (t, truth)
                seconds.append(s)
                for reader, row in errors(exe, profile, truth).items():
                    per_reader[reader].append(row)
            label = f"cpuprof, one sample per {period // 1024} KiB" + (" (default)" if period == 524288 else "")
            for reader, rows in per_reader.items():
                results.append((label, reader, rows, statistics.median(seconds)))
            print(f"... {label} done ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        if not args.skip_gperftools:
            t, profile, s = profiled(exe, args.rounds, {"LD_PRELOAD": TCMALLOC}, os.path.join(workdir, "gperftools"))
            truth = truth or t
            assert t == truth, (t, truth)
            for reader, row in errors(exe, profile, truth).items():
                results.append(("gperftools 2.10 heap profiler (every allocation)", reader, [row], s))
            print(f"... gperftools done ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)

    names = [q[0] for q in QUANTITIES]
    print(f"heap_known {args.rounds}: truth (bytes the program counted): " +
          ", ".join(f"{q[0]} {truth[q[3]]:.0f} ({truth[q[3]] / (1 << 20):.1f} MiB)" for q in QUANTITIES))
    print(f"\nWithout a profiler the program runs in {statistics.median(plain):.2f} s (median of 3).")
    print(f"\nRelative error of each reader's cumulative bytes per function; cpuprof: mean |error| / largest "
          f"|error| over {args.runs} runs, gperftools: its one run's error\n")
    print("| profiler | reader | runs | seconds per run | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for label, reader, rows, seconds in results:
        if len(rows) == 1:
            cells = [pct(e) for e in rows[0]]
        else:
            cells = [f"{100 * statistics.mean(abs(r[k]) for r in rows):.2f} % / "
                     f"{100 * max(abs(r[k]) for r in rows):.2f} %" for k in range(len(names))]
        print(f"| {label} | {reader} | {len(rows)} | {seconds:.1f} | " + " | ".join(cells) + " |")
    print(f"\ncpuprof's bias and spread: mean signed error ± standard deviation over the runs\n")
    print("| profiler | reader | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for label, reader, rows, _ in results:
        if len(rows) < 2:
            continue
        cells = [f"{pct(statistics.mean(r[k] for r in rows))} ± {100 * statistics.stdev(r[k] for r in rows):.2f}"
                 for k in range(len(names))]
        print(f"| {label} | {reader} | " + " | ".join(cells) + " |")
    print(f"\n({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
