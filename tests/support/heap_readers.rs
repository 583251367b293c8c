//! Reading heap profiles of `tests/c/heap_known.c` with google-pprof: its truth line, the
//! bytes per function, and the ±5 % the known answer allows.

use super::run_ok;
use std::collections::HashMap;
use std::path::Path;

/// The truth the program printed: (alloc a, alloc b, inuse a, inuse b) in bytes.
pub fn truth(stdout: &[u8]) -> [f64; 4] {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().find(|l| l.starts_with("alloc ")).expect("the truth line");
    let numbers: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(_, v)| v.parse::<f64>().unwrap()))
        .collect();
    [numbers[0], numbers[1], numbers[2], numbers[3]]
}

pub fn assert_within(what: &str, measured: f64, truth: f64) {
    let error = (measured - truth) / truth;
    assert!(
        error.abs() <= 0.05,
        "{what}: {measured:.0} bytes measured, {truth:.0} allocated ({:+.1} %)",
        error * 100.0
    );
}

/// Function name -> bytes, from a pprof-style table (`flat flat% sum% cum cum% name`, values
/// in MB or with units) at column `col`.
pub fn megabytes(table: &str, col: usize) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in table.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 6 || !cols[1].ends_with('%') {
            continue;
        }
        let value = cols[col];
        let (number, scale) = match value.trim_end_matches(char::is_alphabetic) {
            n if value.ends_with("GB") => (n, 1024.0 * 1024.0 * 1024.0),
            n if value.ends_with("MB") => (n, 1024.0 * 1024.0),
            n if value.ends_with("kB") => (n, 1024.0),
            n if value.ends_with('B') => (n, 1.0),
            // google-pprof: plain MB.
            n => (n, 1024.0 * 1024.0),
        };
        if let Ok(n) = number.parse::<f64>() {
            let name = cols[5..].join(" ");
            let short = name.rsplit("::").next().unwrap_or(&name).to_string();
            out.entry(short).or_insert(n * scale);
        }
    }
    out
}

pub fn google_pprof_bytes(binary: &Path, profile: &Path, value: &str, col: usize) -> HashMap<String, f64> {
    let out = run_ok(
        Path::new("google-pprof"),
        &[
            "--text",
            "--cum",
            &format!("--{value}"),
            binary.to_str().unwrap(),
            profile.to_str().unwrap(),
        ],
        &[],
    );
    megabytes(&String::from_utf8_lossy(&out.stdout), col)
}
