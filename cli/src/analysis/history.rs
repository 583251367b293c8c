//! `cpuprof history`: one program's epochs in a profile database, each epoch's samples and its
//! top functions' shares, as a table and an SVG line chart, with the epochs where a function
//! left its usual range flagged.
//!
//! **Which statistics.** Each epoch is judged as `diff --history` judges a new profile: against
//! the mean of the epochs before it (the last `window` of them, at least `MIN_PAST`), their
//! spread beyond sampling estimated from those epochs, with Holm's correction over the
//! functions. Only shares are flagged: an epoch's CPU time is how busy the program was (the
//! night's traffic against the day's), not how its code behaves, so time effects are tested (as
//! `diff` does, counting in Holm's correction) but never flag.
//!
//! **Multiple testing across epochs.** A history of E judged epochs is E families of tests:
//! each at `alpha` would flag some noise somewhere in a long history. The level is divided
//! among the epochs (Bonferroni, `alpha / E`), so `alpha` bounds the chance that anything in the
//! whole table is flagged when nothing changed. Bonferroni rather than a sequential scheme:
//! the epochs' tests share their baselines (dependent), which Bonferroni does not mind, and its
//! price is small, a factor E on p-values that a real change makes tiny.
//!
//! After a change, the next epochs' baselines mix both versions: their spread grows and the
//! change stops being flagged once the window holds enough of the new version to make it usual.

use crate::analysis::diff::{self, Options, Summary};
use crate::model::stacks::Stacks;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Epochs before one that are needed to judge it: two make a spread, a third makes it less wild.
pub const MIN_PAST: usize = 3;

/// A share (percent) at or above which, in every epoch, a function is a root of every stack.
const ROOT_SHARE: f64 = 100.0;

/// One epoch as read.
pub struct Epoch {
    pub name: String,
    pub processes: usize,
    pub stacks: Stacks,
    pub records: usize,
    pub weights: Option<cpuprof::format::SignalWeights>,
}

/// A function that left its usual range in one epoch.
pub struct Flag {
    pub epoch: usize,
    pub function: String,
    /// The epochs' mean share before, and this epoch's (percent).
    pub usual: f64,
    pub share: f64,
    /// The change's interval (points) and Holm-adjusted p-value (within the epoch).
    pub low: f64,
    pub high: f64,
    pub adjusted: f64,
}

pub struct History {
    pub epochs: Vec<(String, usize, u64)>,
    /// The functions shown, and their share (percent) in each epoch.
    pub columns: Vec<(String, Vec<f64>)>,
    pub flags: Vec<Flag>,
    pub judged: usize,
    pub per_epoch_alpha: f64,
    /// Functions left out of the columns for being in every sample of every epoch.
    pub roots: usize,
}

/// Judges every epoch with at least [`MIN_PAST`] before it against the last `window` of those.
pub fn history(epochs: &[Epoch], opts: Options, window: usize, count: usize, tick_us: u64) -> History {
    let summaries: Vec<Summary> = epochs
        .iter()
        .map(|e| Summary::new(&e.stacks, e.records, e.weights, 1.0, opts.cumulative, tick_us))
        .collect();
    let judged = epochs.len().saturating_sub(MIN_PAST);
    let per_epoch = Options {
        alpha: opts.alpha / judged.max(1) as f64,
        ..opts
    };
    let mut flags = Vec::new();
    for i in MIN_PAST..epochs.len() {
        let past = &summaries[i.saturating_sub(window.max(MIN_PAST))..i];
        let report = diff::against_history(past, &summaries[i], String::new(), per_epoch);
        for row in report.rows.iter().filter(|r| r.share.significant) {
            flags.push(Flag {
                epoch: i,
                function: row.function.clone(),
                usual: row.share.before,
                share: row.share.after,
                low: row.share.low,
                high: row.share.high,
                adjusted: row.share.adjusted,
            });
        }
    }
    let shares: Vec<HashMap<String, f64>> = epochs
        .iter()
        .map(|e| {
            let total = e.stacks.total();
            e.stacks
                .per_function()
                .into_iter()
                .map(|(name, c)| {
                    let n = if opts.cumulative { c.cum } else { c.flat };
                    (name.to_string(), crate::render::text::percent(n, total))
                })
                .collect()
        })
        .collect();
    // The functions with the largest mean share, then any flagged one not among them. Those
    // in every sample of every epoch (cumulatively: _start, main, ...) would fill the columns
    // with 100 % and can never change: they are counted, not shown.
    let mut mean: BTreeMap<&str, f64> = BTreeMap::new();
    for s in &shares {
        for (name, v) in s {
            *mean.entry(name).or_default() += v;
        }
    }
    let everywhere = |name: &str| shares.iter().all(|s| s.get(name).is_some_and(|v| *v >= ROOT_SHARE));
    let roots = mean.keys().filter(|n| everywhere(n)).count();
    let mut ranked: Vec<(&str, f64)> = mean.into_iter().filter(|(n, _)| !everywhere(n)).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let mut names: Vec<String> = ranked.iter().take(count).map(|(n, _)| n.to_string()).collect();
    for f in &flags {
        if !names.contains(&f.function) {
            names.push(f.function.clone());
        }
    }
    let columns = names
        .into_iter()
        .map(|name| {
            let series = shares.iter().map(|s| s.get(&name).copied().unwrap_or(0.0)).collect();
            (name, series)
        })
        .collect();
    History {
        epochs: epochs
            .iter()
            .map(|e| (e.name.clone(), e.processes, e.stacks.total()))
            .collect(),
        columns,
        flags,
        judged,
        per_epoch_alpha: per_epoch.alpha,
        roots,
    }
}

impl History {
    fn flagged(&self, epoch: usize, function: &str) -> Option<&Flag> {
        self.flags.iter().find(|f| f.epoch == epoch && f.function == function)
    }

    /// The table: one row per epoch, one column per function (legend below), `*` on flags,
    /// then each flag with its numbers.
    pub fn table(&self, opts: Options, window: usize) -> String {
        let what = if opts.cumulative { "cumulative" } else { "flat (self)" };
        let mut out = format!(
            "{} epochs; {what} share (%) of each epoch's samples; * = left its usual range\n",
            self.epochs.len()
        );
        // 16 characters, 20 for epochs named with milliseconds.
        let width = self.epochs.iter().map(|(name, ..)| name.len()).max().unwrap_or(16);
        let _ = write!(out, "{:<width$} {:>9} {:>9}", "epoch", "processes", "samples");
        for i in 0..self.columns.len() {
            let _ = write!(out, " {:>7}", format!("F{}", i + 1));
        }
        out.push('\n');
        for (e, (name, processes, samples)) in self.epochs.iter().enumerate() {
            let _ = write!(out, "{name:<width$} {processes:>9} {samples:>9}");
            for (function, series) in &self.columns {
                let mark = if self.flagged(e, function).is_some() { "*" } else { " " };
                let _ = write!(out, " {:>6.1}{mark}", series[e]);
            }
            out.push('\n');
        }
        out.push('\n');
        for (i, (function, _)) in self.columns.iter().enumerate() {
            let _ = writeln!(out, "F{:<3} {function}", i + 1);
        }
        if self.roots > 0 {
            let _ = writeln!(
                out,
                "({} functions in every sample of every epoch not shown)",
                self.roots
            );
        }
        let _ = writeln!(
            out,
            "\nEach epoch after the first {MIN_PAST} is judged against the {window} before it (fewer at the start), as diff --history judges a profile;\n\
             alpha {} over the whole history (Bonferroni over {} epochs judged: {:.2e} each, Holm over the functions within one).",
            opts.alpha, self.judged, self.per_epoch_alpha
        );
        if self.flags.is_empty() {
            out.push_str("No function left its usual range.\n");
        }
        for f in &self.flags {
            let _ = writeln!(
                out,
                "{}  {}: {:.1}% (usual {:.1}%), change {:+.1} points [{:+.1}, {:+.1}], adjusted p {:.1e}",
                self.epochs[f.epoch].0,
                f.function,
                f.share,
                f.usual,
                f.share - f.usual,
                f.low,
                f.high,
                f.adjusted
            );
        }
        out
    }

    /// A line chart of the shares over the epochs, flags circled in red (hover for numbers).
    pub fn svg(&self) -> String {
        const PALETTE: [&str; 10] = [
            "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
            "#393b79",
        ];
        let (width, height, left, right, top, bottom) = (900.0, 420.0, 60.0, 260.0, 30.0, 60.0);
        let plot_w = width - left - right;
        let plot_h = height - top - bottom;
        let peak = self
            .columns
            .iter()
            .flat_map(|(_, s)| s.iter().copied())
            .fold(0.0f64, f64::max);
        let y_max = ((peak / 10.0).ceil() * 10.0).clamp(10.0, 100.0);
        let n = self.epochs.len();
        let x = |i: usize| {
            left + if n > 1 {
                plot_w * i as f64 / (n - 1) as f64
            } else {
                plot_w / 2.0
            }
        };
        let y = |v: f64| top + plot_h * (1.0 - v / y_max);
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        for k in 0..=5 {
            let v = y_max * k as f64 / 5.0;
            let _ = writeln!(
                out,
                "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}%</text>",
                left + plot_w,
                y(v),
                y(v),
                left - 6.0,
                y(v) + 4.0
            );
        }
        let step = n.div_ceil(8).max(1);
        for i in (0..n).step_by(step) {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x(i),
                top + plot_h + 18.0,
                escape(&self.epochs[i].0)
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">epoch (UTC start)</text>",
            left + plot_w / 2.0,
            height - 12.0
        );
        for (c, (function, series)) in self.columns.iter().enumerate() {
            let colour = PALETTE[c % PALETTE.len()];
            let points: Vec<String> = series
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
                .collect();
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"><title>{}</title></polyline>",
                points.join(" "),
                escape(function)
            );
            for (i, v) in series.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{colour}\"><title>{} {}: {v:.1}%</title></circle>",
                    x(i),
                    y(*v),
                    escape(&self.epochs[i].0),
                    escape(function)
                );
            }
            let ly = top + 16.0 * c as f64;
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                left + plot_w + 16.0,
                ly + 4.0,
                left + plot_w + 32.0,
                ly + 9.0,
                escape(&shorten(function, 34))
            );
        }
        for f in &self.flags {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"none\" stroke=\"red\" stroke-width=\"2\"><title>{} {}: {:.1}% (usual {:.1}%)</title></circle>",
                x(f.epoch),
                y(f.share),
                escape(&self.epochs[f.epoch].0),
                escape(&f.function),
                f.share,
                f.usual
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

fn shorten(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        return name.to_string();
    }
    let kept: String = name.chars().take(max - 1).collect();
    format!("{kept}…")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
