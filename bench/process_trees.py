#!/usr/bin/env python3
"""What profiling a process tree costs: process starts and forks, cpuprof beside gperftools.

Each profiled process pays for its profile: at start (the library's constructor: the file,
the unwinder's snapshot of the loaded objects, the timer) and at its end (the trailer, the
maps, the build-ids); a child forked from a profiled process now gets a profile of its own
too. Three workloads, each run once per round for every configuration, interleaved:

  * exec:   bench/process_trees.c spawns /bin/true N times (fork + exec, waited for);
  * fork:   it forks N children that exit() at once (prefork-style, no exec);
  * prefork: it forks 2 workers that burn a fixed amount of CPU each (the work itself).

Reported: the wall time and the CPU time (user + system of the whole tree, from wait4) of
each workload, as ratios to the unprofiled run of the same round (medians over rounds), and
the CPU milliseconds each profiled process adds.

    python3 bench/process_trees.py [--rounds 5] [--processes 200]

Needs cc and libgoogle-perftools-dev (/usr/lib/x86_64-linux-gnu/libprofiler.so)."""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPERFTOOLS = "/usr/lib/x86_64-linux-gnu/libprofiler.so"
CPUPROF = os.path.join(ROOT, "target/release/libcpuprof.so")

CONFIGS = {
    "no profiler (again)": (None, {}),
    "gperftools": (GPERFTOOLS, {}),
    "cpuprof": (CPUPROF, {}),
    "cpuprof, forks not followed": (CPUPROF, {"CPUPROFILE_FOLLOW_FORK": "0"}),
}


def run(exe, args, library, env, workdir):
    """Wall seconds and CPU seconds of the whole tree (it waits for every child)."""
    e = dict(os.environ)
    e.update(env)
    if library:
        out = os.path.join(workdir, "p.prof")
        e.update({"LD_PRELOAD": library, "CPUPROFILE": out})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([exe, *args], env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for name in os.listdir(workdir):
        if name.startswith("p.prof"):
            os.remove(os.path.join(workdir, name))
    return wall, cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=200)
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    workdir = tempfile.mkdtemp(prefix="cpuprof-trees-")
    exe = os.path.join(workdir, "process_trees")
    subprocess.run(["cc", "-O2", "-g", os.path.join(ROOT, "bench/process_trees.c"), "-o", exe], check=True)
    n = str(args.processes)
    workloads = {"exec": ["exec", n], "fork": ["fork", n], "prefork": ["prefork", "1.0"]}
    ratios = {(w, c): ([], []) for w in workloads for c in CONFIGS}
    added = {(w, c): [] for w in workloads for c in CONFIGS}
    for _ in range(args.rounds):
        for w, wargs in workloads.items():
            base_wall, base_cpu = run(exe, wargs, None, {}, workdir)
            for c, (library, env) in CONFIGS.items():
                wall, cpu = run(exe, wargs, library, env, workdir)
                ratios[(w, c)][0].append(wall / base_wall)
                ratios[(w, c)][1].append(cpu / base_cpu)
                processes = args.processes + 1 if w != "prefork" else 3
                added[(w, c)].append((cpu - base_cpu) / processes * 1000)
    print(f"{args.rounds} rounds, {args.processes} processes per exec/fork run; medians, ratios to the unprofiled run")
    print()
    print("| workload | configuration | wall ratio | CPU ratio | CPU ms added per process |")
    print("|---|---|---|---|---|")
    for w in workloads:
        for c in CONFIGS:
            wall, cpu = ratios[(w, c)]
            print(f"| {w} | {c} | {statistics.median(wall):.2f} | {statistics.median(cpu):.2f} | "
                  f"{statistics.median(added[(w, c)]):.2f} |")
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
