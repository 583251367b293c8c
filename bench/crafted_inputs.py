#!/usr/bin/env python3
"""How much memory and time hostile raw profiles cost to read (issue 26).

Builds three crafted inputs in a temporary directory:

  zeros    2 GiB of zero bytes (a sparse file: nothing on disk, but 2 GiB to read); not a
           profile, which the header says in its first 16 bytes.
  distinct 8 M records of one frame each, every one a distinct address (~200 MB): 8 M
           distinct stacks and 8 M distinct frames.
  deep     256 stacks 40,000 frames deep (~82 MB): a distinct leaf each, the callers
           cycling through 1,000 return addresses (a deep recursion).

and runs `check`, `top` and `convert --to pprof` of each CLI given (--old, --new) on each
under `/usr/bin/time -v`, printing peak RSS and wall time side by side.

    bench/crafted_inputs.py --old /tmp/base-cli/cpuprof --new target/release/cpuprof
"""

import argparse
import array
import os
import re
import subprocess
import sys
import tempfile

MAPS = b"00400000-7fffffff0000 r-xp 00000000 00:00 0 /nonexistent/crafted-app\n"


def header():
    # Slots 0, 3 (header words), 0 (version), period (us), 0 (padding): 64-bit little-endian.
    return array.array("Q", [0, 3, 0, 10000, 0]).tobytes()


def trailer():
    return array.array("Q", [0, 1, 0]).tobytes()


def write_distinct(path, n=8 << 20):
    slots = array.array("Q", bytes(8 * 3 * n))
    slots[0::3] = array.array("Q", [1]) * n
    slots[1::3] = array.array("Q", [1]) * n
    slots[2::3] = array.array("Q", range(0x400000, 0x400000 + 16 * n, 16))
    with open(path, "wb") as f:
        f.write(header())
        f.write(slots.tobytes())
        f.write(trailer())
        f.write(MAPS)


def write_deep(path, stacks=256, depth=40_000, callers=1000):
    callers_cycle = array.array("Q", [0x600000 + 16 * (j % callers) + 5 for j in range(depth - 1)])
    with open(path, "wb") as f:
        f.write(header())
        for i in range(stacks):
            f.write(array.array("Q", [1, depth, 0x500000 + 16 * i]).tobytes())
            f.write(callers_cycle.tobytes())
        f.write(trailer())
        f.write(MAPS)


def write_zeros(path, size=2 << 30):
    with open(path, "wb") as f:
        f.truncate(size)


def measure(cli, args, cwd):
    result = subprocess.run(["/usr/bin/time", "-v", cli, *args], cwd=cwd, capture_output=True, timeout=3600)
    err = result.stderr.decode(errors="replace")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err).group(1)
    seconds = 0.0
    for part in wall.split(":"):
        seconds = seconds * 60 + float(part)
    # The exit status of the CLI, not of time (which reports it as its own).
    status = re.search(r"Exit status: (\d+)", err)
    return rss / 1024, seconds, int(status.group(1)) if status else result.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the baseline CLI")
    parser.add_argument("--new", required=True, help="the CLI to compare")
    parser.add_argument("--only", nargs="*", help="inputs to run (zeros, distinct, deep)")
    a = parser.parse_args()
    clis = [("old", os.path.abspath(a.old)), ("new", os.path.abspath(a.new))]
    with tempfile.TemporaryDirectory(prefix="cpuprof-crafted-") as work:
        inputs = [
            ("zeros", write_zeros),
            ("distinct", write_distinct),
            ("deep", write_deep),
        ]
        rows = []
        for name, write in inputs:
            if a.only and name not in a.only:
                continue
            path = os.path.join(work, f"{name}.prof")
            write(path)
            size = os.path.getsize(path) / 1e6
            commands = [
                ("check", ["check", path]),
                ("top", ["top", path]),
                ("convert", ["convert", "--to", "pprof", path, "-o", os.path.join(work, "out.pb.gz")]),
            ]
            for command, args in commands:
                row = [name, f"{size:.0f}", command]
                for _, cli in clis:
                    rss, seconds, status = measure(cli, args, work)
                    row += [f"{rss:.0f}", f"{seconds:.2f}", str(status)]
                rows.append(row)
                print(" ".join(row), file=sys.stderr, flush=True)
            os.unlink(path)
        head = ["input", "MB", "command"]
        for label, _ in clis:
            head += [f"{label} RSS MB", f"{label} s", f"{label} exit"]
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
