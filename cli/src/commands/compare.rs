//! The commands that judge a profile against others: `diff`, `advise`, `report` and
//! `history`.

use crate::analysis::gates::Gate;
use crate::analysis::{advise as advising, diff as diffing, history as epochs_over_time};
use crate::args::{AdviceFormat, AdviseArgs, DiffArgs, HistoryArgs, ReportArgs};
use crate::error::{Error, Result};
use crate::input::{self, db::Database, epochs, heap};
use crate::model::filters;
use crate::model::stacks::Stacks;
use crate::model::unit::Unit;
use crate::render::html;
use crate::symbols::Locator;
use cpuprof::format::Profile;
use std::path::Path;

pub fn diff(a: DiffArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let criteria = a.criteria;
    let opts = diffing::Options {
        cumulative: !criteria.flat,
        alpha: criteria.alpha,
        confidence: criteria.confidence,
        rows: criteria.count,
    };
    let tick_us = criteria.tick.us();
    let seen_with = |profile: &Profile, units: f64, filters: &filters::Filters| {
        let kept = filters::by_labels(profile, filters);
        let stacks = Stacks::symbolise(kept.as_ref().unwrap_or(profile), &locator).filter(filters);
        diffing::Summary::new(
            &stacks,
            profile.records,
            profile.maps.signal_weights,
            units,
            opts.cumulative,
            tick_us,
        )
    };
    let seen = |profile: &Profile, units: f64| seen_with(profile, units, &a.filters);
    let index = a.sample_index.value;
    // A heap profile: its value (--sample-index) per function, its sampled objects the
    // observations.
    let summary = |path: &Path, units: f64| -> Result<diffing::Summary> {
        let source = input::Source::open(path)?;
        if let Some(w) = input::Weighted::read(path, &source, index, &locator, &a.filters)? {
            return Ok(diffing::Summary::heap(&w.stacks, &w.lines, units, opts.cumulative));
        }
        heap::cpu_takes_no_index(index)?;
        Ok(seen(&input::raw::read_source(path, &source, &locator)?, units))
    };
    let check = |first: &diffing::Summary, second: &diffing::Summary, names: (&Path, &Path)| {
        same_kind(first, second, names, &criteria.fail_on)
    };
    if let Some(key) = &a.by {
        let (base, new) = (
            a.base.as_deref().ok_or(Error::Usage("diff needs BASE and NEW"))?,
            a.new.as_deref().ok_or(Error::Usage("diff needs BASE and NEW"))?,
        );
        heap::cpu_takes_no_index(index)?;
        let read = |path: &Path| -> Result<Profile> {
            let source = input::Source::open(path)?;
            if heap::is_heap(&source)? || input::contention::is_contention(&source)? {
                return Err(Error::Usage(
                    "diff --by reads CPU profiles: heap and contention profiles carry no labels",
                ));
            }
            input::raw::read_source(path, &source, &locator)
        };
        let (first, second) = (read(base)?, read(new)?);
        let (units_a, units_b) = criteria.units.unwrap_or((1.0, 1.0));
        let mut status = 0;
        for value in label_values(key, &[&first, &second]) {
            match &value {
                Some(v) => println!("== {key}={v}"),
                None => println!("== without {key}"),
            }
            let group = filters::Filters {
                group: Some((key.clone(), value)),
                ..a.filters.clone()
            };
            let (before, after) = (seen_with(&first, units_a, &group), seen_with(&second, units_b, &group));
            check(&before, &after, (base, new))?;
            let header = pair_header((base, &before), (new, &after), tick_us);
            let report = diffing::compare(&before, &after, header, criteria.units.is_some(), opts);
            println!("{}", report.render(opts));
            status = status.max(exit_status(&report, &criteria.fail_on));
        }
        return Ok(status);
    }
    let report = match a.history {
        Some(dir) => {
            // With --history the single positional argument is NEW.
            let new = a
                .new
                .or(a.base)
                .ok_or(Error::Usage("diff --history needs the NEW profile"))?;
            let past = if Database::is_database(&dir) {
                epochs::history(&dir, &a.selection, &new, &locator, &|_, _, p| seen(p, 1.0))?
            } else {
                input::read_history(&dir, &|path: &Path| summary(path, 1.0))?
            };
            let latest = summary(&new, 1.0)?;
            for earlier in &past {
                check(earlier, &latest, (&dir, &new))?;
            }
            let header = format!(
                "{} ({}) against {} profiles in {}{}",
                new.display(),
                latest.describe(),
                past.len(),
                dir.display(),
                tick_note(&latest, tick_us)
            );
            diffing::against_history(&past, &latest, header, opts)
        }
        None => {
            let (base, new) = (
                a.base.ok_or(Error::Usage("diff needs BASE and NEW"))?,
                a.new.ok_or(Error::Usage("diff needs BASE and NEW"))?,
            );
            let (units_a, units_b) = criteria.units.unwrap_or((1.0, 1.0));
            let (before, after) = (summary(&base, units_a)?, summary(&new, units_b)?);
            check(&before, &after, (&base, &new))?;
            let header = pair_header((&base, &before), (&new, &after), tick_us);
            diffing::compare(&before, &after, header, criteria.units.is_some(), opts)
        }
    };
    print!("{}", report.render(opts));
    Ok(exit_status(&report, &criteria.fail_on))
}

/// The heading of a diff of two profiles: each with what it holds, and the tick.
fn pair_header(before: (&Path, &diffing::Summary), after: (&Path, &diffing::Summary), tick_us: u64) -> String {
    format!(
        "{} ({}) -> {} ({}){}",
        before.0.display(),
        before.1.describe(),
        after.0.display(),
        after.1.describe(),
        tick_note(after.1, tick_us)
    )
}

/// The values of label `key` in `profiles`, most samples first (over both), then `None` if
/// some samples lack the key.
fn label_values(key: &str, profiles: &[&Profile]) -> Vec<Option<String>> {
    let mut samples: std::collections::HashMap<Option<String>, u64> = std::collections::HashMap::new();
    for sample in profiles.iter().flat_map(|p| &p.samples) {
        let value = sample
            .labels
            .as_deref()
            .and_then(|l| l.iter().find(|(k, _)| k == key))
            .map(|(_, v)| v.clone());
        *samples.entry(value).or_default() += sample.count;
    }
    let mut values: Vec<(Option<String>, u64)> = samples.into_iter().collect();
    values.sort_by(|a, b| {
        a.0.is_none()
            .cmp(&b.0.is_none())
            .then(b.1.cmp(&a.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    values.into_iter().map(|(v, _)| v).collect()
}

/// 3 when the gates fail (each printed), or with no gates when a change is significant.
fn exit_status(report: &diffing::Report, fail_on: &[Gate]) -> u8 {
    if fail_on.is_empty() {
        return if report.significant().next().is_some() { 3 } else { 0 };
    }
    let failures = report.failures(fail_on);
    for failure in &failures {
        println!("FAIL {failure}");
    }
    if failures.is_empty() {
        0
    } else {
        3
    }
}

/// Profiles of one kind only, and no time in seconds for a heap profile.
fn same_kind(
    first: &diffing::Summary,
    second: &diffing::Summary,
    names: (&Path, &Path),
    fail_on: &[Gate],
) -> Result<()> {
    let kind = |s: &diffing::Summary| s.unit().profile_kind();
    if first.unit().profile_kind() != second.unit().profile_kind() {
        return Err(Error::Input(format!(
            "{} is {} and {} {}: diff compares profiles of one kind",
            names.0.display(),
            kind(first),
            names.1.display(),
            kind(second)
        )));
    }
    if first.unit() != Unit::Samples && fail_on.iter().any(|g| matches!(g, Gate::Seconds(_))) {
        return Err(Error::Usage(
            "--fail-on growth=SECONDS applies to CPU profiles; for heap and contention profiles use growth=PERCENT% or share=POINTS",
        ));
    }
    Ok(())
}

/// The kernel tick a CPU profile's observations assume, as the header says it; nothing for a
/// heap profile, whose samples do not wait for a tick.
fn tick_note(summary: &diffing::Summary, tick_us: u64) -> String {
    match summary.unit() {
        Unit::Samples => format!(" (tick {tick_us} us)"),
        _ => String::new(),
    }
}

pub fn advise(a: AdviseArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let filters = &a.filters;
    let mut profile = input::read_profile(&a.file, &locator)?;
    if filters.active() {
        profile = filters::profile(&profile, &locator, filters);
    }
    let analysis = advising::Analysis::new(&profile, &locator);
    let tick_us = a.tick.us();
    let summary = |stacks: &Stacks, p: &Profile| {
        diffing::Summary::new(stacks, p.records, p.maps.signal_weights, 1.0, true, tick_us)
    };
    // A past profile as the new one is seen: filtered alike.
    let past_summary = |p: &Profile| {
        let p = if filters.active() {
            &filters::profile(p, &locator, filters)
        } else {
            p
        };
        summary(&Stacks::symbolise(p, &locator), p)
    };
    let report = match &a.history {
        Some(dir) => {
            let past = if Database::is_database(dir) {
                epochs::history(dir, &a.selection, &a.file, &locator, &|_, _, p| past_summary(p))?
            } else {
                input::read_history(dir, &|path: &Path| {
                    Ok(past_summary(&input::read_profile(path, &locator)?))
                })?
            };
            let latest = summary(&analysis.stacks, &profile);
            Some((
                diffing::against_history(&past, &latest, String::new(), advising::diff_options()),
                past.len(),
            ))
        }
        None => None,
    };
    let advice = advising::advise(&analysis, report.as_ref().map(|(r, n)| (r, *n)));
    match a.format {
        AdviceFormat::Text => print!("{}", advice.text(a.min_share / 100.0, a.count)),
        AdviceFormat::Json => print!("{}", advice.json()),
    }
    Ok(0)
}

pub fn report(a: ReportArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let baseline = match (a.base, a.history) {
        (Some(base), _) => html::Baseline::Profile(base),
        (None, Some(dir)) => html::Baseline::History(dir, a.selection),
        (None, None) => html::Baseline::None,
    };
    let opts = html::Options {
        locator: &locator,
        filters: &a.filters,
        tick_us: a.tick.us(),
        title: a.file.display().to_string(),
    };
    let source = input::Source::open(&a.file)?;
    let index = a.sample_index.value;
    let page = match input::Weighted::read(&a.file, &source, index, &locator, &a.filters)? {
        Some(profile) => {
            let base = |path: &Path| -> Result<Option<input::Weighted>> {
                input::Weighted::read(path, &input::Source::open(path)?, index, &locator, &a.filters)
            };
            html::weighted::page(&profile, &baseline, &base, &opts)?
        }
        None => {
            heap::cpu_takes_no_index(a.sample_index.value)?;
            html::page(&a.file, &source.whole()?, &baseline, &opts)?
        }
    };
    std::fs::write(&a.output, page).map_err(|e| Error::write(&a.output, e))?;
    eprintln!("wrote {}", a.output.display());
    Ok(0)
}

pub fn history(a: HistoryArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let database = Database::open(&a.db)?;
    let mut epochs = Vec::new();
    let program = epochs::for_each(&database, &a.selection, &locator, &mut |name, processes, profile| {
        epochs.push(epochs_over_time::Epoch {
            name: name.to_string(),
            processes,
            stacks: Stacks::symbolise(&profile, &locator).filter(&a.filters),
            records: profile.records,
            weights: profile.maps.signal_weights,
        });
        Ok(())
    })?;
    let opts = diffing::Options {
        cumulative: !a.flat,
        alpha: a.alpha,
        confidence: a.confidence,
        rows: a.count,
    };
    let tick_us = a.tick.us();
    let window = usize::try_from(a.window).unwrap_or(usize::MAX);
    let result = epochs_over_time::history(&epochs, opts, window, a.count, tick_us);
    println!("{program} in {} (tick {tick_us} us)", a.db.display());
    print!("{}", result.table(opts, window));
    std::fs::write(&a.output, result.svg()).map_err(|e| Error::write(&a.output, e))?;
    eprintln!("wrote {}", a.output.display());
    Ok(if result.flags.is_empty() { 0 } else { 3 })
}
