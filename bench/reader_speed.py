#!/usr/bin/env python3
"""Reading speed: `cpuprof top` beside `go tool pprof -top` and `google-pprof --text` on the
same profile of 1,000,000 records: wall time and peak resident memory of each, in one run.

The profile is built from a real one (the known-answer workload, profiled by cpuprof): its
maps section, and call chains made of its real return addresses and leaf PCs in random
combinations, so every reader symbolises real code and must sum a million distinct records.

Targets (issue 14): `cpuprof top` at least 10x faster than `go tool pprof -top`, and its peak
RSS at most twice the file's size. Times are ratios within one run: on a shared machine the
absolute seconds say little.

    python3 bench/reader_speed.py [--records 1000000] [--runs 3] [--timeout 900]"""
import argparse
import os
import random
import statistics
import struct
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(workdir):
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload", "-p", "cpuprof-cli"], cwd=ROOT,
                   check=True)
    exe = os.path.join(workdir, "hot")
    subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", os.path.join(ROOT, "tests/c/hot.c"), "-o", exe],
                   check=True)
    seed = os.path.join(workdir, "seed.prof")
    subprocess.run([exe, "1"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=dict(os.environ, LD_PRELOAD=os.path.join(ROOT, "target/release/libcpuprof.so"),
                            CPUPROFILE=seed, CPUPROFILE_FREQUENCY="4000"))
    return exe, os.path.join(ROOT, "target/release/cpuprof"), seed


def synthesize(seed, out, records):
    data = open(seed, "rb").read()
    words = struct.unpack_from(f"<{len(data) // 8}Q", data)
    i, stacks = 5, []
    while not (words[i] == 0 and words[i + 1] == 1):
        depth = words[i + 1]
        stacks.append(words[i + 2:i + 2 + depth])
        i += 2 + depth
    maps = data[8 * (i + 3):]
    leaves = sorted({s[0] for s in stacks})
    callers = sorted({pc for s in stacks for pc in s[1:]})
    rng = random.Random(1)
    body = bytearray(struct.pack("<5Q", 0, 3, 0, 250, 0))
    for _ in range(records):
        depth = rng.randint(4, 16)
        pcs = [rng.choice(leaves)] + [rng.choice(callers) for _ in range(depth - 1)]
        body += struct.pack(f"<{depth + 2}Q", rng.randint(1, 5), depth, *pcs)
    body += struct.pack("<3Q", 0, 1, 0) + maps
    open(out, "wb").write(body)
    return len(body)


def timed(argv, timeout):
    """(wall seconds, peak RSS in bytes) of one run, or (None, None) if it timed out."""
    started = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=dict(os.environ, HOME=tempfile.gettempdir()))
    # wait4 gives this child's own peak RSS (getrusage(RUSAGE_CHILDREN) keeps the maximum
    # over all children); polled so that a reader past the timeout can be killed.
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout:
            child.kill()
            os.wait4(child.pid, 0)
            return None, None
        time.sleep(0.01)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv}: exit status {os.waitstatus_to_exitcode(status)}")
    return time.monotonic() - started, usage.ru_maxrss * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        exe, cli, seed = build(workdir)
        profile = os.path.join(workdir, "big.prof")
        size = synthesize(seed, profile, args.records)
        readers = {
            "cpuprof top": [cli, "top", profile],
            "go tool pprof -top": ["go", "tool", "pprof", "-top", exe, profile],
            "google-pprof --text": ["google-pprof", "--text", exe, profile],
        }
        times = {name: [] for name in readers}
        peaks = {name: [] for name in readers}
        for _ in range(args.runs):
            for name, argv in readers.items():
                if times[name] and times[name][-1] is None:
                    continue
                seconds, peak = timed(argv, args.timeout)
                times[name].append(seconds)
                peaks[name].append(peak)
        print(f"{args.records} records, {size / 1e6:.0f} MB; median wall seconds of {args.runs} runs, "
              f"largest peak RSS\n")
        print("| reader | seconds | relative to cpuprof | peak RSS | RSS / file size |")
        print("|---|---|---|---|---|")
        ours = statistics.median(times["cpuprof top"])
        for name, t in times.items():
            if None in t:
                print(f"| {name} | > {args.timeout} (timed out) | > {args.timeout / ours:.0f}x | - | - |")
            else:
                m, peak = statistics.median(t), max(peaks[name])
                print(f"| {name} | {m:.2f} | {m / ours:.1f}x | {peak / 1e6:.0f} MB | {peak / size:.2f} |")
        go = times["go tool pprof -top"]
        speedup = args.timeout / ours if None in go else statistics.median(go) / ours
        rss = max(peaks["cpuprof top"]) / size
        print(f"\ncpuprof top: {'>' if None in go else ''}{speedup:.1f}x faster than go tool pprof -top "
              f"(target >= 10x: {'met' if speedup >= 10 else 'NOT met'}); peak RSS {rss:.2f}x the file "
              f"(target <= 2x: {'met' if rss <= 2 else 'NOT met'})")


if __name__ == "__main__":
    main()
