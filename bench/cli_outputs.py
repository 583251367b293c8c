#!/usr/bin/env python3
"""Are two builds of the `cpuprof` CLI the same to their users? (issue 26: a refactoring must
not change what any command prints or writes.)

Profiles a few of the repository's C workloads once (with the library given by --lib), then runs
every reading command of both CLIs over the same files, with and without filters, and compares
byte for byte: the exit status, standard output, standard error and every file written. Paths
that differ only by which CLI ran (its output directory) are the same text in both.

    cargo build --release -p cpuprof-cli -p cpuprof-preload
    git worktree add /tmp/base <commit> && cargo build --release --manifest-path /tmp/base/Cargo.toml -p cpuprof-cli
    bench/cli_outputs.py --old /tmp/base/target/release/cpuprof --new target/release/cpuprof

Exit status 0 when every output is identical, 1 otherwise (the differences are listed)."""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(args, env=None, cwd=None):
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, timeout=600)


def compile_c(src, out, extra=()):
    result = sh(["cc", "-g", "-O1", "-fno-omit-frame-pointer", "-I", os.path.join(ROOT, "tests/c"),
                 os.path.join(ROOT, "tests/c", src), "-o", out, "-lm", "-lpthread", *extra])
    if result.returncode != 0:
        sys.exit(f"cc {src}: {result.stderr.decode()}")


def profile(lib, program, args, out, env_extra=None):
    env = dict(os.environ, LD_PRELOAD=lib, CPUPROFILE=out, CPUPROFILE_FREQUENCY="500")
    env.update(env_extra or {})
    result = sh([program, *args], env=env)
    if result.returncode != 0:
        sys.exit(f"{program}: {result.stderr.decode()}")


def make_profiles(lib, work):
    """The inputs: plain, threaded, stripped, cut short, a history, a database."""
    bins = os.path.join(work, "bin")
    os.makedirs(bins)
    for name in ["callgraph", "stacks", "list_lines", "stripped", "threads"]:
        compile_c(f"{name}.c", os.path.join(bins, name))
    stripped = os.path.join(bins, "stripped_s")
    shutil.copy(os.path.join(bins, "stripped"), stripped)
    sh(["strip", stripped])
    p = os.path.join(work, "profiles")
    os.makedirs(os.path.join(p, "history"))
    profile(lib, os.path.join(bins, "callgraph"), ["0.6"], f"{p}/callgraph.prof")
    profile(lib, os.path.join(bins, "callgraph"), ["0.6"], f"{p}/callgraph2.prof")
    for i in range(3):
        profile(lib, os.path.join(bins, "callgraph"), ["0.3"], f"{p}/history/run{i}.prof")
    profile(lib, os.path.join(bins, "list_lines"), ["0.5"], f"{p}/list_lines.prof")
    profile(lib, stripped, ["0.4"], f"{p}/stripped.prof")
    profile(lib, os.path.join(bins, "threads"), [], f"{p}/threads.prof",
            {"CPUPROFILE_THREADS": "1"})
    # Cut short: the first half of a profile (no trailer, no maps).
    with open(f"{p}/callgraph.prof", "rb") as f:
        data = f.read()
    with open(f"{p}/cut.prof", "wb") as f:
        f.write(data[: len(data) // 2])
    db = os.path.join(p, "db")
    profile(lib, os.path.join(bins, "callgraph"), ["1.2"], os.path.join(work, "unused.prof"),
            {"CPUPROFILE_DB": db, "CPUPROFILE_EPOCH": "0.25"})
    return p, bins


def cases(p, bins):
    """(name, arguments) for every reading command; OUT is the CLI's own output directory."""
    cg, cg2, st = f"{p}/callgraph.prof", f"{p}/callgraph2.prof", f"{p}/stripped.prof"
    sym = ["--binary", f"{bins}/stripped_s"]
    filters = [[], ["--focus", "^a$"], ["--ignore", "^b$"], ["--hide", "^c$"], ["--show", "^(a|c)$"]]
    out = []
    for i, f in enumerate(filters):
        out += [
            (f"top{i}", ["top", cg, *f]),
            (f"top-cum{i}", ["top", "--cum", "-n", "5", cg, *f]),
            (f"peek{i}", ["peek", "^c$", cg, *f]),
            (f"collapse{i}", ["collapse", cg, *f]),
            (f"convert-pprof{i}", ["convert", cg, "--to", "pprof", "-o", "OUT/cg.pb.gz", *f]),
            (f"convert-dcpi{i}", ["convert", cg, "--to", "dcpi", "-o", "OUT/dcpi", *f]),
            (f"diff{i}", ["diff", cg, cg2, *f]),
            (f"advise{i}", ["advise", cg, *f]),
        ]
    out += [
        ("top-threads", ["top", f"{p}/threads.prof"]),
        ("top-stripped", ["top", st]),
        ("top-stripped-binary", ["top", st, *sym]),
        ("top-cut", ["top", f"{p}/cut.prof", "--binary", f"{bins}/callgraph"]),
        ("top-db", ["top", "--db", f"{p}/db"]),
        ("collapse-db", ["collapse", "--db", f"{p}/db"]),
        ("convert-db-dcpi", ["convert", "--db", f"{p}/db", "--to", "dcpi", "-o", "OUT/dbdcpi"]),
        ("collapse-threads", ["collapse", f"{p}/threads.prof"]),
        ("flamegraph", ["flamegraph", cg, "-o", "OUT/fg.svg"]),
        ("flamegraph-stripped", ["flamegraph", st, "-o", "OUT/fgs.svg"]),
        ("list", ["list", "spin|hot", f"{p}/list_lines.prof"]),
        ("list-disasm", ["list", "--disasm", "^c$", cg]),
        ("diff-flat", ["diff", "--flat", "--tick-us", "4000", cg, cg2]),
        ("diff-units", ["diff", "--units", "10,12", cg, cg2]),
        ("diff-fail", ["diff", "--fail-on", "share=1", "--fail-on", "total=5%", cg, cg2]),
        ("diff-history", ["diff", "--history", f"{p}/history", cg]),
        ("diff-history-db", ["diff", "--history", f"{p}/db", "--tick-us", "4000", cg]),
        ("advise-json", ["advise", "--format", "json", cg]),
        ("advise-history", ["advise", "--history", f"{p}/history", cg]),
        ("report", ["report", cg, "-o", "OUT/r.html"]),
        ("report-base", ["report", cg, "--base", cg2, "-o", "OUT/rb.html"]),
        ("report-history", ["report", cg, "--history", f"{p}/history", "-o", "OUT/rh.html"]),
        ("merge", ["merge", "-o", "OUT/m.prof", cg, cg2]),
        ("db", ["db", f"{p}/db"]),
        ("history", ["history", "--db", f"{p}/db", "--window", "3", "-o", "OUT/h.svg"]),
        ("dump", ["dump", cg]),
        ("dump-cut", ["dump", f"{p}/cut.prof"]),
        ("check", ["check", cg]),
        ("check-cut", ["check", f"{p}/cut.prof"]),
        ("check-missing", ["check", f"{p}/nonexistent.prof"]),
        ("check-garbage", ["check", f"{bins}/callgraph"]),
        ("bad-regex", ["top", "--focus", "(", cg]),
    ]
    return out


def run_all(cli, p, bins, outdir):
    """Every case's status, stdout, stderr and files, with `outdir` spelled OUT."""
    results = {}
    for name, args in cases(p, bins):
        own = os.path.join(outdir, name)
        os.makedirs(own)
        argv = [a.replace("OUT", own) for a in args]
        r = sh([cli, *argv], env=dict(os.environ, NO_COLOR="1"))
        files = {}
        for d, _, names in os.walk(own):
            for n in names:
                path = os.path.join(d, n)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, own)] = f.read().replace(own.encode(), b"OUT")
        results[name] = (r.returncode, r.stdout.replace(own.encode(), b"OUT"),
                         r.stderr.replace(own.encode(), b"OUT"), files)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the baseline cpuprof CLI")
    ap.add_argument("--new", required=True, help="the cpuprof CLI under test")
    ap.add_argument("--lib", default=os.path.join(ROOT, "target/release/libcpuprof.so"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cli_outputs.")
    try:
        p, bins = make_profiles(os.path.abspath(a.lib), work)
        timings = {}
        results = {}
        for label, cli in [("old", a.old), ("new", a.new)]:
            start = time.monotonic()
            results[label] = run_all(os.path.abspath(cli), p, bins, os.path.join(work, label))
            timings[label] = time.monotonic() - start
        differ = 0
        for name in results["old"]:
            old, new = results["old"][name], results["new"][name]
            parts = ["status", "stdout", "stderr"]
            for part, x, y in zip(parts, old[:3], new[:3]):
                if x != y:
                    differ += 1
                    print(f"DIFFERS {name} {part}:\n  old: {x[:400]!r}\n  new: {y[:400]!r}")
            for f in sorted(set(old[3]) | set(new[3])):
                if old[3].get(f) != new[3].get(f):
                    differ += 1
                    print(f"DIFFERS {name} file {f}")
        total = len(results["old"])
        print(f"{total} cases, {differ} differences; old {timings['old']:.1f} s, "
              f"new {timings['new']:.1f} s; work directory {work}")
        return 1 if differ else 0
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
