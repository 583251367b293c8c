//! `diff --fail-on`: the conditions a CI job sets on a comparison, and which of them it meets.

use super::diff::Report;
use crate::model::unit::Unit;
use std::str::FromStr;

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
    /// A function's time grew by at least this many seconds (per unit with `--units`); CPU
    /// profiles only.
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
    pub fn failures(&self, gates: &[Gate]) -> Vec<String> {
        let mut out = Vec::new();
        for gate in gates {
            if matches!(gate, Gate::Total(percent) if self.total_growth().is_none_or(|g| g >= *percent)) {
                let what = match self.unit {
                    Unit::Samples => "CPU time",
                    unit => unit.name(),
                };
                out.push(format!(
                    "{gate}: the total {what} grew from {} to {}",
                    self.amount(self.base_amount, false),
                    self.amount(self.new_amount, false)
                ));
            }
            for r in &self.rows {
                let share_grew = r.share.significant && r.share.change() > 0.0;
                let time_grew = r.time.significant && r.time.change() > 0.0;
                let growth = 100.0 * r.time.change() / self.base_amount.max(f64::MIN_POSITIVE);
                let grew = share_grew || time_grew;
                let failed = match gate {
                    Gate::Significant => grew,
                    Gate::Share(points) => share_grew && r.share.change() >= *points,
                    Gate::Growth(percent) => grew && growth >= *percent,
                    Gate::Seconds(seconds) => grew && r.time.change() >= *seconds,
                    Gate::Total(_) => false,
                };
                if failed {
                    let of = match self.unit {
                        Unit::Samples => "time",
                        unit => unit.name(),
                    };
                    out.push(format!(
                        "{gate}: {} grew {:+.1} points of share, {} ({:+.1}% of the baseline's {of})",
                        r.function,
                        r.share.change(),
                        self.amount(r.time.change(), true),
                        growth
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
