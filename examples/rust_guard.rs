//! Profiling a Rust program with the guard: `cargo run --release --example rust_guard`, then
//! `target/release/cpuprof top rust_guard.prof`. `parse` does three times the work of `render`.

use std::hint::black_box;

#[inline(never)]
fn parse(rounds: u64) -> u64 {
    (0..3 * rounds).fold(1u64, |h, i| black_box(h.wrapping_mul(0x100000001b3) ^ i))
}

#[inline(never)]
fn render(rounds: u64) -> u64 {
    (0..rounds).fold(7u64, |h, i| black_box(h.wrapping_mul(0x100000001b3) ^ i))
}

fn main() -> Result<(), cpuprof::Error> {
    let guard = cpuprof::Profiler::builder().frequency(250).start("rust_guard.prof")?;
    let mut total = 0u64;
    for _ in 0..400 {
        total = total.wrapping_add(parse(1_000_000)).wrapping_add(render(1_000_000));
    }
    let summary = guard.stop()?;
    println!(
        "checksum {total:x}; {} samples written to rust_guard.prof",
        summary.interrupts
    );
    Ok(())
}
