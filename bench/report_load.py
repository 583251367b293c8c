#!/usr/bin/env python3
"""Size and load time of `cpuprof report` pages of profiles with many distinct stacks, in
Debian's headless Chromium, beside the static SVG flame graph (`cpuprof flamegraph`) of the
same profile in the same browser.

The profile is made as bench/reader_speed.py makes its own: the known-answer binary's real
return addresses and leaf PCs in random chains of 4-16 frames, so nearly every record is a
distinct stack and the call tree hardly shares: a worst case for the page's data. Load time is
what the page measures itself (the `cpuprof-ready` mark: data parsed, graph and table drawn)
and the navigation's load event, median of --runs loads (tests/browser/report_page.py).

Target (issue 19): a 100,000-distinct-stack profile gives a page under 10 MB that opens in
under 2 s.

    python3 bench/report_load.py [--records 100000] [--runs 5]"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from reader_speed import build, synthesize  # noqa: E402


def loads(page, runs):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests/browser/report_page.py"), "load", page,
                          str(runs)], check=True, capture_output=True, text=True).stdout
    rows = [dict(zip(line.split()[1::2], line.split()[2::2])) for line in out.splitlines() if line.startswith("load")]
    ready = [float(r["ready_ms"]) for r in rows if r["ready_ms"] != "-"]
    loaded = [float(r["loaded_ms"]) for r in rows]
    return (statistics.median(ready) if ready else None), statistics.median(loaded), rows[-1]["frames_drawn"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        _, cli, seed = build(workdir)
        print("| distinct stacks | profile | page | tree nodes | `cpuprof report` | page ready | page loaded | "
              "frames drawn | SVG flame graph | SVG loaded |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for records in args.records:
            profile = os.path.join(workdir, f"big{records}.prof")
            size = synthesize(seed, profile, records)
            page, svg = os.path.join(workdir, f"big{records}.html"), os.path.join(workdir, f"big{records}.svg")
            started = time.monotonic()
            subprocess.run([cli, "report", profile, "-o", page], check=True, capture_output=True)
            made = time.monotonic() - started
            subprocess.run([cli, "flamegraph", profile, "-o", svg], check=True, capture_output=True)
            text = open(page, encoding="utf-8").read()
            data = text[text.index('"tree":[') + 8:]
            nodes = data[:data.index("]")].count(",") // 3 + 1
            ready, loaded, frames = loads(page, args.runs)
            _, svg_loaded, _ = loads(svg, args.runs)
            print(f"| {records:,} | {size / 1e6:.1f} MB | {len(text.encode()) / 1e6:.2f} MB | {nodes:,} | {made:.2f} s | "
                  f"{ready:.0f} ms | {loaded:.0f} ms | {frames} | {os.path.getsize(svg) / 1e6:.2f} MB | {svg_loaded:.0f} ms |")


if __name__ == "__main__":
    main()
