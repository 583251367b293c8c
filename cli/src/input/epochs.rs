//! A database's epochs of one program, each its processes' profiles summed into one: what
//! `diff --history DB`, `advise --history DB`, `report --history DB`, `history` and
//! `convert --db --to dcpi` read.

use super::db::{self, Database, Selection};
use crate::error::Result;
use crate::symbols::Locator;
use cpuprof::format::database::{parse_file_name, FileKind};
use cpuprof::format::Profile;
use std::path::Path;

/// Calls `each(name, processes, profile)` for every selected epoch of `database` in order,
/// its processes summed; an epoch none of whose files can be read is reported and left out.
/// Returns the program read.
pub fn for_each(
    database: &Database,
    selection: &Selection,
    locator: &Locator,
    each: &mut dyn FnMut(&str, usize, Profile) -> Result<()>,
) -> Result<String> {
    let (program, epochs) = database.select(selection)?;
    for (name, entries) in &epochs {
        match db::merged(entries, locator)? {
            Some(bytes) => {
                let profile = Profile::parse(&bytes).map_err(|e| format!("{name}: merged profile: {e}"))?;
                each(name, entries.len(), profile)?;
            }
            None => eprintln!("cpuprof: epoch {name}: no readable profile of {program}; left out"),
        }
    }
    Ok(program)
}

/// The epochs of a database as a history for NEW: each epoch one run, seen through `read`.
/// The program is --program, else NEW's `<program>` if the database has it, else the
/// database's only program. At least two epochs are needed.
pub fn history<T>(
    dir: &Path,
    selection: &Selection,
    new: &Path,
    locator: &Locator,
    read: &dyn Fn(&str, usize, &Profile) -> T,
) -> Result<Vec<T>> {
    let database = Database::open(dir)?;
    let mut past = Vec::new();
    let program = for_each(
        &database,
        &program_of(&database, selection, new),
        locator,
        &mut |name, n, p| {
            past.push(read(name, n, &p));
            Ok(())
        },
    )?;
    if past.len() < 2 {
        return Err(format!(
            "{}: a history needs at least two epochs of {program}, found {}",
            dir.display(),
            past.len()
        )
        .into());
    }
    Ok(past)
}

/// `selection`, its program, when not given, NEW's `<program>` if the database has it.
fn program_of(database: &Database, selection: &Selection, new: &Path) -> Selection {
    let mut selection = selection.clone();
    if selection.program.is_none() {
        let name = new.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let FileKind::Profile(file) = parse_file_name(name) {
            if database.programs().contains(file.program.as_str()) {
                selection.program = Some(file.program);
            }
        }
    }
    selection
}
