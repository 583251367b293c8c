//! What changed between profiles, how large the change may be, and whether it is real.
//!
//! For every function, two effects: the change in its share of the profile, and the change in
//! its CPU time (samples x period, per unit of work when the runs' units are given). Shares
//! compare runs of different lengths fairly; times say what a change costs, and (against a
//! history, which shows how much totals vary) catch a version slower everywhere, where every
//! share stays put.
//!
//! **Intervals.** A share is a proportion of the profile's independent observations (see
//! [`observations`]). Each profile's share gets a Wilson score interval, and a change gets
//! Newcombe's interval built from the two (the MOVER construction, weighted by each run's CPU
//! time for the change in time). Unlike the plain "estimate +- 1.96 standard errors", these keep
//! their coverage at the small counts a short profile has, and at zero counts: a function absent
//! from one profile still gets an honest interval.
//!
//! **Significance.** Each share change (and against a history, each time change too) is tested
//! with a score test (the variance taken under "no change"). A profile has hundreds of
//! functions, so testing each at 5 % would flag some noise in every diff. The p-values are corrected with Holm's step-down method, which bounds the
//! chance of marking *anything* when nothing changed (the family-wise error rate, `alpha`).
//! Holm rather than Benjamini-Hochberg: a CI gate fails the build on a single mark, so what
//! must be bounded is the chance of one false mark, not the share of false marks among many;
//! and Holm holds under any dependence, while shares are negatively dependent (what one function
//! gains, the others lose), outside what Benjamini-Hochberg is proven for. Holm's price, testing
//! hundreds of functions, is softened with Tarone's rule: a function with a handful of samples
//! cannot reach significance however they split between the runs, so it does not count towards
//! the correction (its smallest possible p-value is above the level).
//!
//! A change that is large but not significant is shown with its interval and with how many
//! times the samples would make it significant if it is real: never a bare "no change".

use crate::model::stacks::Stacks;
use cpuprof::format::SignalWeights;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;
use std::str::FromStr;

/// How `diff` reads and judges profiles.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Compare cumulative instead of flat (self) samples.
    pub cumulative: bool,
    /// The family-wise error rate: the chance that anything is marked when nothing changed.
    pub alpha: f64,
    /// The coverage of the intervals shown (each on its own, not corrected).
    pub confidence: f64,
    /// Rows shown besides the significant ones, largest changes first.
    pub rows: usize,
}

/// How many independent looks at the stack a profile's samples stand for.
///
/// A sample may count for several periods: the default timer (a POSIX CPU timer per thread)
/// only expires on the kernel's tick (250 Hz on Debian kernels, 4 ms) and weighs each signal by
/// the periods it covers (`1 + si_overrun`). At 1000 Hz a count of 1000 is ~250 looks on a quiet
/// machine; counted as 1000, every interval would be half as wide as the data allow, and a
/// second run of the same program would be flagged as changed. On a busy machine there are
/// fewer: a thread competing for the CPU sees fewer ticks than its CPU time spans (26-77 signals
/// for 0.3 s under a loop of short-lived processes, instead of ~75), each weighing more.
///
/// cpuprof's profiles record their signals' weights (`# signal-weights`, see
/// `cpuprof::format::signal_weights`), which give the effective number of observations of the
/// weighted samples exactly, `(sum w)^2 / sum w^2`, whatever the timer and the load: that is
/// used when present. Otherwise (gperftools' files, files cut short) it is modelled.
pub fn observations(total: u64, period_us: u64, records: usize, tick_us: u64, recorded: Option<SignalWeights>) -> f64 {
    let effective = recorded
        .filter(|w| w.sum > 0)
        .and_then(|w| Some((w.effective_observations()?, w.sum)));
    match effective {
        // Rescaled to the samples the file holds: samples lost to a full table are in the
        // weights but not in the records.
        Some((n, weighed)) => (n * total as f64 / weighed as f64).min(total as f64),
        None => modelled_observations(total, period_us, records, tick_us),
    }
}

/// The model for files without signal weights: each sample is worth `period / tick`
/// observations, never more than one. Measured on 20 runs of 0.3 s at 1000 Hz (one at a time):
/// hot_a's share varied by 5.25 points (SD), the tick model says 5.16, counting samples as
/// observations 2.6. It is a ceiling on a busy machine (above).
///
/// Records merge every observation of one call chain into one count, so the weights of single
/// signals are gone from them; what they do show is a lower bound: every record is at least one
/// signal. Profiles whose timer does not wait for the tick (perf events, `CPUPROFILE_TIMER=perf`)
/// with many distinct stacks get the credit from their records; otherwise they are treated as
/// tick-limited, which only makes their intervals wider than needed. `tick_us` defaults to the
/// tick of the machine reading the profile (see `main.rs`); a profile recorded on a kernel with
/// another tick should be read with `--tick-us`.
pub fn modelled_observations(total: u64, period_us: u64, records: usize, tick_us: u64) -> f64 {
    let total = total as f64;
    let per_sample = (period_us as f64 / tick_us.max(1) as f64).min(1.0);
    (total * per_sample).max((records as f64).min(total))
}

/// One profile as `diff` reads it: samples per function and what they stand for.
pub struct Summary {
    counts: HashMap<String, u64>,
    total: u64,
    period_us: u64,
    /// CPU time of the run, per unit of work when units were given.
    seconds: f64,
    observations: f64,
}

impl Summary {
    /// `records` is the number of records the file held; `units` the work the run did (1 when
    /// the runs did the same work).
    pub fn new(
        stacks: &Stacks,
        records: usize,
        weights: Option<SignalWeights>,
        units: f64,
        cumulative: bool,
        tick_us: u64,
    ) -> Summary {
        let total = stacks.total();
        let counts = stacks
            .per_function()
            .into_iter()
            .map(|(name, c)| (name.to_string(), if cumulative { c.cum } else { c.flat }))
            .collect();
        Summary {
            counts,
            total,
            period_us: stacks.period_us,
            seconds: total as f64 * stacks.period_us as f64 / 1e6 / units,
            observations: observations(total, stacks.period_us, records, tick_us, weights),
        }
    }

    fn share(&self, function: &str) -> f64 {
        match self.total {
            0 => 0.0,
            total => self.counts.get(function).copied().unwrap_or(0) as f64 / total as f64,
        }
    }

    /// The function's samples in observations.
    fn observed(&self, function: &str) -> f64 {
        self.share(function) * self.observations
    }

    /// One line about the profile: samples, CPU time and observations.
    pub fn describe(&self) -> String {
        format!(
            "{} samples, {} us each = {:.2} s, ~{:.0} independent observations",
            self.total,
            self.period_us,
            self.total as f64 * self.period_us as f64 / 1e6,
            self.observations
        )
    }
}

/// One effect (change in share or in time) of one function.
#[derive(Clone, Copy, Debug, Default)]
pub struct Effect {
    pub before: f64,
    pub after: f64,
    pub low: f64,
    pub high: f64,
    /// The change over its standard error under "no change".
    pub z: f64,
    p: f64,
    /// The smallest p-value the function's samples could give (Tarone's rule).
    p_min: f64,
    /// After Holm's correction (1 for effects that cannot be significant).
    pub adjusted: f64,
    pub significant: bool,
}

impl Effect {
    pub fn change(&self) -> f64 {
        self.after - self.before
    }
}

/// A function's two effects.
#[derive(Clone, Debug)]
pub struct Row {
    pub function: String,
    pub share: Effect,
    pub time: Effect,
    /// How many times the samples would make the share's change significant, if it is real.
    pub settle: Option<f64>,
}

/// The comparison, ready to render and to gate on.
pub struct Report {
    pub header: String,
    pub rows: Vec<Row>,
    /// CPU time of the baseline (the history's mean), the reference for `growth=N%`.
    pub base_seconds: f64,
    pub new_seconds: f64,
    /// The baseline's samples and CPU seconds (not per unit), to say what would settle a change.
    base_run: (u64, f64),
    /// Effects tested, and how many of them could be significant (Tarone).
    pub tested: usize,
    pub testable: usize,
    /// What a non-significant change needs to be marked: its |z| at the first Holm step.
    pub z_needed: f64,
    pub per_unit: bool,
    pub history: bool,
}

/// The changes from `base` to `new`.
pub fn compare(base: &Summary, new: &Summary, header: String, per_unit: bool, opts: Options) -> Report {
    let names: BTreeSet<&String> = base.counts.keys().chain(new.counts.keys()).collect();
    let z_level = normal_quantile(1.0 - opts.confidence);
    let rows = names
        .into_iter()
        .map(|name| {
            let (x1, x2) = (base.observed(name), new.observed(name));
            let effect = |a1: f64, a2: f64| two_runs(x1, base.observations, a1, x2, new.observations, a2, z_level);
            // Only shares are tested between two runs: a time is the share times the run's
            // total, and the totals of two runs differ by more than sampling (start-up, the
            // machine: 0.35-0.39 s for runs of 0.4 s here), by an amount two profiles cannot
            // tell. Times get their sampling intervals, unmarked; `--history` tests them.
            let untested = Effect {
                p: 1.0,
                p_min: 1.0,
                ..effect(base.seconds, new.seconds)
            };
            Row {
                function: name.clone(),
                share: effect(100.0, 100.0),
                time: untested,
                settle: None,
            }
        })
        .collect();
    let base_run = (base.total, base.total as f64 * base.period_us as f64 / 1e6);
    finish(
        rows,
        header,
        (base.seconds, new.seconds),
        base_run,
        per_unit,
        false,
        opts,
    )
}

/// `new` against the runs in `history`: the change from the history's mean, judged against the
/// spread the runs show beyond their own sampling error, plus `new`'s sampling error.
pub fn against_history(history: &[Summary], new: &Summary, header: String, opts: Options) -> Report {
    let names: BTreeSet<&String> = history
        .iter()
        .flat_map(|h| h.counts.keys())
        .chain(new.counts.keys())
        .collect();
    let confidence = opts.confidence;
    let rows = names
        .into_iter()
        .map(|name| {
            let effect = |scale: &dyn Fn(&Summary) -> f64| {
                let past: Vec<(f64, f64, f64)> = history
                    .iter()
                    .map(|h| (h.share(name), h.observations, scale(h)))
                    .collect();
                from_history(&past, (new.share(name), new.observations, scale(new)), confidence)
            };
            Row {
                function: name.clone(),
                share: effect(&|_| 100.0),
                time: effect(&|s| s.seconds),
                settle: None,
            }
        })
        .collect();
    let base_seconds = history.iter().map(|h| h.seconds).sum::<f64>() / history.len().max(1) as f64;
    // Settle factors are not given against a history (see `finish`).
    finish(rows, header, (base_seconds, new.seconds), (0, 0.0), false, true, opts)
}

/// The effect `a2 p2 - a1 p1` of a function with `x1` of `n1` observations before and `x2` of
/// `n2` after (`a` = 100 for shares in points, the runs' CPU time for time).
fn two_runs(x1: f64, n1: f64, a1: f64, x2: f64, n2: f64, a2: f64, z_level: f64) -> Effect {
    let (p1, p2) = (ratio(x1, n1), ratio(x2, n2));
    let (l1, u1) = wilson(p1, n1, z_level);
    let (l2, u2) = wilson(p2, n2, z_level);
    let change = a2 * p2 - a1 * p1;
    let z = score_z(x1, n1, a1, x2, n2, a2);
    // The most extreme splits of the function's observations between the runs.
    let c = x1 + x2;
    let first = c.min(n1);
    let second = c.min(n2);
    let z_max = score_z(first, n1, a1, c - first, n2, a2)
        .abs()
        .max(score_z(c - second, n1, a1, second, n2, a2).abs());
    Effect {
        before: a1 * p1,
        after: a2 * p2,
        low: change - (a2 * (p2 - l2)).hypot(a1 * (u1 - p1)),
        high: change + (a2 * (u2 - p2)).hypot(a1 * (p1 - l1)),
        z,
        p: two_sided_normal(z),
        p_min: two_sided_normal(z_max),
        adjusted: 1.0,
        significant: false,
    }
}

/// The score statistic for `a2 p2 - a1 p1`, its variance taken at the proportions that fit
/// "no change" (`a1 p1 = a2 p2`) best: pooled, so a zero count does not make it infinite.
fn score_z(x1: f64, n1: f64, a1: f64, x2: f64, n2: f64, a2: f64) -> f64 {
    if n1 <= 0.0 || n2 <= 0.0 || a1 <= 0.0 || a2 <= 0.0 {
        return 0.0;
    }
    let common = (x1 + x2) / (n1 / a1 + n2 / a2);
    let (q1, q2) = ((common / a1).clamp(0.0, 1.0), (common / a2).clamp(0.0, 1.0));
    let variance = a1 * a1 * q1 * (1.0 - q1) / n1 + a2 * a2 * q2 * (1.0 - q2) / n2;
    let change = a2 * ratio(x2, n2) - a1 * ratio(x1, n1);
    if variance > 0.0 {
        change / variance.sqrt()
    } else {
        0.0
    }
}

/// The effect of `new` = (share, observations, scale) against `past` runs. The runs' spread is
/// their sampling error plus whatever else varies between runs (`tau2`, estimated as the spread
/// beyond sampling, from `runs - 1` degrees of freedom). The statistic follows Student's t with
/// the degrees of freedom Satterthwaite's rule gives the sum of that estimated part and the
/// sampling model's known variance: few runs with much extra spread make a wide t, runs that
/// vary no more than sampling explains make the normal.
fn from_history(past: &[(f64, f64, f64)], new: (f64, f64, f64), confidence: f64) -> Effect {
    let runs = past.len() as f64;
    let values: Vec<f64> = past.iter().map(|&(p, _, a)| a * p).collect();
    let mean = values.iter().sum::<f64>() / runs;
    let spread = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (runs - 1.0).max(1.0);
    let sampling = past
        .iter()
        .map(|&(p, n, a)| a * a * p * (1.0 - p) / n.max(1.0))
        .sum::<f64>()
        / runs;
    let tau2 = (spread - sampling).max(0.0);
    let (p, n, a) = new;
    // Under "no change" the new share is the history's: pooled with the new one, so a function
    // absent from the history still has a sampling error.
    let pooled = ((mean / a.max(f64::MIN_POSITIVE) + p) / 2.0).clamp(0.0, 1.0);
    let estimated = tau2 * (1.0 + 1.0 / runs);
    let known = a * a * pooled * (1.0 - pooled) / n.max(1.0) + sampling / runs;
    let variance = estimated + known;
    let df = if estimated > 0.0 {
        variance * variance / (estimated * estimated / (runs - 1.0).max(1.0))
    } else {
        f64::INFINITY
    };
    let change = a * p - mean;
    let se = variance.sqrt();
    let z = if se > 0.0 { change / se } else { 0.0 };
    let (p_value, quantile) = if df.is_finite() {
        (two_sided_t(z, df), t_quantile(1.0 - confidence, df))
    } else {
        (two_sided_normal(z), normal_quantile(1.0 - confidence))
    };
    Effect {
        before: mean,
        after: a * p,
        low: change - quantile * se,
        high: change + quantile * se,
        z,
        p: p_value,
        // Any new share is possible, so every function can be significant.
        p_min: 0.0,
        adjusted: 1.0,
        significant: false,
    }
}

/// Holm's correction over the testable effects, the marks, the settle factors, and the order:
/// significant rows first, then the largest changes.
fn finish(
    mut rows: Vec<Row>,
    header: String,
    (base_seconds, new_seconds): (f64, f64),
    base_run: (u64, f64),
    per_unit: bool,
    history: bool,
    opts: Options,
) -> Report {
    // Between two runs only shares are tested (see `compare`), against a history times too.
    let tested = rows.len() * if history { 2 } else { 1 };
    let p_min: Vec<f64> = rows.iter().flat_map(|r| [r.share.p_min, r.time.p_min]).collect();
    // Tarone: the smallest K such that at most K effects could reach alpha / K.
    let testable_at = |k: usize| p_min.iter().filter(|&&p| p <= opts.alpha / k as f64).count();
    let k = (1..=tested.max(1))
        .find(|&k| testable_at(k) <= k)
        .unwrap_or(tested.max(1));
    let limit = opts.alpha / k as f64;
    let mut order: Vec<(f64, usize, bool)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| [(r.share, i, true), (r.time, i, false)])
        .filter(|(e, _, _)| e.p_min <= limit)
        .map(|(e, i, share)| (e.p, i, share))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut running: f64 = 0.0;
    for (rank, &(p, i, share)) in order.iter().enumerate() {
        running = running.max((p * (k - rank) as f64).min(1.0));
        let effect = if share { &mut rows[i].share } else { &mut rows[i].time };
        effect.adjusted = running;
        effect.significant = running <= opts.alpha;
    }
    let z_needed = normal_quantile(limit);
    for row in rows.iter_mut().filter(|r| !r.share.significant && !r.time.significant) {
        let z = row.share.z.abs();
        // A change below a tenth of a standard error shows no direction to settle. Against a
        // history, more samples in the new run do not shrink the runs' own spread: no factor.
        row.settle = (!history && z > 0.1).then(|| (z_needed / z).powi(2));
    }
    let size = |r: &Row| {
        let time = if base_seconds > 0.0 {
            100.0 * r.time.change() / base_seconds
        } else {
            0.0
        };
        r.share.change().abs().max(time.abs())
    };
    // Significant first, then by size (to a millionth of a point: a function's gain is its
    // sibling's loss to rounding), growth before shrinkage at equal size.
    rows.sort_by_cached_key(|r| {
        (
            !(r.share.significant || r.time.significant),
            -(size(r) * 1e6).round() as i64,
            r.share.change() <= 0.0,
            r.function.clone(),
        )
    });
    Report {
        header,
        rows,
        base_seconds,
        new_seconds,
        base_run,
        tested,
        testable: order.len(),
        z_needed,
        per_unit,
        history,
    }
}

impl Report {
    pub fn significant(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.share.significant || r.time.significant)
    }

    /// The report: the significant rows and the largest other changes, each with its intervals.
    pub fn render(&self, opts: Options) -> String {
        let mut out = format!("{}\n", self.header);
        let level = 100.0 * opts.confidence;
        let what = if opts.cumulative { "cumulative" } else { "flat (self)" };
        let time_what = if self.per_unit {
            "CPU time per unit of work"
        } else {
            "CPU time per run"
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
        let scale = self
            .rows
            .iter()
            .map(|r| r.time.before.abs().max(r.time.after.abs()))
            .fold(self.base_seconds, f64::max);
        let (unit, factor) = time_unit(scale);
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
        let shown = self.significant().count() + opts.rows;
        for r in self.rows.iter().take(shown) {
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
        if self.history {
            out.push_str("history: a change is judged against the runs' spread beyond their sampling error.\n");
        } else {
            let _ = writeln!(
                out,
                "time: the totals were {:.3} s and {:.3} s ({}); time intervals are sampling error only, \
                 the totals' run-to-run noise needs repeated runs (--history).",
                self.base_seconds,
                self.new_seconds,
                self.total_growth()
                    .map_or("from nothing".to_string(), |g| format!("{g:+.1}%"))
            );
        }
        out
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

/// A `--fail-on` condition. Every condition on a function needs a significant change (of its
/// share, or against a history of its time too): noise never fails a build, whatever its size.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Any function grew significantly (share or time).
    Significant,
    /// A function's share grew by at least this many percentage points.
    Share(f64),
    /// A function's time grew by at least this percentage of the baseline's total time.
    Growth(f64),
    /// A function's time grew by at least this many seconds (per unit with `--units`).
    Seconds(f64),
    /// The run's total CPU time grew by at least this percentage. Two runs cannot tell this
    /// from the machine's noise: a plain threshold, to be set above the run-to-run variation.
    Total(f64),
}

impl std::fmt::Display for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Gate::Significant => write!(f, "significant"),
            Gate::Share(points) => write!(f, "share={points}"),
            Gate::Growth(percent) => write!(f, "growth={percent}%"),
            Gate::Seconds(seconds) => write!(f, "growth={seconds}s"),
            Gate::Total(percent) => write!(f, "total={percent}%"),
        }
    }
}

impl FromStr for Gate {
    type Err = String;

    fn from_str(text: &str) -> Result<Gate, String> {
        let number = |v: &str| -> Result<f64, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .ok_or_else(|| format!("`{text}`: `{v}` is not a non-negative number"))
        };
        match text.split_once('=') {
            None if text == "significant" => Ok(Gate::Significant),
            Some(("share", v)) => number(v.trim_end_matches('%')).map(Gate::Share),
            Some(("total", v)) => match v.strip_suffix('%') {
                Some(p) => number(p).map(Gate::Total),
                None => Err(format!("`{text}`: give the total's growth in %")),
            },
            Some(("growth", v)) => {
                if let Some(p) = v.strip_suffix('%') {
                    number(p).map(Gate::Growth)
                } else if let Some(us) = v.strip_suffix("us") {
                    number(us).map(|n| Gate::Seconds(n / 1e6))
                } else if let Some(ms) = v.strip_suffix("ms") {
                    number(ms).map(|n| Gate::Seconds(n / 1e3))
                } else if let Some(s) = v.strip_suffix('s') {
                    number(s).map(Gate::Seconds)
                } else {
                    Err(format!(
                        "`{text}`: give growth in % of the total time, or in s, ms or us"
                    ))
                }
            }
            _ => Err(format!(
                "`{text}`: expected significant, share=POINTS, growth=PERCENT%, growth=SECONDS(s|ms|us) or total=PERCENT%"
            )),
        }
    }
}

impl Report {
    /// The conditions that fail, one line each naming the function and its change.
    /// The growth of the total CPU time in percent; `None` (unbounded) from an empty baseline to
    /// a profile with samples.
    fn total_growth(&self) -> Option<f64> {
        match (self.base_seconds > 0.0, self.new_seconds > 0.0) {
            (true, _) => Some(100.0 * (self.new_seconds / self.base_seconds - 1.0)),
            (false, true) => None,
            (false, false) => Some(0.0),
        }
    }

    pub fn failures(&self, gates: &[Gate]) -> Vec<String> {
        let mut out = Vec::new();
        for gate in gates {
            if matches!(gate, Gate::Total(percent) if self.total_growth().is_none_or(|g| g >= *percent)) {
                out.push(format!(
                    "{gate}: the total CPU time grew from {:.3} s to {:.3} s",
                    self.base_seconds, self.new_seconds
                ));
            }
            for r in &self.rows {
                let share_grew = r.share.significant && r.share.change() > 0.0;
                let time_grew = r.time.significant && r.time.change() > 0.0;
                let growth = 100.0 * r.time.change() / self.base_seconds.max(f64::MIN_POSITIVE);
                let grew = share_grew || time_grew;
                let failed = match gate {
                    Gate::Significant => grew,
                    Gate::Share(points) => share_grew && r.share.change() >= *points,
                    Gate::Growth(percent) => grew && growth >= *percent,
                    Gate::Seconds(seconds) => grew && r.time.change() >= *seconds,
                    Gate::Total(_) => false,
                };
                if failed {
                    out.push(format!(
                        "{gate}: {} grew {:+.1} points of share, {:+.3} s ({:+.1}% of the baseline's time)",
                        r.function,
                        r.share.change(),
                        r.time.change(),
                        growth
                    ));
                }
            }
        }
        out
    }
}

fn ratio(x: f64, n: f64) -> f64 {
    if n > 0.0 {
        (x / n).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Wilson's score interval for a proportion `p` of `n` observations, `z` standard errors wide.
fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let z2n = z * z / n;
    let centre = (p + z2n / 2.0) / (1.0 + z2n);
    let half = z / (1.0 + z2n) * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

mod libm {
    extern "C" {
        pub fn erfc(x: f64) -> f64;
        pub fn lgamma_r(x: f64, sign: *mut i32) -> f64;
    }
}

/// P(|Z| >= |z|) for a standard normal Z.
fn two_sided_normal(z: f64) -> f64 {
    // SAFETY: a pure function of its argument (glibc's libm, which std links).
    unsafe { libm::erfc(z.abs() / std::f64::consts::SQRT_2) }
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom.
fn two_sided_t(t: f64, df: f64) -> f64 {
    incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The z with `two_sided_normal(z) == p`.
fn normal_quantile(p: f64) -> f64 {
    invert(two_sided_normal, p)
}

fn t_quantile(p: f64, df: f64) -> f64 {
    invert(|t| two_sided_t(t, df), p)
}

/// The x >= 0 where the decreasing `tail` falls to `p`, by bisection.
fn invert(tail: impl Fn(f64) -> f64, p: f64) -> f64 {
    let (mut low, mut high) = (0.0, 1.0);
    while tail(high) > p && high < 1e6 {
        high *= 2.0;
    }
    for _ in 0..200 {
        let mid = (low + high) / 2.0;
        if tail(mid) > p {
            low = mid;
        } else {
            high = mid;
        }
    }
    (low + high) / 2.0
}

fn ln_gamma(x: f64) -> f64 {
    let mut sign = 0;
    // SAFETY: a pure function; the sign goes to a local instead of the global `signgam`.
    unsafe { libm::lgamma_r(x, &mut sign) }
}

/// The regularised incomplete beta function I_x(a, b), by its continued fraction (evaluated with
/// Lentz's method), on the side of the mean where it converges fast.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let log_front = a * x.ln() + b * (1.0 - x).ln() + ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b);
    if x < (a + 1.0) / (a + b + 2.0) {
        log_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - log_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut h = d;
    for m in 1..1000 {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        h *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(counts: &[(&str, u64)], period_us: u64) -> Summary {
        let mut stacks = Stacks::new(period_us);
        for (f, c) in counts {
            stacks.push(["main", f], *c);
        }
        // As many records as distinct stacks: the tick decides the observations.
        Summary::new(&stacks, counts.len(), None, 1.0, false, 4000)
    }

    const OPTS: Options = Options {
        cumulative: false,
        alpha: 0.001,
        confidence: 0.95,
        rows: 10,
    };

    fn row<'a>(report: &'a Report, f: &str) -> &'a Row {
        report.rows.iter().find(|r| r.function == f).unwrap()
    }

    #[test]
    fn the_distributions_match_known_values() {
        assert!((two_sided_normal(1.959964) - 0.05).abs() < 1e-6);
        assert!((two_sided_normal(4.0) - 6.334e-5).abs() < 1e-8);
        assert!((normal_quantile(0.05) - 1.959964).abs() < 1e-5);
        // t with 4 degrees of freedom: 2.776445 at 5 %; with 1 (Cauchy): P(|T| >= 1) = 1/2.
        assert!((two_sided_t(2.776445, 4.0) - 0.05).abs() < 1e-6);
        assert!((two_sided_t(1.0, 1.0) - 0.5).abs() < 1e-9);
        assert!((t_quantile(0.05, 4.0) - 2.776445).abs() < 1e-5);
        // Wilson for 0 of 10 at 95 %: [0, 0.2775].
        let (low, high) = wilson(0.0, 10.0, 1.959964);
        assert!(low == 0.0 && (high - 0.27753).abs() < 1e-4, "{high}");
    }

    #[test]
    fn observations_follow_the_tick_and_the_records() {
        // 1000 Hz on a 4 ms tick: four samples per look at the stack.
        assert_eq!(observations(1000, 1000, 10, 4000, None), 250.0);
        // At or below the tick's rate every sample is an observation.
        assert_eq!(observations(110, 10000, 5, 4000, None), 110.0);
        // More records than the tick allows: the timer did not wait for the tick.
        assert_eq!(observations(1000, 1000, 600, 4000, None), 600.0);
        // Recorded weights win: 1000 samples from 100 signals of weight 10 are 100 looks, and
        // a file holding half the weighed samples (the rest lost) half as many.
        let weights = SignalWeights {
            signals: 100,
            sum: 1000,
            sum_of_squares: 10_000,
        };
        assert_eq!(observations(1000, 1000, 10, 4000, Some(weights)), 100.0);
        assert_eq!(observations(500, 1000, 10, 4000, Some(weights)), 50.0);
    }

    #[test]
    fn the_issue_case_is_named_with_its_interval_and_what_would_settle_it() {
        // hot_b 23 of 110 samples before, 44 of 110 after, at 100 Hz.
        let base = summary(&[("hot_a", 87), ("hot_b", 23)], 10000);
        let new = summary(&[("hot_a", 66), ("hot_b", 44)], 10000);
        let report = compare(&base, &new, String::new(), false, OPTS);
        let b = row(&report, "hot_b");
        assert!(
            !b.share.significant && b.share.low > 0.0 && b.share.high > 25.0,
            "{b:?}"
        );
        assert!(b.settle.is_some_and(|k| k > 1.0 && k < 10.0), "{b:?}");
        assert_eq!(report.rows[0].function, "hot_b", "largest change first");
        let text = report.render(OPTS);
        assert!(
            text.contains("nothing is significant") && text.contains("hot_b needs"),
            "{text}"
        );
        // Ten times the samples: significant, and the gates see it.
        let base = summary(&[("hot_a", 870), ("hot_b", 230)], 10000);
        let new = summary(&[("hot_a", 660), ("hot_b", 440)], 10000);
        let report = compare(&base, &new, String::new(), false, OPTS);
        assert!(row(&report, "hot_b").share.significant && row(&report, "hot_a").share.significant);
        assert_eq!(report.failures(&[Gate::Share(10.0)]).len(), 1);
        assert!(report.failures(&[Gate::Share(20.0)]).is_empty());
        assert_eq!(report.failures(&[Gate::Growth(15.0)]).len(), 1, "+2.1 s of 11 s");
        assert!(report.failures(&[Gate::Seconds(2.5)]).is_empty());
    }

    #[test]
    fn samples_above_the_tick_rate_do_not_count_as_observations() {
        // The same counts: significant at 100 Hz, not at 1000 Hz (a quarter of the looks).
        let counts = ([("a", 750), ("b", 250)], [("a", 650), ("b", 350)]);
        let at = |period| {
            let report = compare(
                &summary(&counts.0, period),
                &summary(&counts.1, period),
                String::new(),
                false,
                OPTS,
            );
            row(&report, "b").share.significant
        };
        assert!(at(10000));
        assert!(!at(1000));
    }

    #[test]
    fn a_uniform_speedup_moves_times_not_shares() {
        let base = summary(&[("a", 7500), ("b", 2500)], 10000);
        let new = summary(&[("a", 3750), ("b", 1250)], 10000);
        let report = compare(&base, &new, String::new(), false, OPTS);
        for f in ["a", "b"] {
            let r = row(&report, f);
            assert!(!r.share.significant && r.time.high < 0.0, "{r:?}");
        }
        assert!(
            report.failures(&[Gate::Significant, Gate::Total(0.0)]).is_empty(),
            "faster is no failure"
        );
        let slower = compare(&new, &base, String::new(), false, OPTS);
        assert_eq!(slower.failures(&[Gate::Total(90.0)]).len(), 1, "twice as slow");
        assert!(slower.failures(&[Gate::Total(110.0), Gate::Growth(1.0)]).is_empty());
    }

    #[test]
    fn gates_parse() {
        assert_eq!("significant".parse(), Ok(Gate::Significant));
        assert_eq!("share=2".parse(), Ok(Gate::Share(2.0)));
        assert_eq!("growth=5%".parse(), Ok(Gate::Growth(5.0)));
        assert_eq!("growth=20ms".parse(), Ok(Gate::Seconds(0.02)));
        assert_eq!("growth=1.5s".parse(), Ok(Gate::Seconds(1.5)));
        assert_eq!("total=10%".parse(), Ok(Gate::Total(10.0)));
        for bad in ["growth=5", "growth=-1%", "speed=3", "share=x", "total=3s"] {
            assert!(bad.parse::<Gate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn history_flags_only_what_left_its_usual_range() {
        // Runs that vary twice as much as sampling explains (+-1 point against +-0.43).
        let history: Vec<Summary> = [7400, 7600, 7500, 7350, 7650, 7500, 7450, 7550]
            .iter()
            .map(|&a| summary(&[("a", a), ("b", 10000 - a)], 10000))
            .collect();
        let usual = summary(&[("a", 7450), ("b", 2550)], 10000);
        assert_eq!(
            against_history(&history, &usual, String::new(), OPTS)
                .significant()
                .count(),
            0
        );
        let grown = summary(&[("a", 6000), ("b", 4000), ("new_fn", 500)], 10000);
        let report = against_history(&history, &grown, String::new(), OPTS);
        let names: BTreeSet<&str> = report.significant().map(|r| r.function.as_str()).collect();
        assert_eq!(names, BTreeSet::from(["a", "b", "new_fn"]));
        // Against a history, times are tested too: twice as slow everywhere is a growth.
        let slower = summary(&[("a", 15000), ("b", 5000)], 10000);
        let report = against_history(&history, &slower, String::new(), OPTS);
        assert!(row(&report, "b").time.significant && !row(&report, "b").share.significant);
        assert_eq!(report.failures(&[Gate::Growth(10.0)]).len(), 2);
    }
}
