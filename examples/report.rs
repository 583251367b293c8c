//! A report from inside the program: profile a function, print its top functions, and write
//! a flame graph and a pprof protobuf, with no raw profile file anywhere.
//!
//! ```text
//! cargo run --release --features flamegraph --example report
//! go tool pprof -top report.pb.gz
//! ```
//!
//! `parse` does three times the work of `render`, on two named threads.

use std::fs::File;
use std::hint::black_box;
use std::io::BufWriter;

#[inline(never)]
fn parse(rounds: u64) -> u64 {
    hash(1, 3 * rounds)
}

#[inline(never)]
fn render(rounds: u64) -> u64 {
    hash(7, rounds)
}

#[inline(always)]
fn hash(seed: u64, rounds: u64) -> u64 {
    let (mut h, mut i) = (seed, 0);
    while i < rounds {
        h = black_box((h ^ i).wrapping_mul(0x100000001b3));
        i += 1;
    }
    h
}

fn work(rounds: u64) -> u64 {
    (0..rounds).fold(0u64, |total, _| {
        total.wrapping_add(parse(1_000_000)).wrapping_add(render(1_000_000))
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds = std::env::args().nth(1).map_or(Ok(200), |r| r.parse())?;
    let guard = cpuprof::Profiler::builder().frequency(1000).start_in_memory()?;
    let workers: Vec<_> = ["worker-a", "worker-b"]
        .into_iter()
        .map(|name| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || work(rounds / 2))
        })
        .collect::<Result<_, _>>()?;
    let checksum = workers
        .into_iter()
        .fold(0u64, |c, w| c.wrapping_add(w.join().unwrap_or(0)));
    let report = guard.report()?;

    println!("checksum {checksum:x}");
    report.write_top(&mut std::io::stdout(), 20)?;
    report.write_flamegraph(&mut BufWriter::new(File::create("report.svg")?))?;
    report.write_pprof(&mut BufWriter::new(File::create("report.pb.gz")?))?;
    Ok(())
}
