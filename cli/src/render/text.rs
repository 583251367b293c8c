//! Reports over a symbolised profile: top, flame graph, dump.

use crate::error::{Error, Result};
use crate::model::stacks::{Functions, Stacks};
use cpuprof::format::Profile;
use std::fmt::Write;
use std::path::Path;

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
    let seconds = total as f64 * functions.period_us as f64 / 1e6;
    let mut out = format!(
        "Total: {total} samples ({seconds:.2} s at {} us per sample)\n",
        functions.period_us
    );
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
    options.title = "CPU profile".into();
    options.count_name = "samples".into();
    inferno::flamegraph::from_lines(
        &mut options,
        lines.iter().map(String::as_str),
        std::io::BufWriter::new(file),
    )
    .map_err(|e| Error::Input(format!("cannot draw flame graph: {e}")))
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
