//! The page's sections that are tables and text: the hints, the changes against the baseline
//! and the trend over a history.

use super::DIFF_ROWS;
use crate::analysis::advise::{Advice, Hint};
use crate::analysis::diff::{self, Report};
use crate::analysis::history::{self, Epoch};
use crate::model::unit::Unit;
use crate::render::markup::escape;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

pub fn trend_section(epochs: &[Epoch], tick_us: u64) -> String {
    let opts = diff::Options {
        cumulative: true,
        alpha: 0.001,
        confidence: 0.95,
        rows: 8,
    };
    let window = 8;
    let result = history::history(epochs, opts, window, 8, tick_us);
    let mut html = String::from(
        "<section id=\"trend\"><h2>Trend</h2><p class=\"help\">Cumulative share of the top functions in each \
profile of the history, this profile last; circled where a share left its usual range (as <code>cpuprof \
history</code> judges).</p>",
    );
    html.push_str(&result.svg());
    let _ = writeln!(
        html,
        "<pre class=\"table\">{}</pre></section>",
        escape(&result.table(opts, window))
    );
    html
}

pub fn hints_section(advice: &Advice, sources: &HashMap<&str, String>, report: Option<&Report>) -> String {
    let mut html = String::from("<section id=\"hints\"><h2>Hints</h2>");
    if advice.hints.is_empty() {
        html.push_str("<p>No hint: nothing known-costly, concentrated or grown.</p></section>\n");
        return html;
    }
    html.push_str(
        "<p class=\"help\">What could be optimised, ranked by the share of all samples at stake; each links to \
its evidence.</p><ol class=\"hints\">",
    );
    let grown: BTreeSet<&str> = report
        .map(|r| {
            r.rows
                .iter()
                .filter(|r| r.share.significant)
                .map(|r| r.function.as_str())
                .collect()
        })
        .unwrap_or_default();
    for (stake, hint) in &advice.hints {
        let lines = advice.lines(hint);
        let _ = write!(
            html,
            "<li><span class=\"stake\">{:.1} %</span> {}",
            100.0 * stake,
            escape(&lines[0])
        );
        for line in &lines[1..] {
            let _ = write!(html, "<br><span class=\"detail\">{}</span>", escape(line));
        }
        html.push_str("<br><span class=\"evidence\">");
        match hint {
            Hint::Growth { row, .. } => {
                html.push_str(&function_link(&row.function, "show in the flame graph"));
                if grown.contains(row.function.as_str()) {
                    let _ = write!(html, " · <a href=\"#diff\">the change table</a>");
                }
            }
            Hint::Slower { functions, .. } => {
                let re = alternation(functions);
                html.push_str(&search_link(&re, "show them in the flame graph"));
            }
            Hint::Lines { function, .. } => {
                html.push_str(&function_link(function, "show in the flame graph"));
                if let Some(anchor) = sources.get(function.as_str()) {
                    let _ = write!(html, " · <a href=\"#{anchor}\">its source, line by line</a>");
                }
            }
            Hint::Family(i) => {
                let family = advice.family(*i);
                let members: Vec<String> = family.leaves.iter().map(|(n, _)| n.clone()).collect();
                html.push_str(&search_link(
                    &alternation(&members),
                    "find its functions in the flame graph (the search totals them)",
                ));
                if let Some((Some(caller), _)) = family.callers.first() {
                    let _ = write!(html, " · {}", function_link(caller, "its main caller"));
                }
            }
        }
        html.push_str("</span></li>");
    }
    html.push_str("</ol></section>\n");
    html
}

pub fn diff_section(report: &Report, subtitle: &str) -> String {
    // CPU seconds, or a heap profile's value as `diff` prints it.
    let amount_head = match report.unit {
        Unit::Samples => "time before (s)".to_string(),
        unit => format!("{} before", unit.name()),
    };
    let amount = |v: f64| match report.unit {
        Unit::Samples => format!("{v:.3}"),
        _ => report.amount(v, false),
    };
    let mut html = format!(
        "<section id=\"diff\"><h2>Changes</h2><p class=\"help\">This profile {} (cumulative shares: a function and \
what it calls). A change marked * is significant after Holm's correction over all {} functions tested; the \
differential flame graph colours the stacks of those functions red where they grew and blue where they shrank, \
other changes pale.</p><table class=\"diff\"><thead><tr><th>function</th><th>share before</th><th>after</th>\
<th>change (points)</th><th>interval</th><th></th><th>{}</th><th>after</th></tr></thead><tbody>",
        escape(subtitle),
        report.tested,
        escape(&amount_head)
    );
    let mut rows: Vec<&diff::Row> = report.rows.iter().collect();
    rows.sort_by(|a, b| {
        b.share
            .significant
            .cmp(&a.share.significant)
            .then(b.share.change().abs().total_cmp(&a.share.change().abs()))
            .then(a.function.cmp(&b.function))
    });
    let shown = rows.iter().filter(|r| r.share.significant).count().max(DIFF_ROWS);
    for row in rows.into_iter().take(shown) {
        let s = &row.share;
        let class = match (s.significant, s.change() > 0.0) {
            (true, true) => "grown",
            (true, false) => "shrank",
            _ => "same",
        };
        let _ = write!(
            html,
            "<tr class=\"{class}\"><td>{}</td><td>{:.2} %</td><td>{:.2} %</td><td>{:+.2}</td><td>[{:+.2}, {:+.2}]</td>\
<td>{}</td><td>{}</td><td>{}</td></tr>",
            function_link(&row.function, &row.function),
            s.before,
            s.after,
            s.change(),
            s.low,
            s.high,
            if s.significant { "*" } else { "" },
            amount(row.time.before),
            amount(row.time.after)
        );
    }
    html.push_str("</tbody></table></section>\n");
    html
}

/// A regular expression matching exactly these names.
pub fn alternation(names: &[String]) -> String {
    let escaped: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
    format!("^(?:{})$", escaped.join("|"))
}

fn function_link(name: &str, text: &str) -> String {
    format!(
        "<a href=\"#graph\" class=\"fn\" data-fn=\"{}\">{}</a>",
        escape(name),
        escape(text)
    )
}

fn search_link(re: &str, text: &str) -> String {
    format!(
        "<a href=\"#graph\" class=\"search\" data-re=\"{}\">{}</a>",
        escape(re),
        escape(text)
    )
}
