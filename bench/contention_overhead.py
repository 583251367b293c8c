#!/usr/bin/env python3
"""Contention profile overhead: what `LD_PRELOAD=libcpuprof.so` costs lock-heavy programs with
little contention, with no profile and with a contention profile (`CPUPROFILE_CONTENTION`) at
the default period and at a short one, in the same run.

Workloads:
  * tight: tests/c/contention_known.c `uncontended N`: one thread locking and unlocking one
    pthread mutex N times (glibc: ~15 ns a pair here), reported as ns per pair added;
  * tight beside a waiter: the same while another thread waits for another mutex all along,
    so every release looks for waiters of its lock (the holders' view);
  * sqlite3: /usr/bin/sqlite3 (Debian's, built thread-safe: each statement step takes the
    connection's mutex through pthread_mutex_lock) filling an in-memory table of --rows rows
    in single-row INSERTs and indexing it;
  * contended: `mutex 4 1 1000` (four threads taking one mutex in turn, each holding it 1 ms
    asleep): how much of the waited time the profile's walks add, as the program measures it.

Configurations run interleaved, once per round, in a fixed order, and ratios are taken within
a round (configuration / plain of the same round), so drift on a shared machine hits all of
them alike; the table shows medians over rounds of the ratio of CPU time (user + system, from
wait4), and its range; "plain (again)" is the noise.

    python3 bench/contention_overhead.py [--rounds 7] [--rows 200000] [--pairs 20000000]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(tmp):
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    program = os.path.join(tmp, "contention_known")
    subprocess.run(
        ["cc", "-O2", "-pthread", "-o", program, os.path.join(ROOT, "tests/c/contention_known.c")], check=True
    )
    return os.path.join(ROOT, "target/release/libcpuprof.so"), program


def cpu_of(argv, env, stdin=None):
    """(CPU seconds of the process, wall seconds, stdout) of one run."""
    before, start = os.times(), time.monotonic()
    p = subprocess.run(argv, env=env, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wall, after = time.monotonic() - start, os.times()
    if p.returncode != 0:
        sys.exit(f"{argv}: exit {p.returncode}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return cpu, wall, p.stdout.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--pairs", type=int, default=20000000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib, program = build(tmp)
        sql = (
            "CREATE TABLE t(a INTEGER, b TEXT);\nBEGIN;\n"
            + "".join(f"INSERT INTO t VALUES({i * 7919 % 1000003}, 'row{i}');\n" for i in range(args.rows))
            + "COMMIT;\nCREATE INDEX ia ON t(a);\nCREATE INDEX ib ON t(b);\nSELECT count(*) FROM t;\n"
        ).encode()
        base = dict(os.environ)
        configs = [
            ("plain", {}),
            ("plain (again)", {}),
            ("LD_PRELOAD alone", {"LD_PRELOAD": lib}),
            ("CPUPROFILE_CONTENTION", {"LD_PRELOAD": lib, "CPUPROFILE_CONTENTION": os.path.join(tmp, "c.txt")}),
            (
                "... _PERIOD=10000 (10 us)",
                {
                    "LD_PRELOAD": lib,
                    "CPUPROFILE_CONTENTION": os.path.join(tmp, "c10.txt"),
                    "CPUPROFILE_CONTENTION_PERIOD": "10000",
                },
            ),
        ]
        workloads = [
            ("tight (ns/pair)", [program, "uncontended", str(args.pairs)], None),
            ("tight beside a waiter (ns/pair)", [program, "uncontended", str(args.pairs), "waiter"], None),
            ("sqlite3", ["sqlite3", ":memory:"], sql),
            ("contended (waited s)", [program, "mutex", "4", "1", "1000"], None),
        ]
        results = {(w, c): [] for w, _, _ in workloads for c, _ in configs}
        for r in range(args.rounds):
            for wname, argv, stdin in workloads:
                for cname, extra in configs:
                    env = dict(base, **extra)
                    cpu, wall, out = cpu_of(argv, env, stdin)
                    values = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
                    if "ns_per_pair" in values:
                        measure = float(values["ns_per_pair"])
                    elif "waited_ns" in values:
                        measure = float(values["waited_ns"]) / 1e9
                    else:
                        measure = cpu
                    results[(wname, cname)].append(measure)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        print(f"| configuration | {' | '.join(w for w, _, _ in workloads)} |")
        print(f"|---|{'---|' * len(workloads)}")
        for cname, _ in configs:
            cells = []
            for wname, _, _ in workloads:
                ratios = [v / p for v, p in zip(results[(wname, cname)], results[(wname, "plain")])]
                if wname.startswith("tight"):
                    added = [v - p for v, p in zip(results[(wname, cname)], results[(wname, "plain")])]
                    cells.append(f"{statistics.median(added):+.1f} ns ({statistics.median(ratios):.3f})")
                else:
                    cells.append(f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
            print(f"| {cname} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
