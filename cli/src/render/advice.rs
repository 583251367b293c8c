//! `advise`'s output: the ranked hints as text, or every hint with its counts as JSON.

use crate::analysis::advise::{Advice, FamilyShare, Hint};
use crate::render::json::{num, string};
use crate::render::text::percent as pct;
use crate::symbols::file_name;
use std::fmt::Write;

impl Advice<'_> {
    /// The hints at stake of at least `min_share` (a fraction), at most `count` of them,
    /// then one line for each smaller one.
    pub fn text(&self, min_share: f64, count: usize) -> String {
        let a = self.analysis;
        let total = a.total;
        let mut out = format!(
            "{total} samples ({:.2} s at {} us per sample); hints ranked by the share of all samples at stake\n",
            total as f64 * a.period_us as f64 / 1e6,
            a.period_us
        );
        let (major, minor): (Vec<_>, Vec<_>) = self.hints.iter().partition(|(stake, _)| *stake >= min_share);
        if total == 0 {
            out.push_str("no samples: nothing to advise on\n");
        } else if major.is_empty() {
            let _ = writeln!(out, "no hint: nothing at stake reaches {:.1} %", 100.0 * min_share);
        }
        for (rank, (stake, hint)) in major.iter().take(count).enumerate() {
            let _ = write!(out, "\n{}. [{:.1} %] ", rank + 1, 100.0 * stake);
            for (i, line) in self.lines(hint).iter().enumerate() {
                let indent = if i == 0 { "" } else { "   " };
                let _ = writeln!(out, "{indent}{line}");
            }
        }
        if major.len() > count {
            let _ = writeln!(
                out,
                "\n({} more hints above {:.1} %: -n)",
                major.len() - count,
                100.0 * min_share
            );
        }
        if !minor.is_empty() {
            let _ = writeln!(out, "\nbelow {:.1} %:", 100.0 * min_share);
            for (stake, hint) in &minor {
                let what = match hint {
                    Hint::Growth { row, .. } => format!("{} grew", row.function),
                    Hint::Slower { functions, .. } => {
                        format!("the run took longer: {} grew with it", list(functions, 3))
                    }
                    Hint::Lines { function, lines, .. } => format!(
                        "{function}: line {} holds most of its self time",
                        lines.iter().map(|l| l.1.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    Hint::Family(i) => {
                        let f = self.family(*i);
                        format!("{} ({} samples), from {}", f.family.name, f.samples, self.callers(f, 2))
                    }
                };
                let _ = writeln!(out, "   [{:.1} %] {what}", 100.0 * stake);
            }
        }
        out
    }

    /// What `hint` says: its headline, then the lines of evidence under it.
    pub fn lines(&self, hint: &Hint) -> Vec<String> {
        let total = self.analysis.total;
        let mark = |significant: bool| if significant { " significant" } else { "" };
        match hint {
            Hint::Growth {
                row,
                runs,
                usual_seconds,
            } => {
                let (s, t) = (&row.share, &row.time);
                vec![
                    format!(
                        "{} grew against {runs} earlier runs (cumulative: it and what it calls)",
                        row.function
                    ),
                    format!(
                        "share {:.1} % -> {:.1} %: {:+.1} points [{:+.1}, {:+.1}]{}",
                        s.before,
                        s.after,
                        s.change(),
                        s.low,
                        s.high,
                        mark(s.significant)
                    ),
                    format!(
                        "time {:.3} s -> {:.3} s: {:+.3} s [{:+.3}, {:+.3}]{} (usual total {usual_seconds:.3} s)",
                        t.before,
                        t.after,
                        t.change(),
                        t.low,
                        t.high,
                        mark(t.significant)
                    ),
                ]
            }
            Hint::Slower {
                functions,
                usual_seconds,
                seconds,
                runs,
            } => vec![
                format!(
                    "the run took {seconds:.3} s of CPU against the usual {usual_seconds:.3} s of {runs} earlier runs ({:+.1} %)",
                    100.0 * (seconds - usual_seconds) / usual_seconds
                ),
                format!(
                    "grew in time but not in share (with the whole run): {}",
                    list(functions, 6)
                ),
                "if the runs did the same work, everything slowed down; else it is the extra work".to_string(),
            ],
            Hint::Lines {
                function,
                self_samples,
                lines: hot,
            } => {
                let held: u64 = hot.iter().map(|l| l.2).sum();
                let which = match hot.as_slice() {
                    [(file, line, _, _)] => format!("line {line} of {function} ({}) holds", file_name(file)),
                    _ => format!(
                        "lines {} of {function} ({}) hold",
                        hot.iter().map(|l| l.1.to_string()).collect::<Vec<_>>().join(", "),
                        file_name(&hot[0].0)
                    ),
                };
                let mut lines = vec![format!(
                    "{which} {:.1} % of {function}'s self time ({held} of {self_samples} samples; {function} self {:.1} % of all)",
                    pct(held, *self_samples),
                    pct(*self_samples, total)
                )];
                for (file, line, samples, source) in hot {
                    lines.push(format!(
                        "{}:{line}  {samples} samples, {:.1} % of all{}",
                        file_name(file),
                        pct(*samples, total),
                        source.as_ref().map_or(String::new(), |s| format!("  | {s}"))
                    ));
                }
                lines
            }
            Hint::Family(i) => {
                let f = self.family(*i);
                vec![
                    format!(
                        "{}: {:.1} % of samples ({} of {total}) are in it or what it calls",
                        f.family.name,
                        pct(f.samples, total),
                        f.samples
                    ),
                    format!("called from {}", self.callers(f, 3)),
                    format!("time spent in {}", self.leaves(f, 4)),
                ]
            }
        }
    }

    /// The family hint `i` points at.
    pub fn family(&self, i: usize) -> &FamilyShare {
        &self.analysis.families[i]
    }

    fn callers(&self, f: &FamilyShare, n: usize) -> String {
        let total = self.analysis.total;
        let mut parts: Vec<String> = f
            .callers
            .iter()
            .take(n)
            .map(|(caller, samples)| {
                format!(
                    "{} {:.1} %",
                    caller.as_deref().unwrap_or("(no caller in the program)"),
                    pct(*samples, total)
                )
            })
            .collect();
        if f.callers.len() > n {
            parts.push(format!("{} more", f.callers.len() - n));
        }
        parts.join(", ")
    }

    fn leaves(&self, f: &FamilyShare, n: usize) -> String {
        let total = self.analysis.total;
        let mut parts: Vec<String> = f
            .leaves
            .iter()
            .take(n)
            .map(|(name, samples)| format!("{name} {:.1} %", pct(*samples, total)))
            .collect();
        if f.leaves.len() > n {
            parts.push(format!("{} more", f.leaves.len() - n));
        }
        parts.join(", ")
    }

    /// Every hint, with raw counts, as JSON (for scripts and the HTML report).
    pub fn json(&self) -> String {
        let a = self.analysis;
        let mut hints = Vec::new();
        for (rank, (stake, hint)) in self.hints.iter().enumerate() {
            let body = match hint {
                Hint::Growth { row, runs, .. } => {
                    let effect = |e: &crate::analysis::diff::Effect| {
                        format!(
                            "{{\"before\":{},\"now\":{},\"change\":{},\"low\":{},\"high\":{},\"significant\":{}}}",
                            num(e.before),
                            num(e.after),
                            num(e.change()),
                            num(e.low),
                            num(e.high),
                            e.significant
                        )
                    };
                    format!(
                        "\"kind\":\"growth\",\"function\":{},\"runs\":{runs},\"share_points\":{},\"time_seconds\":{}",
                        string(&row.function),
                        effect(&row.share),
                        effect(&row.time)
                    )
                }
                Hint::Slower {
                    functions,
                    usual_seconds,
                    seconds,
                    runs,
                } => {
                    let names: Vec<String> = functions.iter().map(|f| string(f)).collect();
                    format!(
                        "\"kind\":\"slower\",\"runs\":{runs},\"usual_seconds\":{},\"seconds\":{},\"functions\":[{}]",
                        num(*usual_seconds),
                        num(*seconds),
                        names.join(",")
                    )
                }
                Hint::Lines {
                    function,
                    self_samples,
                    lines,
                } => {
                    let lines: Vec<String> = lines
                        .iter()
                        .map(|(file, line, samples, source)| {
                            format!(
                                "{{\"file\":{},\"line\":{line},\"samples\":{samples},\"source\":{}}}",
                                string(file),
                                source.as_deref().map_or("null".to_string(), string)
                            )
                        })
                        .collect();
                    format!(
                        "\"kind\":\"lines\",\"function\":{},\"self_samples\":{self_samples},\"lines\":[{}]",
                        string(function),
                        lines.join(",")
                    )
                }
                Hint::Family(i) => {
                    let f = self.family(*i);
                    let pairs = |v: &[(Option<String>, u64)]| {
                        v.iter()
                            .map(|(n, s)| {
                                format!(
                                    "{{\"function\":{},\"samples\":{s}}}",
                                    n.as_deref().map_or("null".to_string(), string)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    let leaves: Vec<(Option<String>, u64)> =
                        f.leaves.iter().map(|(n, s)| (Some(n.clone()), *s)).collect();
                    format!(
                        "\"kind\":\"family\",\"family\":{},\"samples\":{},\"callers\":[{}],\"leaves\":[{}]",
                        string(f.family.name),
                        f.samples,
                        pairs(&f.callers),
                        pairs(&leaves)
                    )
                }
            };
            hints.push(format!("{{\"rank\":{},\"stake\":{},{body}}}", rank + 1, num(*stake)));
        }
        format!(
            "{{\"total_samples\":{},\"period_us\":{},\"hints\":[{}]}}\n",
            a.total,
            a.period_us,
            hints.join(",\n")
        )
    }
}

/// The first `n` of `names`, and how many more.
fn list(names: &[String], n: usize) -> String {
    let mut shown = names.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > n {
        let _ = write!(shown, " and {} more", names.len() - n);
    }
    shown
}
