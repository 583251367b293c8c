//! `history`'s output: the table of epochs and the SVG line chart of the top functions' shares.

use crate::analysis::diff::Options;
use crate::analysis::history::{History, MIN_PAST};
use crate::render::markup::escape;
use std::fmt::Write as _;

const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
];
/// The chart's size and margins (pixels): the legend sits in the right margin.
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 60.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;

/// Where epoch `i` and share `v` (percent) fall on the chart.
struct Chart {
    epochs: usize,
    y_max: f64,
}

impl Chart {
    fn x(&self, i: usize) -> f64 {
        LEFT + if self.epochs > 1 {
            PLOT_W * i as f64 / (self.epochs - 1) as f64
        } else {
            PLOT_W / 2.0
        }
    }

    fn y(&self, v: f64) -> f64 {
        TOP + PLOT_H * (1.0 - v / self.y_max)
    }
}

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
        let peak = self
            .columns
            .iter()
            .flat_map(|(_, s)| s.iter().copied())
            .fold(0.0f64, f64::max);
        let chart = Chart {
            epochs: self.epochs.len(),
            y_max: ((peak / 10.0).ceil() * 10.0).clamp(10.0, 100.0),
        };
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        self.axes(&chart, &mut out);
        for (c, (function, series)) in self.columns.iter().enumerate() {
            self.series(&chart, c, function, series, &mut out);
        }
        for f in &self.flags {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"none\" stroke=\"red\" stroke-width=\"2\"><title>{} {}: {:.1}% (usual {:.1}%)</title></circle>",
                chart.x(f.epoch),
                chart.y(f.share),
                escape(&self.epochs[f.epoch].0),
                escape(&f.function),
                f.share,
                f.usual
            );
        }
        out.push_str("</svg>\n");
        out
    }

    /// The grid with its percentages, and the epochs' names along the bottom.
    fn axes(&self, chart: &Chart, out: &mut String) {
        for k in 0..=5 {
            let v = chart.y_max * k as f64 / 5.0;
            let _ = writeln!(
                out,
                "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}%</text>",
                LEFT + PLOT_W,
                chart.y(v),
                chart.y(v),
                LEFT - 6.0,
                chart.y(v) + 4.0
            );
        }
        let n = self.epochs.len();
        let step = n.div_ceil(8).max(1);
        for i in (0..n).step_by(step) {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                chart.x(i),
                TOP + PLOT_H + 18.0,
                escape(&self.epochs[i].0)
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">epoch (UTC start)</text>",
            LEFT + PLOT_W / 2.0,
            HEIGHT - 12.0
        );
    }

    /// Function `c`'s line, its points, and its entry in the legend.
    fn series(&self, chart: &Chart, c: usize, function: &str, series: &[f64], out: &mut String) {
        let colour = PALETTE[c % PALETTE.len()];
        let points: Vec<String> = series
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", chart.x(i), chart.y(*v)))
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
                chart.x(i),
                chart.y(*v),
                escape(&self.epochs[i].0),
                escape(function)
            );
        }
        let ly = TOP + 16.0 * c as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + PLOT_W + 16.0,
            ly + 4.0,
            LEFT + PLOT_W + 32.0,
            ly + 9.0,
            escape(&shorten(function, 34))
        );
    }
}

/// `name` cut to `max` characters, an ellipsis marking the cut.
fn shorten(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        return name.to_string();
    }
    let kept: String = name.chars().take(max - 1).collect();
    format!("{kept}…")
}
