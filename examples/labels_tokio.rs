//! Labels that follow async tasks across a multi-thread runtime's threads (`tests/labels.rs`):
//! eight tasks, four labelled `endpoint=/a` doing 7 units of work per round and four
//! `endpoint=/b` doing 3, each yielding after every unit so the runtime's four workers trade
//! them: /a holds 70 % of the labelled CPU time, /b 30 %. Profiled at 1000 Hz with the Rust API,
//! each sample naming its thread too.
//!
//! Usage: labels_tokio PROFILE [CPU SECONDS, default 3]

use cpuprof::labels::{LabelSet, WithLabels};
use std::time::Instant;

/// Iterations of one unit of work (~10 us).
const UNIT: u64 = 6000;

#[inline(never)]
fn serve() {
    let mut x = std::hint::black_box(1u64);
    for _ in 0..UNIT {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    }
    std::hint::black_box(x);
}

async fn requests(units: u32, rounds: u64) {
    for _ in 0..rounds {
        for _ in 0..units {
            serve();
            tokio::task::yield_now().await;
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: labels_tokio PROFILE [SECONDS]")?;
    let seconds: f64 = args.next().map_or(Ok(3.0), |s| s.parse())?;
    // Rounds for about `seconds` of CPU: four pairs of tasks, 10 units a round each.
    let start = Instant::now();
    for _ in 0..200 {
        serve();
    }
    let unit = start.elapsed().as_secs_f64() / 200.0;
    let rounds = (seconds / (40.0 * unit)).max(1.0) as u64;
    let a = LabelSet::new(&[("endpoint", "/a")]);
    let b = LabelSet::new(&[("endpoint", "/b")]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).build()?;
    // Each sample also names its thread: the test sees the tasks move.
    let guard = cpuprof::Profiler::builder()
        .frequency(1000)
        .thread_labels(true)
        .start(&path)?;
    runtime.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (set, units) = if i % 2 == 0 { (a, 7) } else { (b, 3) };
                tokio::spawn(requests(units, rounds).with_labels(set))
            })
            .collect();
        for task in tasks {
            task.await.expect("a task panicked");
        }
    });
    guard.stop()?;
    println!("ok");
    Ok(())
}
