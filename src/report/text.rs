//! A report as text: the top table (the layout of `cpuprof top` and `pprof -top`) and folded
//! stacks.

use super::Report;
use std::io::{self, Write};

pub fn write_top(out: &mut impl Write, report: &Report, n: usize) -> io::Result<()> {
    let total = report.total_samples();
    let percent = |count: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * count as f64 / total as f64
        }
    };
    match report.event() {
        Some(e) => writeln!(
            out,
            "Total: {total} samples ({} {} events at {} per sample)",
            total.saturating_mul(e.period),
            e.name,
            e.period
        )?,
        None => {
            let period_us = report.period().as_micros();
            let seconds = total as f64 * period_us as f64 / 1e6;
            writeln!(
                out,
                "Total: {total} samples ({seconds:.2} s at {period_us} us per sample)"
            )?
        }
    }
    if let Some(lost) = report.summary().map(|s| s.lost).filter(|&lost| lost > 0) {
        writeln!(out, "Lost: {lost} samples could not be stored (see Summary::lost)")?;
    }
    writeln!(
        out,
        "{:>8} {:>6} {:>6} {:>8} {:>6}  function",
        "flat", "flat%", "sum%", "cum", "cum%"
    )?;
    let mut sum = 0;
    for cost in report.top().into_iter().take(n) {
        sum += cost.flat;
        writeln!(
            out,
            "{:>8} {:>5.1}% {:>5.1}% {:>8} {:>5.1}%  {}",
            cost.flat,
            percent(cost.flat),
            percent(sum),
            cost.cumulative,
            percent(cost.cumulative),
            cost.function
        )?;
    }
    Ok(())
}

/// One line per sampled stack, outermost frame first, its thread's name before it when the
/// profile has threads; `;` in names becomes `:` (it separates frames).
pub fn folded_lines(report: &Report) -> Vec<String> {
    report
        .samples()
        .filter(|s| s.count() > 0)
        .map(|sample| {
            let mut frames: Vec<String> = sample.frames().map(|f| f.function.replace(';', ":")).collect();
            frames.reverse();
            if let Some(thread) = sample.thread() {
                let name = thread
                    .name
                    .map_or_else(|| format!("thread {}", thread.id), str::to_string);
                frames.insert(0, name.replace(';', ":"));
            }
            format!("{} {}", frames.join(";"), sample.count())
        })
        .collect()
}
