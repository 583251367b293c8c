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
//!
//! **Heap profiles.** The same tests, with the heap value read (`--sample-index`, scaled back as
//! pprof does) in place of CPU time. A sampling heap profiler draws its samples like a Poisson
//! process over the bytes allocated, each independent of the others: the observations are the
//! sampled objects, each standing for the bytes (or objects) its line scales it to; samples of
//! unequal weight count as Kish's effective number of them ([`weighted_observations`]), as the
//! signal weights of a CPU profile do.

use super::stats::{normal_quantile, ratio, t_quantile, two_sided_normal, two_sided_t, wilson};
use crate::model::stacks::Stacks;
use crate::model::unit::Unit;
use crate::render::units::Scale;
use cpuprof::format::SignalWeights;
use std::collections::{BTreeSet, HashMap};

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

/// How many independent observations a heap profile's samples stand for, from its `lines`:
/// each the number of its sampled objects and what they weigh together (the line's scaled
/// value). Each sample of a line is taken to weigh the line's mean, and samples of unequal
/// weight count as Kish's effective number `(sum w)^2 / sum w^2`: equal weights give the number
/// of samples, a few heavy samples among many light ones fewer.
pub fn weighted_observations(lines: impl IntoIterator<Item = (u64, u64)>) -> f64 {
    let (mut sum, mut squares) = (0.0f64, 0.0f64);
    for (samples, weight) in lines.into_iter().filter(|&(n, w)| n > 0 && w > 0) {
        let w = weight as f64;
        sum += w;
        squares += w * w / samples as f64;
    }
    if squares > 0.0 {
        sum * sum / squares
    } else {
        0.0
    }
}

/// One profile as `diff` reads it: samples per function and what they stand for.
pub struct Summary {
    counts: HashMap<String, u64>,
    total: u64,
    period_us: u64,
    /// What the counts measure.
    unit: Unit,
    /// The samples behind the counts: CPU samples, or a heap profile's sampled objects.
    samples: u64,
    /// What the run amounts to, per unit of work when units were given: CPU seconds, or the
    /// heap value (bytes or objects).
    amount: f64,
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
            unit: stacks.unit,
            samples: total,
            amount: total as f64 * stacks.period_us as f64 / 1e6 / units,
            observations: observations(total, stacks.period_us, records, tick_us, weights),
        }
    }

    /// A heap profile read as `stacks` (its counts the value read, scaled back), whose `lines`
    /// each held so many sampled objects weighing so much (see [`weighted_observations`]).
    pub fn heap(stacks: &Stacks, lines: &[(u64, u64)], units: f64, cumulative: bool) -> Summary {
        let total = stacks.total();
        let counts = stacks
            .per_function()
            .into_iter()
            .map(|(name, c)| (name.to_string(), if cumulative { c.cum } else { c.flat }))
            .collect();
        Summary {
            counts,
            total,
            period_us: 0,
            unit: stacks.unit,
            samples: lines.iter().fold(0u64, |sum, &(n, _)| sum.saturating_add(n)),
            amount: total as f64 / units,
            observations: weighted_observations(lines.iter().copied()),
        }
    }

    /// What the counts measure.
    pub fn unit(&self) -> Unit {
        self.unit
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

    /// One line about the profile: samples, CPU time (or the heap value) and observations.
    pub fn describe(&self) -> String {
        if self.unit != Unit::Samples {
            let samples = if self.unit.contention_value().is_some() {
                "waits"
            } else {
                "sampled objects"
            };
            return format!(
                "{} {}, {} {samples}, ~{:.0} effective samples",
                Scale::label_alone(self.unit, self.total),
                self.unit.name(),
                self.samples,
                self.observations
            );
        }
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
    /// CPU time (or heap value) of the baseline (the history's mean), the reference for
    /// `growth=N%`.
    pub base_amount: f64,
    pub new_amount: f64,
    /// The baseline's samples (a heap profile's sampled objects) and CPU seconds (not per
    /// unit), to say what would settle a change.
    pub base_run: (u64, f64),
    /// Effects tested, and how many of them could be significant (Tarone).
    pub tested: usize,
    pub testable: usize,
    /// What a non-significant change needs to be marked: its |z| at the first Holm step.
    pub z_needed: f64,
    pub per_unit: bool,
    pub history: bool,
    /// What the profiles' counts measure (CPU samples, or a heap value).
    pub unit: Unit,
}

impl Report {
    pub fn significant(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.share.significant || r.time.significant)
    }

    /// The growth of the total CPU time in percent; `None` (unbounded) from an empty baseline to
    /// a profile with samples.
    pub fn total_growth(&self) -> Option<f64> {
        match (self.base_amount > 0.0, self.new_amount > 0.0) {
            (true, _) => Some(100.0 * (self.new_amount / self.base_amount - 1.0)),
            (false, true) => None,
            (false, false) => Some(0.0),
        }
    }
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
                ..effect(base.amount, new.amount)
            };
            Row {
                function: name.clone(),
                share: effect(100.0, 100.0),
                time: untested,
                settle: None,
            }
        })
        .collect();
    let base_run = (base.samples, base.total as f64 * base.period_us as f64 / 1e6);
    finish(
        rows,
        header,
        (base.amount, new.amount),
        base_run,
        (per_unit, false, new.unit),
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
                time: effect(&|s| s.amount),
                settle: None,
            }
        })
        .collect();
    let base_amount = history.iter().map(|h| h.amount).sum::<f64>() / history.len().max(1) as f64;
    // Settle factors are not given against a history (see `finish`).
    finish(
        rows,
        header,
        (base_amount, new.amount),
        (0, 0.0),
        (false, true, new.unit),
        opts,
    )
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
    (base_amount, new_amount): (f64, f64),
    base_run: (u64, f64),
    (per_unit, history, unit): (bool, bool, Unit),
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
        let time = if base_amount > 0.0 {
            100.0 * r.time.change() / base_amount
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
        base_amount,
        new_amount,
        base_run,
        tested,
        testable: order.len(),
        z_needed,
        per_unit,
        history,
        unit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::gates::Gate;

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
    fn heap_samples_count_as_observations_weighted_by_what_they_stand_for() {
        // Samples of equal weight: their number.
        assert_eq!(weighted_observations([(30, 3000), (10, 1000)]), 40.0);
        // A heavy sample beside a hundred light ones of the same total: (200)^2 / (100 + 10^4).
        let n = weighted_observations([(100, 100), (1, 100)]);
        assert!((n - 40000.0 / 10100.0).abs() < 1e-9, "{n}");
        assert_eq!(weighted_observations([(0, 5), (3, 0)]), 0.0);
    }

    #[test]
    fn heap_profiles_compare_their_bytes() {
        use cpuprof::format::heap::HeapValue;
        let unit = Unit::Heap {
            value: HeapValue::InuseSpace,
            period: 524288,
        };
        // Sampled objects of 1 kB standing for 512 kB each; big:small 3:1, then 1:1 with more.
        let summary = |big: u64, small: u64| {
            let mut stacks = Stacks::new(0);
            stacks.unit = unit;
            stacks.push(["main", "big"], big << 19);
            stacks.push(["main", "small"], small << 19);
            Summary::heap(&stacks, &[(big, big << 19), (small, small << 19)], 1.0, true)
        };
        let (base, new) = (summary(300, 100), summary(300, 300));
        assert_eq!(
            base.describe(),
            "200MB inuse_space, 400 sampled objects, ~400 effective samples"
        );
        let report = compare(
            &base,
            &new,
            String::new(),
            false,
            Options {
                cumulative: true,
                ..OPTS
            },
        );
        let small = row(&report, "small");
        assert!(small.share.significant && small.share.change() > 0.0, "{small:?}");
        assert_eq!(small.time.change(), (200u64 << 19) as f64, "bytes, not seconds");
        let text = report.render(OPTS);
        for expected in [
            "share in % and inuse_space per run",
            "observations: the sampled objects",
            "change [interval] MB",
            "inuse_space: the totals were 200MB and 300MB (+50.0%)",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
        assert_eq!(
            report.failures(&[Gate::Total(10.0), Gate::Growth(40.0)]),
            [
                "total=10%: the total inuse_space grew from 200MB to 300MB",
                "growth=40%: small grew +25.0 points of share, +100MB (+50.0% of the baseline's inuse_space)"
            ]
        );
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
