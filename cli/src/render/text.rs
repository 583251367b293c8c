//! Reports over a symbolised profile: top, flame graph, dump.

use crate::error::{Error, Result};
use crate::input::heap;
use crate::model::stacks::{Functions, Stacks};
use crate::model::unit::Unit;
use crate::render::units::{self, Scale};
use cpuprof::format::contention::View;
use cpuprof::format::heap::{HeapCounts, HeapKind, HeapProfile};
use cpuprof::format::{EventLine, Profile};
use std::collections::HashSet;
use std::fmt::Write;
use std::path::Path;

/// The first line of a CPU or event profile's report: its samples and what they stand for.
pub fn total_line(total: u64, period: u64, event: Option<&EventLine>) -> String {
    match event {
        Some(e) => format!(
            "Total: {total} samples ({} {} events at {} per sample)\n",
            total.saturating_mul(e.period),
            e.name,
            e.period
        ),
        None => format!(
            "Total: {total} samples ({:.2} s at {period} us per sample)\n",
            total as f64 * period as f64 / 1e6
        ),
    }
}

pub fn top(functions: &Functions, by_cum: bool, count: usize) -> String {
    let total = functions.total;
    let mut rows: Vec<(usize, &str, u64, u64)> = functions
        .counts
        .iter()
        .enumerate()
        .map(|(i, (n, c))| (i, n.as_str(), c.flat, c.cum))
        .collect();
    rows.sort_by(|a, b| {
        let key = |r: &(usize, &str, u64, u64)| if by_cum { (r.3, r.2) } else { (r.2, r.3) };
        key(b).cmp(&key(a)).then(a.1.cmp(b.1))
    });
    let pct = |n: u64| percent(n, total);
    if functions.unit != Unit::Samples {
        return heap_top(functions, &rows[..rows.len().min(count)]);
    }
    let mut out = total_line(total, functions.period_us, functions.event.as_ref());
    if let Some(kept) = functions.kept {
        let _ = writeln!(
            out,
            "Filters kept {kept} samples ({:.1}% of the total, which percentages are of)",
            pct(kept)
        );
    }
    let states = functions.states.as_deref();
    if states.is_some() {
        out.push_str(
            "Thread states: each function's cumulative samples on a CPU, runnable (waiting for one) and \
             blocked, with the system call most of them waited in\n",
        );
    }
    let _ = write!(
        out,
        "{:>8} {:>6} {:>6} {:>8} {:>6}  ",
        "flat", "flat%", "sum%", "cum", "cum%"
    );
    if states.is_some() {
        let _ = write!(out, "{:>6} {:>8} {:>7} {:<16} ", "on-CPU", "runnable", "blocked", "in");
    }
    out.push_str("function\n");
    let mut sum = 0u64;
    for (i, name, f, c) in rows.into_iter().take(count) {
        sum = sum.saturating_add(f);
        let _ = write!(
            out,
            "{f:>8} {:>5.1}% {:>5.1}% {c:>8} {:>5.1}%  ",
            pct(f),
            pct(sum),
            pct(c)
        );
        if let Some(split) = states.and_then(|s| s.get(i)) {
            let of = |n: u64| percent(n, c);
            let _ = write!(
                out,
                "{:>5.1}% {:>7.1}% {:>6.1}% {:<16} ",
                of(split.on_cpu),
                of(split.runnable),
                of(split.blocked),
                split.main_wait().unwrap_or("-")
            );
        }
        let _ = writeln!(out, "{name}");
    }
    out
}

/// `top` of a heap profile: the rows (index, name, flat, cum) in bytes or objects, in one unit
/// chosen as pprof chooses it, so the total reads as `go tool pprof -top` prints it.
fn heap_top(functions: &Functions, rows: &[(usize, &str, u64, u64)]) -> String {
    let (unit, total) = (functions.unit, functions.total);
    let smallest = rows
        .iter()
        .map(|&(_, _, f, c)| if f > 0 { f } else { c })
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(0);
    let scale = Scale::for_table(unit, smallest, total);
    let mut out = heap_heading(unit);
    let _ = writeln!(out, "Total: {} {}", scale.label(total), unit.name());
    if let Some(kept) = functions.kept {
        let _ = writeln!(
            out,
            "Filters kept {} ({:.1}% of the total, which percentages are of)",
            scale.label(kept),
            percent(kept, total)
        );
    }
    let _ = writeln!(
        out,
        "{:>10} {:>6} {:>6} {:>10} {:>6}  function",
        "flat", "flat%", "sum%", "cum", "cum%"
    );
    let mut sum = 0u64;
    for &(_, name, f, c) in rows {
        sum = sum.saturating_add(f);
        let _ = writeln!(
            out,
            "{:>10} {:>5.1}% {:>5.1}% {:>10} {:>5.1}%  {name}",
            scale.label(f),
            percent(f, total),
            percent(sum, total),
            scale.label(c),
            percent(c, total)
        );
    }
    out
}

/// The line that says what a heap or contention profile's counts are.
pub fn heap_heading(unit: Unit) -> String {
    if let Unit::Contention { value, view } = unit {
        let charged = match view {
            View::Waiters => "threads' waits for locks and semaphores, charged to the waiter",
            View::Holders => "threads' waits for locks, charged to the holder that released the lock",
        };
        return format!("Contention profile: {} ({charged})\n", value.name());
    }
    let Unit::Heap { value, period } = unit else {
        return String::new();
    };
    let sampling = if period > 1 {
        format!(
            "sampled every {} on average, each line scaled back as pprof does",
            units::bytes(period)
        )
    } else {
        "every allocation recorded".to_string()
    };
    format!("Heap profile: {} ({sampling})\n", value.name())
}

pub fn percent(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * n as f64 / total as f64
    }
}

pub fn flamegraph(stacks: &Stacks, output: &Path) -> Result<()> {
    let lines = stacks.folded();
    let file = std::fs::File::create(output).map_err(|e| Error::create(output, e))?;
    let mut options = inferno::flamegraph::Options::default();
    match stacks.unit {
        Unit::Samples => {
            options.title = "CPU profile".into();
            options.count_name = "samples".into();
        }
        Unit::Heap { value, .. } => {
            options.title = format!("Heap profile: {}", value.name());
            options.count_name = stacks.unit.counts().into();
        }
        Unit::Contention { value, view } => {
            options.title = format!("Contention profile: {}, charged to the {}", value.name(), view.name());
            options.count_name = stacks.unit.counts().into();
        }
    }
    inferno::flamegraph::from_lines(
        &mut options,
        lines.iter().map(String::as_str),
        std::io::BufWriter::new(file),
    )
    .map_err(|e| Error::Input(format!("cannot draw flame graph: {e}")))
}

/// What `check` says of a heap profile: how it was sampled, its lines and mappings, and its
/// totals as written (sampled) and scaled back line by line (what readers show).
pub fn heap_check(profile: &HeapProfile) -> String {
    let sampled = profile.totals();
    let scaled = profile.records.iter().fold(HeapCounts::default(), |sum, r| {
        sum.plus(heap::scaled(profile, r.counts))
    });
    let sampling = match (profile.kind, profile.period) {
        (HeapKind::Growth, _) => "growth profile (not sampled)".to_string(),
        (HeapKind::Heap, period) if period > 1 => {
            format!(
                "heap profile, sampled every {} ({period} bytes) on average",
                units::bytes(period)
            )
        }
        (HeapKind::Heap, _) => "heap profile, every allocation recorded".to_string(),
    };
    let distinct: HashSet<&[u64]> = profile.records.iter().map(|r| r.stack.as_slice()).collect();
    format!(
        "{sampling}, {} line{}, {} distinct stacks, {} mappings; in use: {} objects, {} ({} objects, {} bytes \
         sampled); allocated: {} objects, {} ({} objects, {} bytes sampled)",
        profile.records.len(),
        if profile.records.len() == 1 { "" } else { "s" },
        distinct.len(),
        profile.maps().entries.len(),
        scaled.inuse_objects,
        units::bytes(scaled.inuse_bytes),
        sampled.inuse_objects,
        sampled.inuse_bytes,
        scaled.alloc_objects,
        units::bytes(scaled.alloc_bytes),
        sampled.alloc_objects,
        sampled.alloc_bytes,
    )
}

pub fn dump(profile: &Profile) -> String {
    let mut out = format!(
        "format: {}\nperiod: {} us\nrecords: {}\n",
        profile.format, profile.period_us, profile.records
    );
    if let Some(p) = &profile.maps.process {
        let origin = if p.forked {
            "forked from a profiled parent"
        } else {
            "started"
        };
        let _ = writeln!(
            out,
            "process: pid {}, parent {}, {origin}\ncommand: {}",
            p.pid,
            p.ppid,
            p.command_line()
        );
    }
    for s in &profile.samples {
        let pcs: Vec<String> = s.pcs.iter().map(|pc| format!("{pc:#x}")).collect();
        let _ = writeln!(out, "{:>8} {}", s.count, pcs.join(" "));
    }
    let _ = writeln!(out, "maps: {} entries", profile.maps.entries.len());
    for m in &profile.maps.entries {
        let _ = write!(out, "{:x}-{:x} {} {:08x} {}", m.start, m.end, m.perms, m.offset, m.path);
        let _ = match &m.build_id {
            Some(id) => writeln!(out, " build-id={id}"),
            None => writeln!(out),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpuprof::format::heap::HeapValue;

    #[test]
    fn top_of_a_heap_profile_reads_as_pprof_prints_it() {
        let mut stacks = Stacks::new(0);
        stacks.unit = Unit::Heap {
            value: HeapValue::InuseSpace,
            period: 524288,
        };
        // go tool pprof -top of tests' 3:1 heap profile: 150.15MB and 50.05MB of 200.20MB.
        stacks.push(["main", "grow_big"], 157440050);
        stacks.push(["main", "grow_small"], 52480016);
        let text = top(&stacks.functions(), false, 10);
        assert_eq!(
            text,
            "Heap profile: inuse_space (sampled every 512kB on average, each line scaled back as pprof does)\n\
             Total: 200.20MB inuse_space\n      \
             flat  flat%   sum%        cum   cum%  function\n  \
             150.15MB  75.0%  75.0%   150.15MB  75.0%  grow_big\n   \
             50.05MB  25.0% 100.0%    50.05MB  25.0%  grow_small\n         \
             0   0.0% 100.0%   200.20MB 100.0%  main\n"
        );
        stacks.unit = Unit::Heap {
            value: HeapValue::AllocObjects,
            period: 1,
        };
        let text = top(&stacks.functions(), true, 1);
        assert!(
            text.starts_with(
                "Heap profile: alloc_objects (every allocation recorded)\nTotal: 209920066 alloc_objects\n"
            ),
            "{text}"
        );
        assert!(text.ends_with(" 209920066 100.0%  main\n"), "{text}");
    }
}
