//! `diff`'s table: the significant rows and the largest other changes, each with its intervals.

use crate::analysis::diff::{Effect, Options, Report, Row};
use crate::model::unit::Unit;
use crate::render::units;
use std::fmt::Write;

impl Report {
    /// The report: the significant rows and the largest other changes, each with its intervals.
    pub fn render(&self, opts: Options) -> String {
        let mut out = format!("{}\n", self.header);
        let factor = self.heading(opts, &mut out);
        let shown = self.significant().count() + opts.rows;
        for r in self.rows.iter().take(shown) {
            row(r, factor, &mut out);
        }
        self.footing(opts, &mut out);
        out
    }

    /// `value` in the unit of the profiles: CPU seconds (`1.234 s`), or the heap value (bytes
    /// as pprof prints them, or objects); `signed` with its sign.
    pub fn amount(&self, value: f64, signed: bool) -> String {
        // Bytes and objects are whole: a change that rounds to none has no sign.
        let sign = if signed && value.round() >= 0.0 {
            "+"
        } else if value.round() < 0.0 {
            "-"
        } else {
            ""
        };
        match self.unit {
            Unit::Samples if signed => format!("{value:+.3} s"),
            Unit::Samples => format!("{value:.3} s"),
            unit if unit.is_bytes() => format!("{sign}{}", units::bytes(value.abs().round() as u64)),
            unit if unit.is_nanoseconds() => format!("{sign}{}", units::nanoseconds(value.abs().round() as u64)),
            unit => format!("{sign}{:.0} {}", value.abs(), unit.counts()),
        }
    }

    /// The lines above the rows: how changes are judged, and the columns. Returns the factor
    /// from seconds (or the heap value) to the time columns' unit.
    fn heading(&self, opts: Options, out: &mut String) -> f64 {
        let level = 100.0 * opts.confidence;
        let what = if opts.cumulative { "cumulative" } else { "flat (self)" };
        let measure = match self.unit {
            Unit::Samples => "CPU time",
            unit => unit.name(),
        };
        let time_what = if self.per_unit {
            format!("{measure} per unit of work")
        } else {
            format!("{measure} per run")
        };
        let tested = if self.history {
            "share and time changes"
        } else {
            "share changes"
        };
        let _ = writeln!(
            out,
            "{what} share in % and {time_what}; changes with {level}% intervals; * significant at {} \
             family-wise (Holm over the {} of {} {tested} that could be)",
            opts.alpha, self.testable, self.tested
        );
        if self.unit.heap_value().is_some() {
            out.push_str(
                "observations: the sampled objects (a sampling heap profiler draws them like a Poisson process), \
                 each weighing what its line scales it to; shares are of Kish's effective number of them\n",
            );
        } else if self.unit.contention_value().is_some() {
            out.push_str(
                "observations: the waits (taken as a Poisson process), each weighing what its line gives it; \
                 shares are of Kish's effective number of them\n",
            );
        }
        let scale = self
            .rows
            .iter()
            .map(|r| r.time.before.abs().max(r.time.after.abs()))
            .fold(self.base_amount, f64::max);
        let (unit, factor) = amount_unit(self.unit, scale);
        let before = if self.history { "usual" } else { "before" };
        let _ = writeln!(
            out,
            "{before:>7} {:>7} {:>24}  {before:>8} {:>8} {:>27}  {:>7}  function",
            "now",
            "change [interval] pts",
            "now",
            format!("change [interval] {unit}"),
            "settle"
        );
        factor
    }

    /// The lines below the rows: what is significant, what would settle the rest, and how far
    /// the times can be trusted.
    fn footing(&self, opts: Options, out: &mut String) {
        let marked: Vec<String> = self
            .significant()
            .map(|r| {
                let grew = if r.share.significant {
                    r.share.change()
                } else {
                    r.time.change()
                } > 0.0;
                format!("{} {}", r.function, if grew { "grew" } else { "shrank" })
            })
            .collect();
        if marked.is_empty() {
            let _ = writeln!(
                out,
                "nothing is significant at {} family-wise; the largest changes are above, with their intervals.",
                opts.alpha
            );
        } else {
            let _ = writeln!(out, "significant: {}", marked.join(", "));
        }
        if let Some(r) = self.rows.iter().find(|r| r.settle.is_some_and(|k| k > 1.0)) {
            if self.unit != Unit::Samples {
                let _ = writeln!(
                    out,
                    "settle: how many times the samples (in both runs) would make a change of this size significant \
                     (|z| {:.1}), if it is real: {} needs {:.1}x, ~{:.0} {} per run (a smaller \
                     sampling period gives more).",
                    self.z_needed,
                    r.function,
                    r.settle.unwrap_or(1.0),
                    r.settle.unwrap_or(1.0) * self.base_run.0 as f64,
                    if self.unit.contention_value().is_some() {
                        "waits"
                    } else {
                        "sampled objects"
                    },
                );
            } else {
                let _ = writeln!(
                    out,
                    "settle: how many times the samples (in both runs) would make a change of this size significant \
                     (|z| {:.1}), if it is real: {} needs {:.1}x, ~{:.0} samples per run ({:.1} s of CPU at this \
                     frequency; faster than the kernel tick adds no observations, longer runs do).",
                    self.z_needed,
                    r.function,
                    r.settle.unwrap_or(1.0),
                    r.settle.unwrap_or(1.0) * self.base_run.0 as f64,
                    r.settle.unwrap_or(1.0) * self.base_run.1,
                );
            }
        }
        if self.history {
            out.push_str("history: a change is judged against the runs' spread beyond their sampling error.\n");
        } else if self.unit != Unit::Samples {
            let _ = writeln!(
                out,
                "{}: the totals were {} and {} ({}); intervals are sampling error only, the totals' \
                 run-to-run noise needs repeated runs (--history).",
                self.unit.name(),
                self.amount(self.base_amount, false),
                self.amount(self.new_amount, false),
                self.total_growth()
                    .map_or("from nothing".to_string(), |g| format!("{g:+.1}%"))
            );
        } else {
            let _ = writeln!(
                out,
                "time: the totals were {:.3} s and {:.3} s ({}); time intervals are sampling error only, \
                 the totals' run-to-run noise needs repeated runs (--history).",
                self.base_amount,
                self.new_amount,
                self.total_growth()
                    .map_or("from nothing".to_string(), |g| format!("{g:+.1}%"))
            );
        }
    }
}

/// One function's row: shares and times before and after, each change with its interval and
/// `*` when significant, and what would settle it.
fn row(r: &Row, factor: f64, out: &mut String) {
    let mark = |e: &Effect| if e.significant { '*' } else { ' ' };
    let t = |v: f64| v * factor;
    let settle = match r.settle {
        Some(k) if k > 1000.0 => ">1000x".to_string(),
        Some(k) if k > 1.0 => format!("{k:.1}x"),
        _ => "-".to_string(),
    };
    let _ = writeln!(
        out,
        "{:>6.1}% {:>6.1}% {:>+7.1} [{:>+6.1}, {:>+6.1}]{}  {:>8.3} {:>8.3} {:>+8.3} [{:>+7.3}, {:>+7.3}]{}  {settle:>7}  {}",
        r.share.before,
        r.share.after,
        r.share.change(),
        r.share.low,
        r.share.high,
        mark(&r.share),
        t(r.time.before),
        t(r.time.after),
        t(r.time.change()),
        t(r.time.low),
        t(r.time.high),
        mark(&r.time),
        r.function
    );
}

/// The unit the time (or heap value) columns are printed in, for values up to `scale`, and
/// the factor to it.
fn amount_unit(unit: Unit, scale: f64) -> (&'static str, f64) {
    match unit {
        Unit::Samples => time_unit(scale),
        unit if unit.is_bytes() => {
            let (name, bytes) = units::bytes_unit(scale as u64);
            (name, 1.0 / bytes)
        }
        unit if unit.is_nanoseconds() => {
            let (name, ns) = time_unit(scale / 1e9);
            (name, 1e-9 * ns)
        }
        Unit::Contention { .. } if scale >= 1e6 => ("M waits", 1e-6),
        Unit::Contention { .. } if scale >= 1e3 => ("k waits", 1e-3),
        Unit::Contention { .. } => ("waits", 1.0),
        _ if scale >= 1e6 => ("M objects", 1e-6),
        _ if scale >= 1e3 => ("k objects", 1e-3),
        _ => ("objects", 1.0),
    }
}

/// The unit the time columns are printed in, for values up to `scale` seconds.
fn time_unit(scale: f64) -> (&'static str, f64) {
    if scale >= 1.0 {
        ("s", 1.0)
    } else if scale >= 1e-3 {
        ("ms", 1e3)
    } else {
        ("us", 1e6)
    }
}
