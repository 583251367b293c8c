//! Where the objects a profile names are now: at their recorded paths, given by `--binary`,
//! or on a search path, checked by inode and build-id; only regular files are opened.

use super::file_name;
use cpuprof::elf::{self, Elf, FileReader};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Opens `path` for reading if, and only if, it is a regular file. `O_NONBLOCK` makes the
/// open return at once even for a FIFO; the type is checked on the opened descriptor, so a
/// file swapped in after a check by path cannot slip through. Returns the file, its size and
/// its (device, inode); the error says why the file is not read.
pub fn open_regular(path: &Path) -> Result<(File, u64, (u64, u64)), String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{}: not a regular file (a device, FIFO, socket or directory); not read",
            path.display()
        ));
    }
    Ok((file, meta.len(), (meta.dev(), meta.ino())))
}

/// The whole of a regular file, at most its size when opened (a file that grows meanwhile
/// is not followed).
pub(super) fn read_regular(path: &Path) -> Option<(Vec<u8>, (u64, u64))> {
    let (file, size, identity) = open_regular(path).ok()?;
    Some((read_opened(file, size)?, identity))
}

/// The first `size` bytes of `file` (from [`open_regular`]), all of it as it was when opened.
pub fn read_opened(file: File, size: u64) -> Option<Vec<u8>> {
    let mut data = Vec::with_capacity(usize::try_from(size).ok()?);
    file.take(size).read_to_end(&mut data).ok()?;
    Some(data)
}

/// Where to look for the binaries a profile names.
#[derive(Clone, Debug, Default)]
pub struct Locator {
    /// Files given with `--binary`: each stands for the mapped object of the same file name,
    /// or, if no mapped object has that name, for the profile's main executable.
    pub binaries: Vec<PathBuf>,
    /// Directories searched, in order, for objects missing at their recorded path.
    pub search_path: Vec<PathBuf>,
    /// Directories searched for separate debug info before `/usr/lib/debug` (see
    /// [`crate::symbols::debug_info`]).
    pub debug_dirs: Vec<PathBuf>,
}

impl Locator {
    /// The file to read for the object mapped from `path` (`main`: whether it is the profile's
    /// main executable; `recorded`: the build-id the profile recorded for the code that ran),
    /// with a warning when the choice is doubtful. With a recorded build-id, the first
    /// candidate (`--binary`, the path, the search path, in that order) with that build-id is
    /// taken; if none has it, the usual choice is made, with a warning that names may be wrong.
    pub(super) fn locate(&self, path: &str, main: bool, recorded: Option<&str>) -> (Option<PathBuf>, Option<String>) {
        let Some(recorded) = recorded else {
            return self.choose(path, main, |substitute| check_build_id(path, substitute));
        };
        let name = file_name(path);
        let candidates = self
            .given(path, main)
            .into_iter()
            .chain([PathBuf::from(path)])
            .chain(self.search_path.iter().map(|dir| dir.join(name)));
        for candidate in candidates {
            if build_id(&candidate).as_deref() == Some(recorded) {
                // A --binary passed over is said so: the user asked for it.
                let note = self.given(path, main).filter(|given| *given != candidate).map(|given| {
                    format!(
                        "{}: build-id {}, not the {recorded} recorded for {path} when profiling; reading {}, which has it",
                        given.display(),
                        build_id(&given).unwrap_or_else(|| "none".to_string()),
                        candidate.display()
                    )
                });
                return (Some(candidate), note);
            }
        }
        let (file, hint) = self.choose(path, main, |_| None);
        let Some(file) = file else { return (None, hint) };
        let on_disk = build_id(&file).unwrap_or_else(|| "none".to_string());
        let warning = if file == Path::new(path) {
            format!(
                "{path}: rebuilt since profiling: build-id {recorded} recorded, {on_disk} on disk; names may be wrong"
            )
        } else {
            format!(
                "{}: build-id {on_disk}, but {recorded} was recorded for {path} when profiling; names may be wrong",
                file.display()
            )
        };
        (Some(file), Some(warning))
    }

    /// The `--binary` file that stands for `path`, if any.
    fn given(&self, path: &str, main: bool) -> Option<PathBuf> {
        let name = file_name(path);
        let by_name = self.binaries.iter().find(|b| b.file_name().is_some_and(|n| n == name));
        by_name.or(if main { self.binaries.first() } else { None }).cloned()
    }

    /// The usual choice: a `--binary` file, else the path, else the search path; `check` gives
    /// the warning for a substitute.
    fn choose(
        &self,
        path: &str,
        main: bool,
        check: impl Fn(&Path) -> Option<String>,
    ) -> (Option<PathBuf>, Option<String>) {
        if let Some(binary) = self.given(path, main) {
            let warning = check(&binary);
            return (Some(binary), warning);
        }
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => return (Some(PathBuf::from(path)), None),
            Ok(_) => {
                let hint = format!("{path}: not a regular file (a device, FIFO or directory); not read, its addresses stay unsymbolised");
                return (None, Some(hint));
            }
            Err(_) => {}
        }
        for dir in &self.search_path {
            let candidate = dir.join(file_name(path));
            if candidate.is_file() {
                let warning = check(&candidate);
                return (Some(candidate), warning);
            }
        }
        let hint = format!("{path}: not found; its addresses stay unsymbolised (use --binary or --search-path)");
        (None, Some(hint))
    }
}

/// A warning if `substitute` and the original `path` (when it still exists) have different
/// build-ids: for profiles that recorded none (gperftools', or older cpuprof's).
fn check_build_id(path: &str, substitute: &Path) -> Option<String> {
    let original = build_id(Path::new(path))?;
    let replacement = build_id(substitute)?;
    (original != replacement).then(|| {
        format!(
            "{}: build-id {replacement} does not match {path} ({original}); symbols may be wrong",
            substitute.display()
        )
    })
}

/// The GNU build-id of an ELF file, in hex, reading only its headers and notes (not the
/// whole file: a candidate may be hundreds of megabytes).
fn build_id(path: &Path) -> Option<String> {
    let (file, size, _) = open_regular(path).ok()?;
    read_build_id(file, size)
}

fn read_build_id(file: File, size: u64) -> Option<String> {
    let file = FileReader { file, size };
    let id = elf::build_id(&Elf::parse(&file)?, true)?;
    Some(cpuprof::format::build_id::hex(&id))
}

/// Build-ids by file, so that many spellings of one path read the file once.
#[derive(Default)]
pub struct BuildIds {
    by_path: HashMap<String, Option<String>>,
    by_identity: HashMap<(u64, u64), Option<String>>,
}

impl BuildIds {
    pub fn get(&mut self, path: &str) -> Option<String> {
        if let Some(id) = self.by_path.get(path) {
            return id.clone();
        }
        let id = path.starts_with('/').then(|| self.read(Path::new(path))).flatten();
        self.by_path.insert(path.to_string(), id.clone());
        id
    }

    fn read(&mut self, path: &Path) -> Option<String> {
        let (file, size, identity) = open_regular(path).ok()?;
        if let Some(id) = self.by_identity.get(&identity) {
            return id.clone();
        }
        let id = read_build_id(file, size);
        self.by_identity.insert(identity, id.clone());
        id
    }
}
