#!/usr/bin/env python3
"""Handler cost per sample: cpuprof (frame-pointer and DWARF walks) beside gperftools'
libprofiler.so, at several stack depths, as the excess CPU time per signal over an empty
handler. Configurations are interleaved within each round and the excess is taken per round,
so drift on a shared machine hits all of them alike; the table shows medians over rounds.

    python3 bench/handler_cost.py [--rounds 7] [--signals 200000] [--depths 10,50,250]
                                  [--baseline OTHER/libcpuprof.so] [--labels]

--baseline adds another build of libcpuprof.so (an older commit's) to the same rounds, to show
that a change left the handler's cost where it was. --labels adds cpuprof with a label set
installed on the sampled thread (every sample carries it: `cpuprof::labels`).

Needs cc and libgoogle-perftools-dev (for /usr/lib/x86_64-linux-gnu/libprofiler.so)."""
import argparse
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPERFTOOLS = "/usr/lib/x86_64-linux-gnu/libprofiler.so"


def build(workdir):
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    exe = os.path.join(workdir, "handler_cost")
    subprocess.run(["cc", "-O2", "-g", "-fno-omit-frame-pointer", os.path.join(ROOT, "bench/handler_cost.c"),
                    "-o", exe, "-ldl"], check=True)
    return exe, os.path.join(ROOT, "target/release/libcpuprof.so")


def ns_per_signal(exe, library, depth, signals, env, workdir):
    out = subprocess.run([exe, library, str(depth), str(signals)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, BENCH_PROFILE=os.path.join(workdir, "bench.prof"), **env))
    return float(out.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--signals", type=int, default=200000)
    parser.add_argument("--depths", default="10,50,250")
    parser.add_argument("--baseline", help="another libcpuprof.so to compare with, in the same rounds")
    parser.add_argument("--labels", action="store_true", help="also cpuprof with a label set installed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        exe, cpuprof = build(workdir)
        configs = {
            "gperftools": (GPERFTOOLS, {}),
            # The process timer's signal is SIGPROF, the one the program sends itself.
            "cpuprof fp": (cpuprof, {"CPUPROFILE_UNWINDER": "fp", "CPUPROFILE_TIMER": "itimer"}),
            "cpuprof dwarf": (cpuprof, {"CPUPROFILE_UNWINDER": "dwarf", "CPUPROFILE_TIMER": "itimer"}),
        }
        if args.baseline:
            for walker in ["fp", "dwarf"]:
                configs[f"baseline {walker}"] = (os.path.abspath(args.baseline),
                                                 {"CPUPROFILE_UNWINDER": walker, "CPUPROFILE_TIMER": "itimer"})
        if args.labels:
            for walker in ["fp", "dwarf"]:
                configs[f"labels {walker}"] = (cpuprof, {"CPUPROFILE_UNWINDER": walker, "CPUPROFILE_TIMER": "itimer",
                                                         "BENCH_LABELS": "1"})
        print(f"ns of CPU per signal above an empty handler (median of {args.rounds} rounds, "
              f"{args.signals} signals each)\n")
        extra = " baseline fp | baseline dwarf | fp / baseline | dwarf / baseline |" if args.baseline else ""
        extra += " fp, labels | dwarf, labels | fp labels / fp | dwarf labels / dwarf |" if args.labels else ""
        print("| depth | empty handler (floor) | gperftools 2.10 | cpuprof fp | cpuprof dwarf "
              "| fp / gperftools | dwarf / gperftools |" + extra)
        print("|---|---|---|---|---|---|---|" + "---|" * (4 * bool(args.baseline) + 4 * args.labels))
        for depth in [int(d) for d in args.depths.split(",")]:
            floors, excess = [], {name: [] for name in configs}
            for _ in range(args.rounds):
                floor = ns_per_signal(exe, "none", depth, args.signals, {}, workdir)
                floors.append(floor)
                for name, (library, env) in configs.items():
                    excess[name].append(ns_per_signal(exe, library, depth, args.signals, env, workdir) - floor)
            med = {name: statistics.median(v) for name, v in excess.items()}
            gp = med["gperftools"]
            row = (f"| {depth} | {statistics.median(floors):.0f} | {gp:.0f} | {med['cpuprof fp']:.0f} | "
                   f"{med['cpuprof dwarf']:.0f} | {med['cpuprof fp'] / gp:.2f} | {med['cpuprof dwarf'] / gp:.2f} |")
            if args.baseline:
                fp, dwarf = med["baseline fp"], med["baseline dwarf"]
                row += (f" {fp:.0f} | {dwarf:.0f} | {med['cpuprof fp'] / fp:.2f} | "
                        f"{med['cpuprof dwarf'] / dwarf:.2f} |")
            if args.labels:
                fp, dwarf = med["labels fp"], med["labels dwarf"]
                row += (f" {fp:.0f} | {dwarf:.0f} | {fp / med['cpuprof fp']:.2f} | "
                        f"{dwarf / med['cpuprof dwarf']:.2f} |")
            print(row, flush=True)


if __name__ == "__main__":
    main()
