#!/usr/bin/env python3
"""Heap profile overhead: what `LD_PRELOAD=libcpuprof.so` costs a malloc-heavy program with
no profile, with a CPU profile only, and with a heap profile at two sampling rates, beside
gperftools' heap profiler (tcmalloc), heaptrack and valgrind's massif, in the same run.

Workloads:
  * python3 (the real interpreter, not a pyenv shim) building, dumping and re-reading a list of
    dicts as JSON, indexing it by key and grouping it, with PYTHONMALLOC=malloc: every object
    allocation is a malloc call (8.0 M allocations, 7.7 M frees, 0.76 GB). With its default
    pymalloc, python3 calls malloc only for its 256 KiB arenas and large objects (~7,600
    calls) and the test would measure nothing;
  * sqlite3 (/usr/bin/sqlite3) filling an in-memory table of 1 M rows and building two
    indexes on it (2.1 M mallocs, 0.53 GB);
  * a synthetic C loop (written here and compiled into a temporary directory): free a random
    one of 1,024 live blocks and malloc a new one, sizes 16 B - 64 KiB (log-uniform), 12 M
    times (136 GB allocated, untouched past the first 64 bytes: ~260,000 samples at the
    default rate, the worst case for a sampler by bytes);
  * the cost per call: malloc(32-47 B) and free at once, 50 M times (glibc's tcache, ~13 ns a
    pair here), reported as ns of CPU per malloc+free pair above plain.

Besides the profilers, "plain + an idle thread" preloads a three-line library that starts
one thread which sleeps: glibc's malloc takes cheaper paths while a process has one thread,
and a heap profile (which runs a thread of its own) loses them whatever it does.

Configurations run interleaved, once per round, in a fixed order, and ratios are taken within
a round (configuration / plain of the same round), so drift on a shared machine hits all of
them alike; tables show the median over rounds of wall time, CPU time (user + system of the
whole process tree, from wait4) and the ratios, the range of the CPU ratio over rounds, and
the median peak RSS; "fastest runs" divides the configuration's fastest run by plain's
fastest (other programs on the machine only ever add time, so on a busy machine this is the
least disturbed estimate). "plain (again)" runs the unprofiled program a second time in each round:
its ratios are the noise. cpuprof and gperftools are told to write one file, at the end
(HEAP_PROFILE_INUSE_INTERVAL=0, HEAP_PROFILE_ALLOCATION_INTERVAL=0).

gperftools' heap profiler, heaptrack and massif are 4-50x slower: they run on inputs a tenth
the size (--slow-scale), in fewer rounds (--slow-rounds), in a second table with plain,
tcmalloc alone and cpuprof's default heap profile on the same reduced inputs for reference.

Every run's output is checked against the plain run's, and each profiler's file against what
it should have written; a run that fails, hangs (--timeout) or writes no profile is reported
and left out of the medians.

    python3 bench/heap_overhead.py [--rounds 7] [--slow-rounds 2] [--slow-scale 0.1]
                                   [--workloads python,sqlite,synthetic,tight] [--skip-slow]
                                   [--python-items 30000] [--sqlite-rows 1000000]
                                   [--synthetic-ops 12000000] [--tight-pairs 50000000]
                                   [--timeout 600] [--json RUNS.json]

(--workloads also takes python-pymalloc: the python workload with python's own allocator.)

Needs cc, sqlite3, libgoogle-perftools4 (/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4);
heaptrack and valgrind are used where installed."""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUPROF = os.path.join(ROOT, "target/release/libcpuprof.so")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
SQLITE = "/usr/bin/sqlite3"
# Only the final file, for cpuprof and gperftools alike.
ONE_FILE = {"HEAP_PROFILE_INUSE_INTERVAL": "0", "HEAP_PROFILE_ALLOCATION_INTERVAL": "0"}
# Variables of ours or of the tools measured that must not leak in from the caller.
CLEARED_PREFIXES = ("LD_PRELOAD", "CPUPROFILE", "CPUPROF_", "HEAPPROFILE", "HEAP_PROFILE_", "HEAPCHECK",
                    "TCMALLOC_", "PYTHONMALLOC")

PYTHON_WORKLOAD = r'''
import json, sys
n = int(sys.argv[1])
for rep in range(3):
    data = [{"id": i, "name": "item-%d" % i, "tags": ["t%d" % (i % 17), "x" * (i % 40)],
             "vals": list(range(i % 12)), "meta": {"k": i * 0.5, "s": str(i)}} for i in range(n)]
    text = json.dumps(data)
    back = json.loads(text)
    index = {d["name"]: d for d in back}
    groups = {}
    for d in back:
        groups.setdefault(d["tags"][0], []).append(d["id"])
    print(rep, len(text), len(index), len(groups))
    del data, text, back, index, groups
'''

SQLITE_WORKLOAD = '''
CREATE TABLE t(a INTEGER, b TEXT, c REAL);
WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < {rows})
INSERT INTO t SELECT x, printf('%08x-%d', (x * 2654435761) % 4294967296, x), x * 0.5 FROM s;
CREATE INDEX tb ON t(b);
CREATE INDEX tcb ON t(c, b);
SELECT count(*), sum(length(b)) FROM t;
'''

SYNTHETIC_C = r'''
/* malloc/free of mixed sizes: free a random one of SLOTS live blocks, malloc a new one of
 * 16 B - 64 KiB (log-uniform, jittered), touch its first bytes; argv[1] times. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define SLOTS 1024
static void *slot[SLOTS];
int main(int argc, char **argv) {
  long ops = argc > 1 ? atol(argv[1]) : 10000000;
  unsigned long long x = 88172645463325252ull, sum = 0;
  for (long i = 0; i < ops; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    unsigned k = (unsigned)(x >> 20) % SLOTS;
    unsigned shift = (unsigned)(x >> 40) % 13;
    size_t n = ((size_t)16 << shift) + (size_t)((x >> 8) & ((16u << shift) - 1)) / 2;
    if (n > 65536) n = 65536;
    free(slot[k]);
    char *p = malloc(n);
    memset(p, (int)i, n < 64 ? n : 64);
    __asm__ volatile("" : : "r"(p) : "memory");
    sum += n;
    slot[k] = p;
  }
  for (int k = 0; k < SLOTS; k++) free(slot[k]);
  printf("ops %ld bytes %llu\n", ops, sum);
  return 0;
}
'''


TIGHT_C = r'''
/* The cost per call: malloc of 32-47 bytes and its free at once, argv[1] times. */
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 50000000;
  for (long i = 0; i < n; i++) {
    void *p = malloc(32 + (i & 15));
    __asm__ volatile("" : : "r"(p) : "memory");
    free(p);
  }
  printf("pairs %ld\n", n);
  return 0;
}
'''

IDLE_THREAD_C = r'''
/* Preloaded: one thread that sleeps for the life of the process, nothing else. */
#include <pthread.h>
#include <unistd.h>
static void *idle(void *arg) { (void)arg; for (;;) pause(); return 0; }
__attribute__((constructor)) static void start(void) { pthread_t t; pthread_create(&t, 0, idle, 0); }
'''


def compile_c(workdir, name, source, flags):
    exe = os.path.join(workdir, name)
    if not os.path.exists(exe):
        src = exe + ".c"
        with open(src, "w") as f:
            f.write(source)
        subprocess.run(["cc", "-O2", "-g", *flags, src, "-o", exe], check=True)
    return exe


def real_python():
    """The interpreter itself: a pyenv shim is a shell script that execs it."""
    out = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                         check=True)
    return os.path.realpath(out.stdout.strip())


def clean_env(extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    env.update(extra)
    return env


class Workload:
    def __init__(self, name, argv, env=None, stdin=None):
        self.name, self.argv, self.env, self.stdin = name, argv, env or {}, stdin
        self.pairs = None


def workloads(workdir, names, scale, args):
    """name -> Workload at `scale` of the full-size inputs."""
    out = {}
    py = os.path.join(workdir, "json_dicts.py")
    with open(py, "w") as f:
        f.write(PYTHON_WORKLOAD)
    python = real_python()
    items = max(100, int(args.python_items * scale))
    if "python" in names:
        out["python"] = Workload(f"python3 json/dicts, {items} items x 3 (PYTHONMALLOC=malloc)",
                                 [python, py, str(items)], {"PYTHONMALLOC": "malloc"})
    if "python-pymalloc" in names:
        out["python-pymalloc"] = Workload(f"python3 json/dicts, {items} items x 3 (pymalloc)", [python, py, str(items)])
    if "sqlite" in names:
        rows = max(1000, int(args.sqlite_rows * scale))
        sql = os.path.join(workdir, f"index_{rows}.sql")
        with open(sql, "w") as f:
            f.write(SQLITE_WORKLOAD.format(rows=rows))
        out["sqlite"] = Workload(f"sqlite3 :memory:, {rows} rows + 2 indexes", [SQLITE, ":memory:"], stdin=sql)
    if "synthetic" in names:
        exe = compile_c(workdir, "alloc_loop", SYNTHETIC_C, ["-fno-omit-frame-pointer"])
        ops = max(1000, int(args.synthetic_ops * scale))
        out["synthetic"] = Workload(f"C malloc/free loop, {ops / 1e6:g} M ops, 16 B-64 KiB", [exe, str(ops)])
    if "tight" in names:
        exe = compile_c(workdir, "tight_loop", TIGHT_C, ["-fno-omit-frame-pointer"])
        pairs = max(1000, int(args.tight_pairs * scale))
        out["tight"] = Workload(f"C malloc(32-47 B)+free, {pairs / 1e6:g} M pairs", [exe, str(pairs)])
        out["tight"].pairs = pairs
    return out


# Configurations: name -> function(output path prefix) -> (argv prefix, environment, expected files).
def preload(lib, extra=None):
    return lambda out: ([], dict({"LD_PRELOAD": lib}, **(extra or {})), [])


CONFIGS = {
    "plain": lambda out: ([], {}, []),
    "plain (again)": lambda out: ([], {}, []),
    "plain + an idle thread (no cpuprof)": lambda out: ([], {"LD_PRELOAD": compile_c(
        os.path.dirname(out), "idle_thread.so", IDLE_THREAD_C, ["-shared", "-fPIC", "-pthread"])}, []),
    "LD_PRELOAD=libcpuprof.so, nothing set": preload(CPUPROF),
    "cpuprof CPUPROFILE only (100 Hz)": lambda out: ([], {"LD_PRELOAD": CPUPROF, "CPUPROFILE": out + ".prof"},
                                                      [out + ".prof"]),
    "cpuprof HEAPPROFILE, default rate (512 KiB)": lambda out: (
        [], dict(ONE_FILE, LD_PRELOAD=CPUPROF, HEAPPROFILE=out), [out + ".0001.heap"]),
    "cpuprof HEAPPROFILE, HEAP_PROFILE_SAMPLE=65536": lambda out: (
        [], dict(ONE_FILE, LD_PRELOAD=CPUPROF, HEAPPROFILE=out, HEAP_PROFILE_SAMPLE="65536"), [out + ".0001.heap"]),
    "tcmalloc alone (no profile)": preload(TCMALLOC),
    "gperftools heap profiler (tcmalloc + HEAPPROFILE)": lambda out: (
        [], dict(ONE_FILE, LD_PRELOAD=TCMALLOC, HEAPPROFILE=out), [out + ".0001.heap"]),
    "heaptrack": lambda out: (["heaptrack", "-o", out], {}, [out + ".zst", out + ".gz"]),
    "valgrind --tool=massif": lambda out: (["valgrind", "--tool=massif", f"--massif-out-file={out}.massif"], {},
                                           [out + ".massif"]),
}
FAST = ["plain", "plain (again)", "plain + an idle thread (no cpuprof)", "LD_PRELOAD=libcpuprof.so, nothing set",
        "cpuprof CPUPROFILE only (100 Hz)", "cpuprof HEAPPROFILE, default rate (512 KiB)",
        "cpuprof HEAPPROFILE, HEAP_PROFILE_SAMPLE=65536", "tcmalloc alone (no profile)"]
SLOW = ["plain", "cpuprof HEAPPROFILE, default rate (512 KiB)", "tcmalloc alone (no profile)",
        "gperftools heap profiler (tcmalloc + HEAPPROFILE)", "heaptrack", "valgrind --tool=massif"]


def timed(workload, config, workdir, timeout):
    """One run under `config`: wall and CPU seconds, peak RSS in KiB, via wait4."""
    out = os.path.join(workdir, "profile")
    for name in os.listdir(workdir):
        if name.startswith("profile"):
            os.remove(os.path.join(workdir, name))
    prefix, extra, expected = CONFIGS[config](out)
    env = clean_env(dict(workload.env, **extra))
    stdin = open(workload.stdin) if workload.stdin else subprocess.DEVNULL
    stdout_path, stderr_path = os.path.join(workdir, "stdout"), os.path.join(workdir, "stderr")
    with open(stdout_path, "w") as so, open(stderr_path, "w") as se:
        started = time.monotonic()
        proc = subprocess.Popen(prefix + workload.argv, env=env, stdin=stdin, stdout=so, stderr=se,
                                start_new_session=True)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                return {"error": f"no end after {timeout} s (killed)"}
            time.sleep(0.005)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
    if workload.stdin:
        stdin.close()
    with open(stdout_path) as f:
        stdout = f.read()
    with open(stderr_path, errors="replace") as f:
        stderr = f.read()
    if proc.returncode != 0:
        return {"error": f"exit status {proc.returncode}: {stderr.strip()[-400:]}"}
    if expected and not any(os.path.exists(p) and os.path.getsize(p) > 0 for p in expected):
        return {"error": f"no profile written ({' or '.join(expected)}): {stderr.strip()[-400:]}"}
    if config.startswith("cpuprof HEAPPROFILE"):
        extra_files = [n for n in os.listdir(workdir) if n.startswith("profile") and n.endswith(".heap")
                       and n != "profile.0001.heap"]
        if extra_files:
            return {"error": f"more than the final file: {extra_files}"}
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss, "stdout": stdout}


def table(title, names, configs, works, rounds, workdir, timeout, problems, raw):
    rows, per_call = [], []
    for key, workload in works.items():
        results = {c: [] for c in configs}
        for r in range(rounds):
            for config in configs:
                got = timed(workload, config, workdir, timeout)
                results[config].append(got)
                if "error" in got:
                    problems.append(f"{workload.name}, {config}, round {r + 1}: {got['error']}")
        # Each configuration's output against plain's (heaptrack adds its own lines).
        expected = next((g["stdout"] for g in results["plain"] if "stdout" in g), None)
        for config, runs in results.items():
            for r, got in enumerate(runs):
                if "stdout" in got and expected is not None and expected.strip() not in got["stdout"]:
                    problems.append(f"{workload.name}, {config}, round {r + 1}: output differs from plain's: "
                                    f"{got['stdout'].strip()[-200:]!r}")
                    got["error"] = "output differs"
        plain = results["plain"]
        for config in configs:
            ratios_wall, ratios_cpu = [], []
            for base, got in zip(plain, results[config]):
                if "error" in base or "error" in got:
                    continue
                ratios_wall.append(got["wall"] / base["wall"])
                ratios_cpu.append(got["cpu"] / base["cpu"])
            ok = [g for g in results[config] if "error" not in g]
            if workload.pairs and config == "plain" and ok:
                per_call.append((workload.name, "plain: ns per pair", statistics.median(g["cpu"] for g in ok)
                                 / workload.pairs * 1e9, None, None))
            if workload.pairs and config != "plain":
                added = [(g["cpu"] - b["cpu"]) / workload.pairs * 1e9 for b, g in zip(plain, results[config])
                         if "error" not in b and "error" not in g]
                if added:
                    per_call.append((workload.name, config, statistics.median(added), min(added), max(added)))
            if not ok:
                rows.append((workload.name, config, None))
                continue
            rows.append((workload.name, config, {
                "runs": len(ok),
                "wall": statistics.median(g["wall"] for g in ok),
                "cpu": statistics.median(g["cpu"] for g in ok),
                "rss": statistics.median(g["rss"] for g in ok) / 1024,
                "rwall": statistics.median(ratios_wall) if ratios_wall else float("nan"),
                "rcpu": statistics.median(ratios_cpu) if ratios_cpu else float("nan"),
                "lo": min(ratios_cpu, default=float("nan")),
                "hi": max(ratios_cpu, default=float("nan")),
                # Other programs only ever add time: the fastest run of each is the least disturbed.
                "fastest": min(g["cpu"] for g in ok) / min((g["cpu"] for g in plain if "error" not in g),
                                                           default=float("nan")),
            }))
        raw.append({"workload": workload.name, "argv": workload.argv,
                    "runs": {c: [{k: v for k, v in g.items() if k != "stdout"} for g in results[c]]
                             for c in configs}})
        print(f"... {workload.name} done ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.2f})",
              file=sys.stderr, flush=True)
    print(f"\n{title}\n")
    print("| workload | configuration | runs | wall s | CPU s | wall / plain | CPU / plain | CPU / plain, "
          "lowest-highest | CPU / plain, fastest runs | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for workload, config, r in rows:
        if r is None:
            print(f"| {workload} | {config} | 0 | failed | | | | | | |")
            continue
        if config == "plain":
            ratios = "1 | 1 | | 1"
        else:
            ratios = f"{r['rwall']:.3f} | {r['rcpu']:.3f} | {r['lo']:.3f}-{r['hi']:.3f} | {r['fastest']:.3f}"
        print(f"| {workload} | {config} | {r['runs']} | {r['wall']:.2f} | {r['cpu']:.2f} | {ratios} "
              f"| {r['rss']:.0f} |")
    if per_call:
        print("\nThe cost per call: ns of CPU added per malloc+free pair, median and range over rounds of the "
              "difference to plain in the same round\n")
        print("| workload | configuration | ns per pair added | lowest-highest |")
        print("|---|---|---|---|")
        for workload, config, med, lo, hi in per_call:
            if lo is None:
                print(f"| {workload} | {config} | {med:.1f} | |")
            else:
                print(f"| {workload} | {config} | {med:+.1f} | {lo:+.1f} to {hi:+.1f} |")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--slow-rounds", type=int, default=2)
    parser.add_argument("--slow-scale", type=float, default=0.1,
                        help="input size of the slow profilers' table, as a fraction of the full size")
    parser.add_argument("--workloads", default="python,sqlite,synthetic,tight")
    parser.add_argument("--skip-slow", action="store_true")
    parser.add_argument("--skip-fast", action="store_true")
    parser.add_argument("--python-items", type=int, default=30000)
    parser.add_argument("--sqlite-rows", type=int, default=1000000)
    parser.add_argument("--synthetic-ops", type=int, default=12000000)
    parser.add_argument("--tight-pairs", type=int, default=50000000)
    parser.add_argument("--timeout", type=float, default=600, help="seconds before a run is killed")
    parser.add_argument("--json", help="also write every run's times to this file")
    args = parser.parse_args()
    for tool in ["cc", SQLITE, TCMALLOC]:
        if not shutil.which(tool) and not os.path.exists(tool):
            sys.exit(f"{tool} is needed")
    slow = [c for c in SLOW if not (c == "heaptrack" and not shutil.which("heaptrack"))
            and not (c.startswith("valgrind") and not shutil.which("valgrind"))]
    names = args.workloads.split(",")
    started = time.time()
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    problems, raw = [], []
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="heap_overhead.") as workdir:
        if not args.skip_fast:
            table(f"Full-size inputs: median of {args.rounds} rounds, ratios within a round", names, FAST,
                  workloads(workdir, names, 1.0, args), args.rounds, workdir, args.timeout, problems, raw)
        if not args.skip_slow:
            table(f"Reduced inputs ({args.slow_scale:g} of full size) for the slow profilers: median of "
                  f"{args.slow_rounds} rounds", names, slow,
                  workloads(workdir, [n for n in names if n != "tight"], args.slow_scale, args),
                  args.slow_rounds, workdir, args.timeout, problems, raw)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    if problems:
        print("\nProblems:\n")
        for p in problems:
            print(f"* {p}")
    print(f"\n(load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
