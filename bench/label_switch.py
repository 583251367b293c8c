#!/usr/bin/env python3
"""The cost of one label switch (CpuprofLabelsSwap), in ns of CPU: bench/label_switch.c's loop
of swaps to a set and back, less the same loop without them, median of rounds.

    python3 bench/label_switch.py [--rounds 9] [--switches 50000000]"""
import argparse
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--switches", type=int, default=50_000_000)
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    library = os.path.join(ROOT, "target/release/libcpuprof.so")
    with tempfile.TemporaryDirectory() as workdir:
        exe = os.path.join(workdir, "label_switch")
        subprocess.run(["cc", "-O2", os.path.join(ROOT, "bench/label_switch.c"), "-o", exe, "-ldl"], check=True)
        ns = [float(subprocess.run([exe, library, str(args.switches)], capture_output=True, text=True,
                                   check=True).stdout) for _ in range(args.rounds)]
    print(f"ns per label switch: median {statistics.median(ns):.2f}, range {min(ns):.2f}-{max(ns):.2f} "
          f"({args.rounds} rounds of {args.switches} pairs)")


if __name__ == "__main__":
    main()
