#!/usr/bin/env bash
# Builds cpuprof, profiles the bundled C demo through LD_PRELOAD, and shows the top functions,
# a flame graph and the HTML report. Needs cargo and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
out=target/demo
mkdir -p "$out"
cc -O2 -g -fno-omit-frame-pointer examples/demo.c -o "$out/demo"
# `cpuprof record` preloads target/release/libcpuprof.so (the same as running the program with
# LD_PRELOAD=... CPUPROFILE=...), then prints the top functions; --html also writes the report
# page beside the profile (demo.html: hints, interactive flame graph, functions, hot source).
target/release/cpuprof record --html -o "$out/demo.prof" -- "$out/demo"
target/release/cpuprof flamegraph "$out/demo.prof" -o "$out/demo.svg"
echo "open $out/demo.html in a browser for the report ($out/demo.svg: the static flame graph)"
