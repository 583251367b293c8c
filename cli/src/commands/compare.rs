//! The commands that judge a profile against others: `diff`, `advise`, `report` and
//! `history`.

use crate::analysis::{advise as advising, diff as diffing, history as epochs_over_time};
use crate::args::{AdviceFormat, AdviseArgs, DiffArgs, HistoryArgs, ReportArgs};
use crate::error::{Error, Result};
use crate::input::{self, db::Database, epochs};
use crate::model::filters;
use crate::model::stacks::Stacks;
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
    let seen = |profile: &Profile, units: f64| {
        let stacks = Stacks::symbolise(profile, &locator).filter(&a.filters);
        diffing::Summary::new(
            &stacks,
            profile.records,
            profile.maps.signal_weights,
            units,
            opts.cumulative,
            tick_us,
        )
    };
    let summary = |path: &Path, units: f64| -> Result<diffing::Summary> {
        Ok(seen(&input::read_profile(path, &locator)?, units))
    };
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
            let header = format!(
                "{} ({}) against {} profiles in {} (tick {tick_us} us)",
                new.display(),
                latest.describe(),
                past.len(),
                dir.display()
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
            let header = format!(
                "{} ({}) -> {} ({}) (tick {tick_us} us)",
                base.display(),
                before.describe(),
                new.display(),
                after.describe()
            );
            diffing::compare(&before, &after, header, criteria.units.is_some(), opts)
        }
    };
    print!("{}", report.render(opts));
    if criteria.fail_on.is_empty() {
        return Ok(if report.significant().next().is_some() { 3 } else { 0 });
    }
    let failures = report.failures(&criteria.fail_on);
    for failure in &failures {
        println!("FAIL {failure}");
    }
    Ok(if failures.is_empty() { 0 } else { 3 })
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
    let page = html::page(&a.file, &input::read_bytes(&a.file)?, &baseline, &opts)?;
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
