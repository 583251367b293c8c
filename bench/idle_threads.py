#!/usr/bin/env python3
"""What profiling costs a process whose threads all sleep: bench/idle_threads.c (THREADS
threads in pthread_cond_wait, main in usleep) under cpuprof's CPU mode, its wall-clock mode
and gperftools 2.10, at 100 Hz. All the CPU such a process uses is the profiler's, so each
thread's CPU time is read from /proc/PID/task/TID/stat (utime + stime, in clock ticks) at the
start and at the end of a steady-state window, and reported as a percentage of one core, per
profiler thread (by its name) and for the whole process. schedstat's run time (ns) is shown
beside it where the kernel has it, as the finer of the two clocks.

    python3 bench/idle_threads.py [--threads 1000] [--seconds 20] [--settle 2]
                                  [--configs "cpuprof cpu,gperftools"] [--cpuprof LIB]

--cpuprof names another build of libcpuprof.so (an older commit's, to compare).

Build the library first: cargo build --release -p cpuprof-preload (from the repository root,
so that .cargo/config's frame-pointer flags apply)."""
import argparse
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPERFTOOLS = "/usr/lib/x86_64-linux-gnu/libprofiler.so"
CPUPROF = os.path.join(ROOT, "target/release/libcpuprof.so")
TICK = os.sysconf("SC_CLK_TCK")


def configs(out, cpuprof):
    """name -> (library, environment); `out` is a scratch directory for the profiles."""
    return {
        "no profiler": (None, {}),
        "cpuprof cpu": (cpuprof, {"CPUPROFILE": f"{out}/cpu.prof", "CPUPROFILE_FREQUENCY": "100"}),
        "cpuprof wall": (
            cpuprof,
            {"CPUPROFILE_WALL": f"{out}/wall.prof", "CPUPROFILE_WALL_FREQUENCY": "100"},
        ),
        "gperftools": (GPERFTOOLS, {"CPUPROFILE": f"{out}/gperf.prof", "CPUPROFILE_FREQUENCY": "100"}),
    }


def snapshot(pid):
    """tid -> (comm, CPU seconds from stat, CPU seconds from schedstat or None)."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # Fields 14 and 15 of stat(5), counted from 1 with pid and comm as 1 and 2.
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0]) / 1e9
        except OSError:
            ns = None
        threads[tid] = (comm, cpu, ns)
    return threads


def group(comm):
    return comm if comm.startswith("cpuprof") else "program's threads"


def measure(name, lib, env, prog, args):
    full_env = dict(os.environ)
    for k in list(full_env):
        if k.startswith("CPUPROFILE"):
            del full_env[k]
    full_env.update(env)
    if lib:
        full_env["LD_PRELOAD"] = lib
    p = subprocess.Popen(
        [prog, str(args.threads), str(args.settle + args.seconds + 2)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full_env,
        text=True,
    )
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit(f"{name}: the program did not start: {p.stderr.read()}")
    time.sleep(args.settle)
    before, t0 = snapshot(p.pid), time.monotonic()
    time.sleep(args.seconds)
    after, t1 = snapshot(p.pid), time.monotonic()
    p.communicate()
    wall = t1 - t0
    used = {}
    for tid, (comm, cpu, ns) in after.items():
        _, cpu0, ns0 = before.get(tid, (comm, 0.0, 0.0))
        g = used.setdefault(group(comm), [0.0, 0.0, 0])
        g[0] += cpu - cpu0
        g[1] += (ns - ns0) if ns is not None and ns0 is not None else float("nan")
        g[2] += 1
    return {g: (100 * s / wall, 100 * ns / wall, n) for g, (s, ns, n) in used.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--settle", type=float, default=2, help="seconds after every thread waits")
    ap.add_argument("--configs", help="comma-separated names (default: all)")
    ap.add_argument("--cpuprof", default=CPUPROF, help="the libcpuprof.so to measure")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="idle_threads.")
    prog = os.path.join(out, "idle_threads")
    subprocess.run(
        ["cc", "-O2", "-g", "-fno-omit-frame-pointer", os.path.join(ROOT, "bench/idle_threads.c"), "-o", prog, "-lpthread"],
        check=True,
    )
    chosen = configs(out, os.path.abspath(args.cpuprof))
    if args.configs:
        chosen = {k: v for k, v in chosen.items() if k in args.configs.split(",")}
    print(f"{args.threads} idle threads, {args.seconds:g} s steady state; % of one core: stat (schedstat)\n")
    print("| configuration | thread | threads | CPU |")
    print("|---|---|---|---|")
    for name, (lib, env) in chosen.items():
        used = measure(name, lib, env, prog, args)
        total = [sum(u[i] for u in used.values()) for i in range(2)]
        for g in sorted(used):
            cpu, ns, n = used[g]
            print(f"| {name} | {g} | {n} | {cpu:.2f} % ({ns:.3f} %) |")
        print(f"| {name} | whole process | {sum(u[2] for u in used.values())} | {total[0]:.2f} % ({total[1]:.3f} %) |")


if __name__ == "__main__":
    main()
