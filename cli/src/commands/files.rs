//! The commands about profile files themselves: `merge`, `db`, `dump` and `check` (which
//! checks heap profiles too).

use crate::args::{CheckArgs, DbArgs, DumpArgs, MergeArgs};
use crate::error::{Error, Result};
use crate::input::{self, heap};
use crate::model::merge as merging;
use crate::render::progress::Progress;
use crate::render::text;
use crate::symbols::Locator;

pub fn merge(a: MergeArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let mut profiles = Vec::new();
    let mut progress = Progress::new("reading", a.files.len());
    for (i, f) in a.files.iter().enumerate() {
        progress.update(i);
        profiles.push((f.display().to_string(), input::read_profile(f, &locator)?));
    }
    drop(progress);
    let (bytes, total) = merging::merge(&profiles)?;
    std::fs::write(&a.output, bytes).map_err(|e| Error::write(&a.output, e))?;
    eprintln!(
        "wrote {}: {} profiles, {total} samples",
        a.output.display(),
        profiles.len()
    );
    Ok(0)
}

pub fn db(a: DbArgs) -> Result<u8> {
    print!("{}", input::db::listing(&a.dir, &a.symbols.into())?);
    Ok(0)
}

pub fn dump(a: DumpArgs) -> Result<u8> {
    let source = input::Source::open(&a.file)?;
    if heap::is_heap(&source)? {
        return Err(heap::not_for_heap(&a.file));
    }
    if input::contention::is_contention(&source)? {
        return Err(input::contention::not_for_contention(&a.file));
    }
    let (profile, defect) = source
        .parse_lenient()?
        .map_err(|e| format!("{}: {e}", a.file.display()))?;
    print!("{}", text::dump(&profile));
    match defect {
        Some(e) => Err(format!("{}: {e}", a.file.display()).into()),
        None => Ok(0),
    }
}

pub fn check(a: CheckArgs) -> Result<u8> {
    let file = &a.file;
    let source = input::Source::open(file)?;
    if let Some(profile) = input::contention::read(file, &source)? {
        println!("{}: valid {}", file.display(), input::contention::check(&profile));
        if profile.maps().entries.is_empty() {
            eprintln!(
                "cpuprof: WARNING: {}: no mapped objects (--- Memory map: ---): its addresses cannot be named",
                file.display()
            );
        }
        return Ok(0);
    }
    if let Some(profile) = heap::read(file, &source)? {
        println!("{}: valid {}", file.display(), text::heap_check(&profile));
        if profile.maps().entries.is_empty() {
            eprintln!(
                "cpuprof: WARNING: {}: no mapped objects (MAPPED_LIBRARIES): its addresses cannot be named",
                file.display()
            );
        }
        return Ok(0);
    }
    let summary = input::raw::summary(&source)?.map_err(|(e, read)| {
        // A cut-short file is still a defect here, but the other commands read it.
        let readable = match read {
            Some(read) if read.records > 0 => format!(
                "; top, collapse, convert, flamegraph, merge and diff read the {} records ({} samples) before it",
                read.records, read.total
            ),
            _ => String::new(),
        };
        format!("{}: {e}{readable}", file.display())
    })?;
    let profile = &summary.scan;
    let contents = format!(
        "{} profile, period {} us, {} records, {} distinct stacks, {} samples, {} mappings",
        profile.format,
        profile.period_us,
        profile.records,
        summary.distinct,
        profile.total,
        profile.maps.entries.len()
    );
    // A wall-clock profile whose sampler could not see most threads' state is readable but
    // not what it claims to be: most of its blocked time is missing.
    match &profile.maps.wall_looks {
        Some(w) if w.missing > 0 => {
            let missing = format!(
                "{} of {} looks at threads ({:.1} %) are missing from this wall-clock profile, their \
                 blocked time with them ({})",
                w.missing,
                w.looks,
                100.0 * w.missing_share(),
                w.reasons_text()
            );
            if 2 * w.missing > w.looks {
                println!("{}: INCOMPLETE {contents}: {missing}", file.display());
                Ok(1)
            } else {
                println!("{}: valid {contents}", file.display());
                eprintln!("cpuprof: WARNING: {}: {missing}", file.display());
                Ok(0)
            }
        }
        _ => {
            println!("{}: valid {contents}", file.display());
            Ok(0)
        }
    }
}
