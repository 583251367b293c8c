//! A Rust program profiling its own heap, with no preloaded library: `heap::Sampled` as the
//! global allocator, then `heap::start` and `heap::profile`. The known answer of
//! `tests/c/heap_known.c`: `big_a` allocates three bytes for every one of `big_b`'s, in sizes
//! from 16 B to 1 MiB; half of `big_b`'s blocks are freed. Prints the truth
//! (`alloc a=.. b=.. inuse a=.. b=..`), writes the profile to the path given and prints its
//! top functions by bytes in use (`heap::report`).
//!
//!     cargo run --release --example heap_sampled -- out.heap [rounds]

use cpuprof::format::heap::HeapValue;
use cpuprof::heap::{self, Sampled};
use std::alloc::System;
use std::hint::black_box;

#[global_allocator]
static ALLOC: Sampled<System> = Sampled::new(System);

fn size_at(i: u32) -> usize {
    const SIZES: [usize; 13] = [16, 24, 40, 64, 100, 256, 512, 1000, 4096, 10000, 65536, 300000, 1 << 20];
    let k = (i.wrapping_mul(7919) % 64) as usize;
    match k {
        0..30 => SIZES[k % 5],
        30..50 => SIZES[5 + k % 4],
        50..60 => SIZES[9 + k % 2],
        _ => SIZES[11 + k % 2],
    }
}

// Each writes its own byte: identical bodies would be merged into one function.
#[inline(never)]
fn big_a(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    v.push(0xa);
    black_box(v)
}

#[inline(never)]
fn big_b(n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    v.push(0xb);
    black_box(v)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args.next().ok_or("usage: heap_sampled OUT.heap [rounds]")?;
    let rounds: u32 = args.next().map_or(Ok(40), |r| r.parse())?;
    heap::start(heap::DEFAULT_PERIOD)?;
    let (mut alloc_a, mut alloc_b, mut inuse_b) = (0usize, 0usize, 0usize);
    let mut kept = Vec::with_capacity(rounds as usize * 3500);
    let mut i = 0u32;
    for _ in 0..rounds {
        for _ in 0..1000 {
            let n = size_at(i);
            for _ in 0..3 {
                kept.push(big_a(n));
                alloc_a += n;
            }
            let b = big_b(n);
            alloc_b += n;
            if i % 2 == 0 {
                drop(b);
            } else {
                kept.push(b);
                inuse_b += n;
            }
            i += 1;
        }
    }
    heap::profile().write_text(&mut std::fs::File::create(&out)?)?;
    println!("alloc a={alloc_a} b={alloc_b} inuse a={alloc_a} b={inuse_b}");
    // The same profile named in the program: the functions holding the most memory.
    heap::report().write_top(&mut std::io::stdout(), HeapValue::InuseSpace, 20)?;
    drop(black_box(kept));
    Ok(())
}
