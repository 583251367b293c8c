//! The one way in: every command reads its profiles through here. A raw profile (cpuprof's or
//! gperftools', complete or cut short: [`raw`]), a DCPI profile or a directory of them
//! ([`dcpi`]), a profile database ([`db`], its epochs summed by [`epochs`]), or a directory
//! of earlier profiles taken as a history ([`read_history`]).

pub mod db;
pub mod dcpi;
pub mod epochs;
pub mod raw;

use crate::model::filters::Filters;
use crate::model::stacks::{Functions, Stacks};
use crate::render::progress::Progress;
use crate::symbols::Locator;
use cpuprof::format::Profile;
use std::path::{Path, PathBuf};

/// FILE, which clap requires when --db is absent.
pub fn given(file: Option<PathBuf>) -> Result<PathBuf, String> {
    file.ok_or_else(|| "a FILE or --db DIR is needed".to_string())
}

pub fn read_bytes(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// A raw profile; one cut short is read up to the cut, with a warning (see [`raw`]).
pub fn read_profile(file: &Path, locator: &Locator) -> Result<Profile, String> {
    raw::read(file, &read_bytes(file)?, locator)
}

/// Samples per function of a raw profile (summed as it is read: no chain is kept), a DCPI
/// profile, or a directory of DCPI profiles.
pub fn read_functions(file: &Path, locator: &Locator, filters: &Filters) -> Result<Functions, String> {
    if file.is_dir() {
        return Ok(read_stacks(file, locator, filters)?.functions());
    }
    let bytes = read_bytes(file)?;
    if dcpi::is_dcpi(&bytes) {
        let profile = dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters).functions());
    }
    let outline = raw::outline(file, &bytes, locator)?;
    Ok(Functions::read(&bytes, &outline, locator, filters))
}

/// A raw profile, a DCPI profile, or a directory of DCPI profiles, symbolised, as `filters`
/// leave it.
pub fn read_stacks(file: &Path, locator: &Locator, filters: &Filters) -> Result<Stacks, String> {
    if file.is_dir() {
        let mut profiles = Vec::new();
        for path in sorted_files(file)? {
            let bytes = read_bytes(&path)?;
            if dcpi::is_dcpi(&bytes) {
                profiles.push(dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
            }
        }
        if profiles.is_empty() {
            return Err(format!("{}: no DCPI profiles in this directory", file.display()));
        }
        return Ok(dcpi::stacks(&profiles, locator).filter(filters));
    }
    let bytes = read_bytes(file)?;
    if dcpi::is_dcpi(&bytes) {
        let profile = dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters));
    }
    raw_stacks(file, &bytes, locator, filters)
}

/// The raw profile in `bytes`, read from `file`, symbolised as it is read: one pass finds the
/// maps at the end (and judges a cut), a second aggregates the records; none is kept.
pub fn raw_stacks(file: &Path, bytes: &[u8], locator: &Locator, filters: &Filters) -> Result<Stacks, String> {
    let outline = raw::outline(file, bytes, locator)?;
    Ok(Stacks::read(bytes, &outline, locator, filters))
}

/// A file given on the command line, or the whole selection of `--db DIR` summed (with a
/// name for it in messages).
pub fn file_or_db(
    file: Option<PathBuf>,
    db: Option<&Path>,
    selection: &db::Selection,
    locator: &Locator,
) -> Result<(PathBuf, Vec<u8>), String> {
    match db {
        Some(dir) => db::merged_selection(dir, selection, locator),
        None => {
            let file = given(file)?;
            let bytes = read_bytes(&file)?;
            Ok((file, bytes))
        }
    }
}

/// Everything in `dir`, in name order: the one directory listing every reader uses.
pub fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    paths.sort();
    Ok(paths)
}

/// The regular files (after symbolic links) of `dir`, in name order.
fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    Ok(sorted_entries(dir)?.into_iter().filter(|p| p.is_file()).collect())
}

/// Every raw profile in `dir`, read by `read`; other files are skipped with a note.
pub fn read_history<T>(dir: &Path, read: &dyn Fn(&Path) -> Result<T, String>) -> Result<Vec<T>, String> {
    let files = sorted_files(dir)?;
    let mut out = Vec::new();
    let mut progress = Progress::new("reading history", files.len());
    for (i, path) in files.iter().enumerate() {
        progress.update(i);
        match read(path) {
            Ok(p) => out.push(p),
            Err(e) => eprintln!("cpuprof: skipping {}: {e}", path.display()),
        }
    }
    if out.len() < 2 {
        return Err(format!(
            "{}: a history needs at least two profiles, found {}",
            dir.display(),
            out.len()
        ));
    }
    Ok(out)
}
