#!/usr/bin/env python3
"""What checkpoints cost a long-running server: bytes written and file growth per hour.

redis-server (Debian's) runs preloaded with cpuprof while redis-benchmark keeps it busy, once
with checkpoints every 2 s (the default) and once with CPUPROFILE_CHECKPOINT=off, for the same
time each, interleaved over rounds. Measured from outside the profiler: the bytes the writer
thread wrote (`wchar` of /proc/PID/task/TID/io for the thread named cpuprof-writer), the
profile's size on disk, and the server's CPU time, just before the server is stopped; scaled
to an hour. Also the benchmark's requests per second (the cost to the server itself).

    python3 bench/checkpoints.py [--seconds 60] [--rounds 2]

Needs redis-server and redis-benchmark (package redis-server / redis-tools)."""
import argparse
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPUPROF = os.path.join(ROOT, "target/release/libcpuprof.so")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def writer_wchar(pid):
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != "cpuprof-writer":
                    continue
            with open(f"/proc/{pid}/task/{tid}/io") as f:
                return int(re.search(r"wchar: (\d+)", f.read()).group(1))
        except OSError:
            continue
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_for_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def one_run(checkpoint, seconds, work):
    port = free_port()
    profile = os.path.join(work, f"redis-{checkpoint}-{port}.prof")
    env = dict(os.environ, LD_PRELOAD=CPUPROF, CPUPROFILE=profile, CPUPROFILE_CHECKPOINT=checkpoint)
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        bench = subprocess.Popen(
            ["redis-benchmark", "-p", str(port), "-n", "100000000", "-r", "100000", "-c", "20",
             "-t", "set,get,incr,lpush,lrange_100,hset", "-q", "--csv"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(seconds)
        wrote = writer_wchar(server.pid)
        size = os.path.getsize(profile)
        cpu = cpu_seconds(server.pid)
        bench.send_signal(signal.SIGINT)
        bench.wait()
    finally:
        server.terminate()
        server.wait()
    return wrote, size, cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "cpuprof-preload"], cwd=ROOT, check=True)
    results = {"2": [], "off": []}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for checkpoint in results:
                results[checkpoint].append(one_run(checkpoint, args.seconds, work))
    per_hour = 3600 / args.seconds
    print(f"redis-server under redis-benchmark, {args.seconds:.0f} s per run, {args.rounds} rounds; scaled to an hour\n")
    print("| checkpoints | server CPU s/s | writer wrote, MB/hour | file growth, MB/hour |")
    print("|---|---|---|---|")
    for checkpoint, runs in results.items():
        for wrote, size, cpu in runs:
            print(
                f"| {'every 2 s' if checkpoint == '2' else 'off'} | {cpu / args.seconds:.2f} "
                f"| {wrote * per_hour / 1e6:.1f} | {size * per_hour / 1e6:.1f} |"
            )


if __name__ == "__main__":
    main()
