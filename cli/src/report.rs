//! Reports over a symbolised profile: top, flame graph, dump.

use crate::symbolize::Symbolizer;
use cpuprof::format::Profile;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::path::Path;

/// A sample's call chain as function names, outermost caller first (inlined frames expanded).
fn symbolised_stacks(profile: &Profile) -> Vec<(Vec<String>, u64)> {
    let mut symbolizer = Symbolizer::default();
    let mut cache: HashMap<u64, Vec<String>> = HashMap::new();
    profile
        .samples
        .iter()
        .map(|s| {
            let mut names = Vec::new();
            for (i, &pc) in s.pcs.iter().enumerate().rev() {
                // Return addresses point after the call; look up the call instruction itself.
                let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
                let frames = cache
                    .entry(addr)
                    .or_insert_with(|| symbolizer.functions(&profile.maps, addr));
                names.extend(frames.iter().rev().cloned());
            }
            (names, s.count)
        })
        .collect()
}

pub fn top(profile: &Profile, by_cum: bool, count: usize) -> String {
    let stacks = symbolised_stacks(profile);
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    let mut flat: HashMap<&str, u64> = HashMap::new();
    let mut cum: HashMap<&str, u64> = HashMap::new();
    for (names, c) in &stacks {
        if let Some(leaf) = names.last() {
            *flat.entry(leaf).or_default() += c;
        }
        let unique: HashSet<&str> = names.iter().map(String::as_str).collect();
        for name in unique {
            *cum.entry(name).or_default() += c;
        }
    }
    let mut rows: Vec<(&str, u64, u64)> = cum
        .iter()
        .map(|(&n, &c)| (n, flat.get(n).copied().unwrap_or(0), c))
        .collect();
    rows.sort_by(|a, b| {
        let key = |r: &(&str, u64, u64)| if by_cum { (r.2, r.1) } else { (r.1, r.2) };
        key(b).cmp(&key(a)).then(a.0.cmp(b.0))
    });
    let pct = |n: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * n as f64 / total as f64
        }
    };
    let seconds = total as f64 * profile.period_us as f64 / 1e6;
    let mut out = format!(
        "Total: {total} samples ({seconds:.2} s at {} us per sample)\n",
        profile.period_us
    );
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>6} {:>8} {:>6}  function",
        "flat", "flat%", "sum%", "cum", "cum%"
    );
    let mut sum = 0;
    for (name, f, c) in rows.into_iter().take(count) {
        sum += f;
        let _ = writeln!(
            out,
            "{f:>8} {:>5.1}% {:>5.1}% {c:>8} {:>5.1}%  {name}",
            pct(f),
            pct(sum),
            pct(c)
        );
    }
    out
}

pub fn flamegraph(profile: &Profile, output: &Path) -> Result<(), String> {
    let mut folded: HashMap<String, u64> = HashMap::new();
    for (names, c) in symbolised_stacks(profile) {
        let line = names.iter().map(|n| n.replace(';', ":")).collect::<Vec<_>>().join(";");
        *folded.entry(line).or_default() += c;
    }
    let lines: Vec<String> = folded.into_iter().map(|(k, v)| format!("{k} {v}")).collect();
    let file = std::fs::File::create(output).map_err(|e| format!("cannot create {}: {e}", output.display()))?;
    let mut options = inferno::flamegraph::Options::default();
    options.title = "CPU profile".into();
    options.count_name = "samples".into();
    inferno::flamegraph::from_lines(
        &mut options,
        lines.iter().map(String::as_str),
        std::io::BufWriter::new(file),
    )
    .map_err(|e| format!("cannot draw flame graph: {e}"))
}

pub fn dump(profile: &Profile) -> String {
    let mut out = format!(
        "format: {}\nperiod: {} us\nrecords: {}\n",
        profile.format, profile.period_us, profile.records
    );
    for s in &profile.samples {
        let pcs: Vec<String> = s.pcs.iter().map(|pc| format!("{pc:#x}")).collect();
        let _ = writeln!(out, "{:>8} {}", s.count, pcs.join(" "));
    }
    let _ = writeln!(out, "maps: {} entries", profile.maps.entries.len());
    for m in &profile.maps.entries {
        let _ = writeln!(out, "{:x}-{:x} {} {:08x} {}", m.start, m.end, m.perms, m.offset, m.path);
    }
    out
}
