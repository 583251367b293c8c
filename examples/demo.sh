#!/usr/bin/env bash
# Builds cpuprof, profiles the bundled C demo through LD_PRELOAD, and shows the top functions
# and a flame graph. Needs cargo and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
out=target/demo
mkdir -p "$out"
cc -O2 -g -fno-omit-frame-pointer examples/demo.c -o "$out/demo"
LD_PRELOAD="$PWD/target/release/libcpuprof.so" CPUPROFILE="$out/demo.prof" "$out/demo"
target/release/cpuprof top "$out/demo.prof"
target/release/cpuprof flamegraph "$out/demo.prof" -o "$out/demo.svg"
echo "open $out/demo.svg in a browser for the flame graph"
