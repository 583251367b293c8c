//! The one way in: every command reads its profiles through here. A raw profile (cpuprof's or
//! gperftools', complete or cut short: [`raw`]), a heap profile (gperftools' text format,
//! [`heap`]: told by its content, read by the commands that read stacks), a DCPI profile or a
//! directory of them ([`dcpi`]), a profile database ([`db`], its epochs summed by [`epochs`]),
//! or a directory of earlier profiles taken as a history ([`read_history`]).

use crate::error::{Error, Result};
pub mod contention;
pub mod db;
pub mod dcpi;
pub mod epochs;
pub mod heap;
pub mod raw;

/// A heap or contention profile read as chains, each weighing the value asked for
/// (`--sample-index`), with each line's observations and weight (`diff`'s summary takes
/// both): how `diff` and `report` take either kind. `None` for a profile of neither kind.
pub struct Weighted {
    pub stacks: Stacks,
    pub lines: Vec<(u64, u64)>,
}

impl Weighted {
    /// `source` (named `file`) as a heap or contention profile, `None` if it is neither.
    pub fn read(
        file: &Path,
        source: &Source,
        index: Option<SampleValue>,
        locator: &Locator,
        filters: &Filters,
    ) -> Result<Option<Weighted>> {
        if let Some(profile) = heap::read(file, source)? {
            let value = heap::value(index, file)?;
            return Ok(Some(Weighted {
                stacks: heap::stacks(&profile, value, locator, filters),
                lines: heap::lines(&profile, value).collect(),
            }));
        }
        if let Some(profile) = contention::read(file, source)? {
            let value = contention::value(index, file)?;
            return Ok(Some(Weighted {
                stacks: contention::stacks(&profile, value, locator, filters),
                lines: contention::lines(&profile, value).collect(),
            }));
        }
        Ok(None)
    }
}

use crate::model::filters::Filters;
use crate::model::stacks::{Functions, Stacks};
use crate::model::unit::SampleValue;
use crate::render::progress::Progress;
use crate::symbols::Locator;
use cpuprof::format::{scan, scan_from, ParseError, Profile, Record, Scan};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// FILE, which clap requires when --db is absent.
pub fn given(file: Option<PathBuf>) -> Result<PathBuf> {
    file.ok_or(Error::Usage("a FILE or --db DIR is needed"))
}

pub fn read_bytes(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| Error::read(file, e))
}

/// A raw profile to read in passes (the maps a reader needs first are at the end of the
/// file): a regular file, opened again for each pass and read through a window of about a
/// megabyte, never whole; or bytes already in memory (a database's selection, merged; a pipe
/// or a device, which cannot be read twice, read whole as before).
pub enum Source<'a> {
    File(PathBuf),
    Bytes(Cow<'a, [u8]>),
}

impl<'a> Source<'a> {
    /// `file` as a source: named if it is a regular file, else read whole.
    pub fn open(file: &Path) -> Result<Source<'static>> {
        let meta = std::fs::metadata(file).map_err(|e| Error::read(file, e))?;
        if meta.is_file() {
            Ok(Source::File(file.to_path_buf()))
        } else {
            Ok(Source::Bytes(Cow::Owned(read_bytes(file)?)))
        }
    }

    pub fn bytes(bytes: &'a [u8]) -> Source<'a> {
        Source::Bytes(Cow::Borrowed(bytes))
    }

    /// Opens the file for a pass.
    fn file(path: &Path) -> Result<std::fs::File> {
        std::fs::File::open(path).map_err(|e| Error::read(path, e))
    }

    /// The size of the profile, in bytes.
    pub fn len(&self) -> Result<u64> {
        match self {
            Source::File(path) => Ok(Self::file(path)?.metadata().map_err(|e| Error::read(path, e))?.len()),
            Source::Bytes(bytes) => Ok(bytes.len() as u64),
        }
    }

    /// Up to `n` bytes from `offset` (fewer where the profile ends).
    pub fn read_at(&self, offset: u64, n: usize) -> Result<Vec<u8>> {
        match self {
            Source::File(path) => {
                use std::io::{Read, Seek};
                let mut file = Self::file(path)?;
                let mut out = Vec::with_capacity(n);
                file.seek(std::io::SeekFrom::Start(offset))
                    .and_then(|_| file.take(n as u64).read_to_end(&mut out))
                    .map_err(|e| Error::read(path, e))?;
                Ok(out)
            }
            Source::Bytes(bytes) => {
                let start = (offset as usize).min(bytes.len());
                Ok(bytes[start..(start + n).min(bytes.len())].to_vec())
            }
        }
    }

    /// The whole profile in memory (for DCPI profiles, which are read whole).
    pub fn whole(&self) -> Result<Cow<'_, [u8]>> {
        match self {
            Source::File(path) => Ok(Cow::Owned(read_bytes(path)?)),
            Source::Bytes(bytes) => Ok(Cow::Borrowed(bytes)),
        }
    }

    /// One pass of [`cpuprof::format::scan()`] over the records.
    pub fn scan(
        &self,
        visit: impl FnMut(Record<'_>),
    ) -> Result<std::result::Result<(Scan, Option<ParseError>), ParseError>> {
        match self {
            Source::File(path) => scan_from(Self::file(path)?, visit).map_err(|e| Error::read(path, e)),
            Source::Bytes(bytes) => Ok(scan(bytes, visit)),
        }
    }

    /// [`Profile::parse_lenient`] of the profile.
    pub fn parse_lenient(&self) -> Result<std::result::Result<(Profile, Option<ParseError>), ParseError>> {
        match self {
            Source::File(path) => Profile::parse_lenient_from(Self::file(path)?).map_err(|e| Error::read(path, e)),
            Source::Bytes(bytes) => Ok(Profile::parse_lenient(bytes)),
        }
    }
}

/// A raw profile; one cut short is read up to the cut, with a warning (see [`raw`]).
pub fn read_profile(file: &Path, locator: &Locator) -> Result<Profile> {
    raw::read_source(file, &Source::open(file)?, locator)
}

/// Samples per function of a raw profile (summed as it is read: no chain is kept), a DCPI
/// profile, or a directory of DCPI profiles; or a heap profile's `index` (`--sample-index`,
/// which a CPU profile does not take) per function.
pub fn read_functions(
    file: &Path,
    locator: &Locator,
    filters: &Filters,
    index: Option<SampleValue>,
) -> Result<Functions> {
    if file.is_dir() {
        return Ok(read_stacks(file, locator, filters, index)?.functions());
    }
    let source = Source::open(file)?;
    if heap::is_heap(&source)? || contention::is_contention(&source)? {
        return Ok(source_stacks(file, &source, locator, filters, index)?.functions());
    }
    heap::cpu_takes_no_index(index)?;
    if is_dcpi(&source)? {
        let profile = dcpi::parse(&source.whole()?).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters).functions());
    }
    let outline = raw::outline_source(file, &source, locator)?;
    Functions::read_source(&source, &outline, locator, filters)
}

/// Whether `source` is a DCPI profile (which starts with `version`) rather than a raw one.
fn is_dcpi(source: &Source) -> Result<bool> {
    Ok(dcpi::is_dcpi(&source.read_at(0, 7)?))
}

/// A raw profile, a DCPI profile, a directory of DCPI profiles, or a heap profile's `index`
/// (`--sample-index`), symbolised, as `filters` leave it.
pub fn read_stacks(file: &Path, locator: &Locator, filters: &Filters, index: Option<SampleValue>) -> Result<Stacks> {
    if file.is_dir() {
        heap::cpu_takes_no_index(index)?;
        let mut profiles = Vec::new();
        for path in sorted_files(file)? {
            let bytes = read_bytes(&path)?;
            if dcpi::is_dcpi(&bytes) {
                profiles.push(dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
            }
        }
        if profiles.is_empty() {
            return Err(format!("{}: no DCPI profiles in this directory", file.display()).into());
        }
        return Ok(dcpi::stacks(&profiles, locator).filter(filters));
    }
    let source = Source::open(file)?;
    if is_dcpi(&source)? {
        heap::cpu_takes_no_index(index)?;
        let profile = dcpi::parse(&source.whole()?).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters));
    }
    source_stacks(file, &source, locator, filters, index)
}

/// The raw, heap or contention profile `source`, read from `file`, symbolised (see
/// [`raw_stacks`], [`heap::stacks`] and [`contention::stacks`]).
pub fn source_stacks(
    file: &Path,
    source: &Source,
    locator: &Locator,
    filters: &Filters,
    index: Option<SampleValue>,
) -> Result<Stacks> {
    if let Some(profile) = heap::read(file, source)? {
        return Ok(heap::stacks(&profile, heap::value(index, file)?, locator, filters));
    }
    if let Some(profile) = contention::read(file, source)? {
        return Ok(contention::stacks(
            &profile,
            contention::value(index, file)?,
            locator,
            filters,
        ));
    }
    heap::cpu_takes_no_index(index)?;
    raw_stacks(file, source, locator, filters)
}

/// The raw profile `source`, read from `file`, symbolised as it is read: one pass finds the
/// maps at the end (and judges a cut), a second aggregates the records; none is kept.
pub fn raw_stacks(file: &Path, source: &Source, locator: &Locator, filters: &Filters) -> Result<Stacks> {
    let outline = raw::outline_source(file, source, locator)?;
    Stacks::read_source(source, &outline, locator, filters)
}

/// A file given on the command line (not read yet), or the whole selection of `--db DIR`
/// summed (with a name for it in messages).
pub fn file_or_db(
    file: Option<PathBuf>,
    db: Option<&Path>,
    selection: &db::Selection,
    locator: &Locator,
) -> Result<(PathBuf, Source<'static>)> {
    match db {
        Some(dir) => {
            let (name, bytes) = db::merged_selection(dir, selection, locator)?;
            Ok((name, Source::Bytes(Cow::Owned(bytes))))
        }
        None => {
            let file = given(file)?;
            let source = Source::open(&file)?;
            Ok((file, source))
        }
    }
}

/// Everything in `dir`, in name order: the one directory listing every reader uses.
pub fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::read(dir, e))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    paths.sort();
    Ok(paths)
}

/// The regular files (after symbolic links) of `dir`, in name order.
fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(sorted_entries(dir)?.into_iter().filter(|p| p.is_file()).collect())
}

/// Every raw profile in `dir`, read by `read`; other files are skipped with a note.
pub fn read_history<T>(dir: &Path, read: &dyn Fn(&Path) -> Result<T>) -> Result<Vec<T>> {
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
        )
        .into());
    }
    Ok(out)
}
