//! `history`'s output: the table of epochs and the SVG line chart of the top functions' shares.

use crate::analysis::diff::Options;
use crate::analysis::history::{History, MIN_PAST};
use crate::render::markup::escape;
use std::fmt::Write as _;

impl History {
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
