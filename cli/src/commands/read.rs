//! The commands that read one profile and show it: `top`, `peek`, `list`, `collapse`,
//! `flamegraph` and `convert`. All but `list` read heap profiles too (`--sample-index`).

use crate::analysis::{labels, list as listing, peek as peeking};
use crate::args::{CollapseArgs, ConvertArgs, FlamegraphArgs, ListArgs, PeekArgs, Target, TopArgs};
use crate::error::{Error, Result};
use crate::input::{self, epochs, heap, raw};
use crate::model::filters::{self, Filters};
use crate::model::stacks::Functions;
use crate::render::{self, pprof, text};
use crate::symbols::Locator;
use std::path::Path;

pub fn top(a: TopArgs) -> Result<u8> {
    let locator: Locator = a.symbols.clone().into();
    let index = a.sample_index.value;
    if a.by.is_some() || a.tags {
        return top_by_labels(a, &locator);
    }
    let functions = match &a.db.db {
        Some(dir) => {
            heap::cpu_takes_no_index(index)?;
            let (name, bytes) = input::db::merged_selection(dir, &a.db.selection, &locator)?;
            let outline = raw::outline(&name, &bytes, &locator)?;
            Functions::read(&bytes, &outline, &locator, &a.filters)
        }
        None => input::read_functions(&input::given(a.file)?, &locator, &a.filters, index)?,
    };
    print!("{}", text::top(&functions, a.cum, a.count));
    Ok(0)
}

/// `top --tags` and `top --by KEY` of a raw profile, or of a database's selection merged.
fn top_by_labels(a: TopArgs, locator: &Locator) -> Result<u8> {
    heap::cpu_takes_no_index(a.sample_index.value)?;
    let merged;
    let (file, source) = match &a.db.db {
        Some(dir) => {
            let (name, bytes) = input::db::merged_selection(dir, &a.db.selection, locator)?;
            merged = bytes;
            (name, input::Source::bytes(&merged))
        }
        None => {
            let file = input::given(a.file.clone())?;
            let source = input::Source::open(&file)?;
            (file, source)
        }
    };
    let outline = raw::outline_source(&file, &source, locator)?;
    let counts = labels::count(&source, &outline, &a.filters)?;
    let Some(key) = a.by else {
        print!("{}", counts.text());
        return Ok(0);
    };
    for (value, _) in counts.groups(&key) {
        match &value {
            Some(v) => println!("== {key}={v}"),
            None => println!("== without {key}"),
        }
        let filters = Filters {
            group: Some((key.clone(), value)),
            ..a.filters.clone()
        };
        let functions = Functions::read_source(&source, &outline, locator, &filters)?;
        println!("{}", text::top(&functions, a.cum, a.count));
    }
    Ok(0)
}

pub fn peek(a: PeekArgs) -> Result<u8> {
    let stacks = input::read_stacks(&a.file, &a.symbols.into(), &a.filters, a.sample_index.value)?;
    print!("{}", peeking::peek(&stacks, &a.regex));
    Ok(0)
}

pub fn list(a: ListArgs) -> Result<u8> {
    let (locator, bytes) = (a.symbols.into(), input::read_bytes(&a.file)?);
    let outline = raw::outline(&a.file, &bytes, &locator)?;
    print!(
        "{}",
        listing::list(&bytes, &outline, &locator, &a.regex, &a.options, &a.filters)?
    );
    Ok(0)
}

pub fn collapse(a: CollapseArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let (file, source) = input::file_or_db(a.file, a.db.db.as_deref(), &a.db.selection, &locator)?;
    let stacks = input::source_stacks(&file, &source, &locator, &a.filters, a.sample_index.value)?;
    let mut folded = stacks.folded().join("\n");
    folded.push('\n');
    match a.output {
        Some(path) => std::fs::write(&path, folded).map_err(|e| Error::write(&path, e))?,
        None => print!("{folded}"),
    }
    Ok(0)
}

pub fn flamegraph(a: FlamegraphArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    let index = a.sample_index.value;
    let stacks = match &a.db.db {
        Some(dir) => {
            heap::cpu_takes_no_index(index)?;
            let (name, bytes) = input::db::merged_selection(dir, &a.db.selection, &locator)?;
            input::raw_stacks(&name, &input::Source::bytes(&bytes), &locator, &a.filters)?
        }
        None => input::read_stacks(&input::given(a.file)?, &locator, &a.filters, index)?,
    };
    text::flamegraph(&stacks, &a.output)?;
    eprintln!("wrote {}", a.output.display());
    Ok(0)
}

pub fn convert(a: ConvertArgs) -> Result<u8> {
    let locator: Locator = a.symbols.into();
    if let (Some(dir), Target::Dcpi) = (&a.db.db, a.target) {
        heap::cpu_takes_no_index(a.sample_index.value)?;
        return db_to_dcpi(dir, &a.db.selection, &locator, &a.filters, &a.output);
    }
    let (file, source) = input::file_or_db(a.file, a.db.db.as_deref(), &a.db.selection, &locator)?;
    if let Some(profile) = heap::read(&file, &source)? {
        return match a.target {
            Target::Pprof => {
                let value = heap::value(a.sample_index.value, &file)?;
                pprof::write(&pprof::encode_heap(&profile, &locator, &a.filters, value), &a.output)?;
                Ok(0)
            }
            Target::Dcpi => Err(Error::Usage("a heap profile converts to pprof only (--to pprof)")),
        };
    }
    if let Some(profile) = input::contention::read(&file, &source)? {
        return match a.target {
            Target::Pprof => {
                let value = input::contention::value(a.sample_index.value, &file)?;
                pprof::write(
                    &pprof::encode_contention(&profile, &locator, &a.filters, value),
                    &a.output,
                )?;
                Ok(0)
            }
            Target::Dcpi => Err(Error::Usage("a contention profile converts to pprof only (--to pprof)")),
        };
    }
    heap::cpu_takes_no_index(a.sample_index.value)?;
    if let (Target::Pprof, false) = (a.target, a.filters.active()) {
        let outline = raw::outline_source(&file, &source, &locator)?;
        pprof::write_source(&source, &outline, &locator, &a.output)?;
        return Ok(0);
    }
    let mut profile = raw::read_source(&file, &source, &locator)?;
    if a.filters.active() {
        profile = filters::profile(&profile, &locator, &a.filters);
    }
    match a.target {
        Target::Pprof => pprof::write(&pprof::encode(&profile, &locator, &a.filters), &a.output)?,
        Target::Dcpi => {
            let taken = std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::SystemTime::now());
            for path in render::dcpi::export(&profile, &locator, &a.output, taken)? {
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(0)
}

/// DCPI's layout: one directory per epoch, named after it, one v0.07 profile per image.
fn db_to_dcpi(
    dir: &Path,
    selection: &input::db::Selection,
    locator: &Locator,
    filters: &Filters,
    output: &Path,
) -> Result<u8> {
    let database = input::db::Database::open(dir)?;
    epochs::for_each(&database, selection, locator, &mut |name, _, mut profile| {
        if filters.active() {
            profile = filters::profile(&profile, locator, filters);
        }
        let start = cpuprof::format::database::parse_epoch_name(name).unwrap_or(std::time::UNIX_EPOCH);
        // The epochs' reader speaks in messages.
        for path in render::dcpi::export(&profile, locator, &output.join(name), start).map_err(|e| e.to_string())? {
            eprintln!("wrote {}", path.display());
        }
        Ok(())
    })?;
    Ok(0)
}
