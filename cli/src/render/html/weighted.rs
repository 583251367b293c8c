//! `cpuprof report` of a heap or contention profile: the same page as a CPU profile's (the
//! interactive flame graph, the function table, with `--base` the differential graph and the
//! changes), its widths the value read (`--sample-index`: bytes or objects, delay or waits)
//! instead of samples. Hints and source listings are about CPU time and are left out.

use super::{
    diff_section, script_data, Baseline, Comparison, Options, Tree, GRAPH_SECTION, SCRIPT, STYLE, TOP_SECTION,
};
use crate::analysis::{advise, diff};
use crate::error::{Error, Result};
use crate::input::Weighted;
use crate::model::stacks::Stacks;
use crate::model::unit::Unit;
use crate::render::markup::escape;
use crate::render::text::heap_heading;
use crate::render::units::Scale;
use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;

/// The page for `profile`; `read_base` reads a `--base` profile the same way (`None`: not a
/// heap or contention profile).
pub fn page(
    profile: &Weighted,
    baseline: &Baseline,
    read_base: &dyn Fn(&Path) -> Result<Option<Weighted>>,
    opts: &Options,
) -> Result<String> {
    let stacks = &profile.stacks;
    let mut tree = Tree::new();
    tree.add(stacks, false);
    let summary = |w: &Weighted| diff::Summary::heap(&w.stacks, &w.lines, 1.0, true);
    let kind = kind(stacks.unit);
    let comparison = match baseline {
        Baseline::None => Comparison::default(),
        Baseline::Profile(base) => {
            let base_profile = read_base(base)?
                .filter(|b| self::kind(b.stacks.unit) == kind)
                .ok_or_else(|| {
                    Error::Input(format!(
                        "{}: not a {kind} profile: a {kind} profile is compared with a {kind} profile",
                        base.display()
                    ))
                })?;
            tree.add(&base_profile.stacks, true);
            let (a, b) = (summary(&base_profile), summary(profile));
            Comparison {
                subtitle: format!("against {} ({})", base.display(), a.describe()),
                base_total: base_profile.stacks.total(),
                report: Some((diff::compare(&a, &b, String::new(), false, advise::diff_options()), 1)),
                trend: None,
            }
        }
        Baseline::History(..) => {
            return Err(Error::Input(format!(
                "report --history reads CPU profiles; compare a {kind} profile with --base"
            )))
        }
    };
    let functions = stacks.functions();
    let data = script_data(stacks, &functions, &mut tree, &HashMap::new(), &comparison, &[]);
    let mut html = String::with_capacity(data.len() + 32 * 1024);
    html.push_str(&heading(stacks, opts, &comparison));
    html.push_str(GRAPH_SECTION);
    html.push_str(TOP_SECTION);
    if let Some((report, _)) = &comparison.report {
        html.push_str(&diff_section(report, &comparison.subtitle));
    }
    let _ = write!(
        html,
        "<script type=\"application/json\" id=\"data\">{data}</script>\n<script>{SCRIPT}</script>\n</body></html>\n"
    );
    Ok(html)
}

/// The kind of profile a unit belongs to, for messages and for matching a baseline.
fn kind(unit: Unit) -> &'static str {
    match unit {
        Unit::Contention { .. } => "contention",
        _ => "heap",
    }
}

/// The document's head and the page header: title, what the widths are, the totals and the
/// navigation.
fn heading(stacks: &Stacks, opts: &Options, comparison: &Comparison) -> String {
    let unit = stacks.unit;
    let label = |n: u64| Scale::label_alone(unit, n);
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\"><title>cpuprof: {t}</title><style>{STYLE}</style></head>\n<body>\n\
<header><h1>{t}</h1><p>{}. Total: {} {}{}{}. Widths are {} ({}); hover for numbers, click to zoom. Hints and source \
listings are given for CPU profiles.</p>\n<nav>",
        escape(heap_heading(unit).trim_end()),
        label(stacks.total()),
        unit.name(),
        if opts.filters.active() {
            format!("; the filters kept {}", label(stacks.kept()))
        } else {
            String::new()
        },
        if comparison.subtitle.is_empty() {
            String::new()
        } else {
            format!(", {}", escape(&comparison.subtitle))
        },
        unit.name(),
        unit.counts(),
        t = escape(&opts.title)
    );
    let mut nav = vec![("graph", "Flame graph"), ("top", "Functions")];
    if comparison.report.is_some() {
        nav.push(("diff", "Changes"));
    }
    for (id, label) in nav {
        let _ = write!(html, "<a href=\"#{id}\">{label}</a>");
    }
    html.push_str("</nav></header>\n");
    html
}
