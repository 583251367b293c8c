//! `cpuprof report`: one self-contained HTML page of a profile, to open on any machine.
//!
//! Everything is inline (style, script, data; no network, no server, no framework). The page
//! holds: the hints of `advise`, each linked to its evidence; an interactive flame graph
//! (click to zoom, search that highlights and totals its matches) with the callers and callees
//! of a selected function; the sortable function table; the source listings of the hottest
//! functions (from `list`); with a baseline profile, a differential flame graph and the
//! `diff` table; with a history, the same against the history and its trend chart.
//!
//! A heap or contention profile gets the same page without hints and source ([`weighted`]):
//! widths are its value (bytes or objects, delay or waits).
//!
//! The reports are computed here by the commands' own code (`advise`, `list`, `diff`,
//! `history`), so the page and the commands cannot disagree. What the script needs (the call
//! tree, the functions, which changed) travels as one JSON block; what it does not redraw
//! (hints, tables of numbers, listings, the trend chart) is written as HTML here.

use crate::error::Result;
mod listing;
pub mod weighted;

use crate::render::markup::escape;
mod sections;
mod tree;

use crate::analysis::advise::{self, Advice, Hint};
use crate::analysis::diff::{self, Report};
use crate::analysis::history::Epoch;
use crate::model::filters::Filters;
use crate::model::stacks::{Functions, Stacks};
use crate::model::unit::Unit;
use crate::render::json;
use crate::symbols::Locator;
use cpuprof::format::Profile;
use sections::{alternation, diff_section, hints_section, trend_section};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use tree::Tree;

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// Functions listed with their source: the hottest by self time (and those a hint names).
const LISTED: usize = 6;
/// Rows of the diff table: every significant change, then the largest others up to this.
const DIFF_ROWS: usize = 25;

/// What the profile is compared with.
pub enum Baseline {
    None,
    /// An earlier profile (`--base`).
    Profile(PathBuf),
    /// A directory of earlier profiles or a profile database (`--history`).
    History(PathBuf, crate::input::db::Selection),
}

/// How the page is made.
pub struct Options<'a> {
    pub locator: &'a Locator,
    pub filters: &'a Filters,
    pub tick_us: u64,
    /// The page's heading: what was profiled.
    pub title: String,
}

/// The page for the raw profile `bytes` read from `file`.
pub fn page(file: &Path, bytes: &[u8], baseline: &Baseline, opts: &Options) -> Result<String> {
    let (locator, filters) = (opts.locator, opts.filters);
    let mut profile = crate::input::raw::read(file, bytes, locator)?;
    if filters.active() {
        profile = crate::model::filters::profile(&profile, locator, filters);
    }
    let analysis = advise::Analysis::new(&profile, locator);
    let mut tree = Tree::new();
    tree.add(&analysis.stacks, false);
    let groups = label_groups(&analysis, &mut tree);
    let comparison = compare(file, &profile, &analysis.stacks, baseline, opts, &mut tree)?;
    let growth = match (baseline, &comparison.report) {
        (Baseline::History(..), Some((report, runs))) => Some((report, *runs)),
        _ => None,
    };
    let advice = advise::advise(&analysis, growth);
    let functions = analysis.stacks.functions();
    let routines = listings(file, bytes, &listed(&functions, &advice), locator, filters);
    let anchors: HashMap<&str, String> = routines
        .iter()
        .enumerate()
        .map(|(i, r)| (r.function.as_str(), format!("src-{i}")))
        .collect();
    let data = script_data(&analysis.stacks, &functions, &mut tree, &anchors, &comparison, &groups);
    let mut html = String::with_capacity(data.len() + 64 * 1024);
    html.push_str(&heading(&analysis.stacks, opts, &comparison));
    html.push_str(&hints_section(
        &advice,
        &anchors,
        comparison.report.as_ref().map(|(r, _)| r),
    ));
    html.push_str(GRAPH_SECTION);
    html.push_str(TOP_SECTION);
    if let Some((report, _)) = &comparison.report {
        html.push_str(&diff_section(report, &comparison.subtitle));
    }
    if let Some(trend) = &comparison.trend {
        html.push_str(trend);
    }
    html.push_str("<section id=\"source\"><h2>Source of the hottest functions</h2>");
    if routines.is_empty() {
        html.push_str("<p>No function has self samples to list.</p>");
    }
    for (i, routine) in routines.iter().enumerate() {
        html.push_str(&routine.html(&format!("src-{i}")));
    }
    html.push_str("</section>\n");
    let _ = write!(
        html,
        "<script type=\"application/json\" id=\"data\">{data}</script>\n<script>{SCRIPT}</script>\n</body></html>\n"
    );
    Ok(html)
}

/// Label values the page lets the reader pick, most samples first.
const LABEL_GROUPS: usize = 64;

/// Adds the samples of each label value (the [`LABEL_GROUPS`] largest) to `tree` as a group;
/// returns `[key,value,samples]` for each, in the groups' order, for the page's picker.
fn label_groups(analysis: &advise::Analysis, tree: &mut Tree) -> Vec<String> {
    let mut groups: Vec<(&(String, String), &Stacks)> = analysis.by_label.iter().collect();
    groups.sort_by(|a, b| b.1.total().cmp(&a.1.total()).then(a.0.cmp(b.0)));
    groups
        .into_iter()
        .take(LABEL_GROUPS)
        .map(|((key, value), stacks)| {
            tree.add_group(stacks);
            format!("[{},{},{}]", json::string(key), json::string(value), stacks.total())
        })
        .collect()
}

/// The profile against its baseline: what the page says it is compared with, the baseline's
/// samples (added to `tree` as its second width), the comparison and the number of runs
/// behind it, and, against a history, the trend section.
#[derive(Default)]
struct Comparison {
    subtitle: String,
    base_total: u64,
    report: Option<(Report, usize)>,
    trend: Option<String>,
}

fn compare(
    file: &Path,
    profile: &Profile,
    stacks: &Stacks,
    baseline: &Baseline,
    opts: &Options,
    tree: &mut Tree,
) -> Result<Comparison> {
    let (locator, filters) = (opts.locator, opts.filters);
    let summary =
        |s: &Stacks, p: &Profile| diff::Summary::new(s, p.records, p.maps.signal_weights, 1.0, true, opts.tick_us);
    match baseline {
        Baseline::None => Ok(Comparison::default()),
        Baseline::Profile(base) => {
            let mut base_profile = crate::input::read_profile(base, locator)?;
            if filters.active() {
                base_profile = crate::model::filters::profile(&base_profile, locator, filters);
            }
            let base_stacks = Stacks::symbolise(&base_profile, locator);
            tree.add(&base_stacks, true);
            let (a, b) = (summary(&base_stacks, &base_profile), summary(stacks, profile));
            Ok(Comparison {
                subtitle: format!("against {} ({})", base.display(), a.describe()),
                base_total: base_stacks.total(),
                report: Some((diff::compare(&a, &b, String::new(), false, advise::diff_options()), 1)),
                trend: None,
            })
        }
        Baseline::History(dir, selection) => {
            let mut epochs = history_epochs(dir, selection, file, locator, filters)?;
            let mut pooled = Stacks::new(stacks.period_us);
            let mut summaries = Vec::new();
            for epoch in &epochs {
                for (chain, count) in epoch.stacks.chains() {
                    pooled.push(chain.iter().map(|&id| &epoch.stacks.names()[id as usize]), count);
                }
                summaries.push(diff::Summary::new(
                    &epoch.stacks,
                    epoch.records,
                    epoch.weights,
                    1.0,
                    true,
                    opts.tick_us,
                ));
            }
            tree.add(&pooled, true);
            let report = diff::against_history(
                &summaries,
                &summary(stacks, profile),
                String::new(),
                advise::diff_options(),
            );
            let subtitle = format!(
                "against the {} profiles of {} (pooled as the baseline)",
                epochs.len(),
                dir.display()
            );
            let runs = epochs.len();
            // The profile itself is the last point of the trend.
            epochs.push(Epoch {
                name: "this profile".to_string(),
                processes: 1,
                stacks: Stacks::symbolise(profile, locator),
                records: profile.records,
                weights: profile.maps.signal_weights,
            });
            Ok(Comparison {
                subtitle,
                base_total: pooled.total(),
                report: Some((report, runs)),
                trend: Some(trend_section(&epochs, opts.tick_us)),
            })
        }
    }
}

/// The functions whose source is listed: the hottest by self time, and those the hints
/// point at.
fn listed(functions: &Functions, advice: &Advice) -> Vec<String> {
    let mut by_flat: Vec<&(String, crate::model::stacks::Counts)> =
        functions.counts.iter().filter(|(_, c)| c.flat > 0).collect();
    by_flat.sort_by(|a, b| b.1.flat.cmp(&a.1.flat).then(a.0.cmp(&b.0)));
    let mut listed: Vec<String> = by_flat.iter().take(LISTED).map(|(n, _)| n.clone()).collect();
    for (_, hint) in &advice.hints {
        if let Hint::Lines { function, .. } = hint {
            if !listed.contains(function) {
                listed.push(function.clone());
            }
        }
    }
    listed
}

/// The page script's data, as JSON safe inside `<script>`; `labels`: the label groups of the
/// tree ([`label_groups`]).
fn script_data(
    stacks: &Stacks,
    functions: &Functions,
    tree: &mut Tree,
    anchors: &HashMap<&str, String>,
    comparison: &Comparison,
    labels: &[String],
) -> String {
    let mut data = format!(
        "{{\"total\":{},\"kept\":{},\"period_us\":{},\"base_total\":{},{}",
        stacks.total(),
        stacks.kept(),
        stacks.period_us,
        comparison.base_total,
        tree.json()
    );
    if let Unit::Heap { value, .. } = stacks.unit {
        // What the widths count, for the script's labels (a CPU profile's are samples).
        let _ = write!(
            data,
            ",\"unit\":\"{}\",\"value\":\"{}\"",
            stacks.unit.counts(),
            value.name()
        );
    }
    let rows: Vec<String> = functions
        .counts
        .iter()
        .map(|(name, c)| format!("[{},{},{}]", tree.id(name), c.flat, c.cum))
        .collect();
    let _ = write!(data, ",\"functions\":[{}]", rows.join(","));
    let sources: Vec<String> = anchors
        .iter()
        .map(|(name, anchor)| format!("\"{}\":{}", tree.id(name), json::string(anchor)))
        .collect();
    let _ = write!(data, ",\"sources\":{{{}}}", sources.join(","));
    let (mut grown, mut shrank) = (Vec::new(), Vec::new());
    if let Some((report, _)) = &comparison.report {
        for row in report.rows.iter().filter(|r| r.share.significant) {
            let id = tree.id(&row.function);
            if row.share.change() > 0.0 {
                grown.push(id.to_string());
            } else {
                shrank.push(id.to_string());
            }
        }
    }
    let _ = write!(
        data,
        ",\"comparison\":{},\"grown\":[{}],\"shrank\":[{}]",
        comparison.report.is_some(),
        grown.join(","),
        shrank.join(",")
    );
    let _ = write!(data, ",\"labels\":[{}]", labels.join(","));
    let names: Vec<String> = tree.names().iter().map(|n| json::string(n)).collect();
    let _ = write!(data, ",\"names\":[{}]}}", names.join(","));
    // Inside <script>, `</script>` or `<!--` in a name would end or confuse the block: no `<`
    // is left unescaped (it appears only inside strings).
    data.replace('<', "\\u003c")
}

/// The document's head and the page header: title, totals and the navigation.
fn heading(stacks: &Stacks, opts: &Options, comparison: &Comparison) -> String {
    let per_sample = match &stacks.event {
        Some(e) => format!(
            "{} {} events at {} per sample",
            stacks.total().saturating_mul(e.period),
            escape(&e.name),
            e.period
        ),
        None => format!(
            "{:.2} s of CPU at {} us per sample",
            stacks.total() as f64 * stacks.period_us as f64 / 1e6,
            stacks.period_us
        ),
    };
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\"><title>cpuprof: {t}</title><style>{STYLE}</style></head>\n<body>\n\
<header><h1>{t}</h1><p>{} samples, {per_sample}{}{}. Widths are samples; \
hover for numbers, click to zoom.</p>\n<nav>",
        stacks.total(),
        if opts.filters.active() {
            format!("; the filters kept {} samples", stacks.kept())
        } else {
            String::new()
        },
        if comparison.subtitle.is_empty() {
            String::new()
        } else {
            format!(", {}", escape(&comparison.subtitle))
        },
        t = escape(&opts.title)
    );
    let mut nav = vec![("hints", "Hints"), ("graph", "Flame graph"), ("top", "Functions")];
    if comparison.report.is_some() {
        nav.push(("diff", "Changes"));
    }
    if comparison.trend.is_some() {
        nav.push(("trend", "Trend"));
    }
    nav.push(("source", "Source"));
    for (id, label) in nav {
        let _ = write!(html, "<a href=\"#{id}\">{label}</a>");
    }
    html.push_str("</nav></header>\n");
    html
}

/// Where `cpuprof record --html` puts the page of `profile`: beside it, `.prof` replaced by
/// (or else followed by) `.html`.
pub fn beside(profile: &Path) -> PathBuf {
    match profile.extension() {
        Some(ext) if ext == "prof" => profile.with_extension("html"),
        _ => {
            let mut name = profile.as_os_str().to_owned();
            name.push(".html");
            PathBuf::from(name)
        }
    }
}

const TOP_SECTION: &str = "<section id=\"top\"><h2>Functions</h2><p class=\"help\">Click a column to sort, a name to \
show it in the flame graph.</p><table id=\"toptable\"><thead><tr><th data-k=\"flat\">flat</th><th data-k=\"flat\">flat%</th>\
<th data-k=\"cum\">cum</th><th data-k=\"cum\">cum%</th><th data-k=\"name\">function</th></tr></thead><tbody></tbody></table></section>\n";

const GRAPH_SECTION: &str = "<section id=\"graph\"><h2>Flame graph</h2>\
<div class=\"toolbar\"><input id=\"search\" type=\"search\" placeholder=\"Search functions (regular expression)\" \
autocomplete=\"off\"><span id=\"matched\"></span><button id=\"reset\" type=\"button\">Reset zoom</button>\
<span id=\"picker\" hidden><label>Samples <select id=\"labels\"></select></label> <span id=\"labelshare\"></span></span>\
<span id=\"legend\"></span></div>\n<div id=\"flame\" class=\"flame\"></div>\n\
<div id=\"selected\" hidden><h3>Callers of <span class=\"selname\"></span></h3><p class=\"help\">The function \
at the top, what called it below (each stack counted once, however often the function recurs).</p>\
<div id=\"callers\" class=\"flame\"></div><h3>Callees of <span class=\"selname\"></span></h3>\
<div id=\"callees\" class=\"flame\"></div></div>\n<div id=\"tip\" class=\"tip\" hidden></div></section>\n";

/// The profiles of `dir` as epochs of a trend: a database's epochs of the program (that of
/// `--program`, or of `file`'s name), or each profile of a directory in name order.
fn history_epochs(
    dir: &Path,
    selection: &crate::input::db::Selection,
    file: &Path,
    locator: &Locator,
    filters: &Filters,
) -> Result<Vec<Epoch>> {
    // An epoch as the new profile is seen: filtered alike.
    let epoch = |name: String, processes: usize, profile: &Profile| {
        let filtered;
        let profile = if filters.active() {
            filtered = crate::model::filters::profile(profile, locator, filters);
            &filtered
        } else {
            profile
        };
        Epoch {
            name,
            processes,
            stacks: Stacks::symbolise(profile, locator),
            records: profile.records,
            weights: profile.maps.signal_weights,
        }
    };
    if !crate::input::db::Database::is_database(dir) {
        return crate::input::read_history(dir, &|path: &Path| {
            let name = crate::symbols::file_name(&path.display().to_string()).to_string();
            Ok(epoch(name, 1, &crate::input::read_profile(path, locator)?))
        });
    }
    crate::input::epochs::history(dir, selection, file, locator, &|name, processes, profile| {
        epoch(name.to_string(), processes, profile)
    })
}

/// `list`'s listing of `functions` (one pass over the profile), split per function.
fn listings(
    file: &Path,
    bytes: &[u8],
    functions: &[String],
    locator: &Locator,
    filters: &Filters,
) -> Vec<listing::Routine> {
    if functions.is_empty() {
        return Vec::new();
    }
    let Ok(outline) = crate::input::raw::outline(file, bytes, locator) else {
        return Vec::new();
    };
    let regex = regex::Regex::new(&alternation(functions)).expect("escaped names");
    match crate::analysis::list::list(
        bytes,
        &outline,
        locator,
        &regex,
        &crate::analysis::list::Args::default(),
        filters,
    ) {
        Ok(text) => listing::routines(&text, functions),
        Err(_) => Vec::new(),
    }
}
