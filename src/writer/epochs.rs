//! Epoch mode (`CPUPROFILE_DB`): continuous profiling into a profile database, as DCPI did.
//!
//! Layout: `DB/<epoch start, UTC, YYYYMMDDTHHMMSSZ>/<program>.<pid>.prof`. Epoch starts are
//! multiples of the epoch length since the Unix epoch, so every process with the same length
//! shares the epoch directories. (Epochs shorter than a second, for tests, would share a
//! second: their names carry milliseconds, `YYYYMMDDTHHMMSS.mmmZ`.) Each file is a complete
//! gperftools profile, written as `.<program>.<pid>.<ns>.prof.tmp` in the same directory and
//! renamed into place once whole, so readers skip it until then. (`<ns>`, the time it was
//! opened, keeps the temporary file of an image that left by an exec cpuprof does not see,
//! `execl` or a raw system call, from being truncated by the next image's: it stays, readable
//! as a cut-short profile, until the budget removes its epoch.) The name is never reused within an
//! epoch: a program that execs itself (same program, same pid, same epoch) writes
//! `<program>~2.<pid>.prof`, and so on; the rename refuses to replace (`RENAME_NOREPLACE`).
//!
//! Only the writer thread uses this module: one epoch file open at a time, so cpuprof's memory
//! and descriptors do not grow with the number of epochs.

use super::mappings::SeenMappings;
use super::sink::OutputSink;
use super::ProfileOutput;
use crate::format::database::{epoch_name, parse_epoch_name, FileName};
use crate::format::{ProfileWriter, SlotFormat};
use crate::in_program::procfs::read_self_maps;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Default epoch length (`CPUPROFILE_EPOCH`), in seconds.
pub const DEFAULT_EPOCH_SECONDS: f64 = 600.0;
/// Shortest epoch accepted: one tick of the writer at its fastest is 5 ms.
pub const MIN_EPOCH: Duration = Duration::from_millis(10);

/// Epoch mode's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochOptions {
    pub length: Duration,
    /// Remove the oldest epochs while the database holds more than this.
    pub max_bytes: Option<u64>,
    /// Remove epochs that started longer ago than this.
    pub max_age: Option<Duration>,
}

impl EpochOptions {
    pub fn new(length: Duration) -> EpochOptions {
        EpochOptions {
            length: length.max(MIN_EPOCH),
            max_bytes: None,
            max_age: None,
        }
    }

    /// From `CPUPROFILE_EPOCH`, `CPUPROFILE_DB_MAX_BYTES` and `CPUPROFILE_DB_MAX_AGE`; values
    /// that are not positive numbers are reported and ignored.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> EpochOptions {
        let seconds = |name: &str| {
            let text = var(name)?;
            match text.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s.is_finite() && s < 1e12 => Some(Duration::from_secs_f64(s)),
                _ => {
                    crate::say!("cpuprof: {name}={text:?} is not a positive number of seconds; ignored");
                    None
                }
            }
        };
        let mut o =
            EpochOptions::new(seconds("CPUPROFILE_EPOCH").unwrap_or(Duration::from_secs_f64(DEFAULT_EPOCH_SECONDS)));
        o.max_age = seconds("CPUPROFILE_DB_MAX_AGE");
        if let Some(text) = var("CPUPROFILE_DB_MAX_BYTES") {
            match text.trim().parse::<u64>() {
                Ok(n) if n > 0 => o.max_bytes = Some(n),
                _ => {
                    crate::say!("cpuprof: CPUPROFILE_DB_MAX_BYTES={text:?} is not a positive number of bytes; ignored")
                }
            }
        }
        o
    }
}

/// Where this process writes its epochs.
pub struct Database {
    dir: PathBuf,
    options: EpochOptions,
    /// `<program>` of the file names.
    program: String,
    pid: u32,
    period_us: u64,
    /// The samples carry their threads: the epoch files say it is a CPU profile's labels.
    thread_labels: bool,
}

/// The epoch being written.
pub struct Epoch {
    pub out: ProfileOutput,
    /// Start of the next epoch.
    pub ends: SystemTime,
    directory: PathBuf,
    temporary: PathBuf,
}

impl Database {
    pub fn new(dir: &Path, options: EpochOptions, period_us: u64) -> Database {
        Database {
            dir: dir.to_path_buf(),
            options,
            program: program_name(),
            pid: std::process::id(),
            period_us,
            thread_labels: false,
        }
    }

    /// Epoch files of a CPU profile whose samples name their threads ([`Options::thread_labels`]).
    ///
    /// [`Options::thread_labels`]: crate::session::Options::thread_labels
    pub fn with_thread_labels(mut self, on: bool) -> Database {
        self.thread_labels = on;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the epoch directory containing `now` (and the database, if missing) and the
    /// epoch's temporary file, with its header (written at once, so that even an epoch cut
    /// short by SIGKILL before its first records is a readable profile). `mappings`: those of
    /// the epoch before, whose build-ids need not be read again (reading them every epoch was
    /// most of a roll-over's cost).
    pub fn open(&self, now: SystemTime, mut mappings: SeenMappings) -> io::Result<Epoch> {
        let (start, ends) = epoch_bounds(now, self.options.length);
        make_directory(&self.dir)?;
        let directory = self.dir.join(epoch_name(start, self.options.length));
        make_directory(&directory)?;
        let opened = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let temporary = directory.join(format!(".{}.{}.{opened}.prof.tmp", self.program, self.pid));
        let file = OutputSink::create(&temporary)?;
        let mut writer = ProfileWriter::new(file, SlotFormat::NATIVE, self.period_us)?;
        writer.flush()?;
        let maps = read_self_maps();
        mappings.record(&maps);
        mappings.read_build_ids(&maps);
        Ok(Epoch {
            out: ProfileOutput {
                writer,
                error: None,
                mappings,
                contexts: super::contexts::RecordContexts::new(self.thread_labels),
                beside: None,
                exec_trailer_at: None,
                wall: false,
                // Event profiles are not written into a database (`session::check_options`).
                event: None,
            },
            ends,
            directory,
            temporary,
        })
    }

    /// Gives a finished epoch file its name (never replacing another's), then applies the
    /// budget. Returns the final path.
    pub fn publish(&self, directory: &Path, temporary: &Path) -> io::Result<PathBuf> {
        let result = (1..=1000)
            .find_map(|image| {
                let name = FileName {
                    program: self.program.clone(),
                    pid: self.pid,
                    image,
                };
                let path = directory.join(name.to_name());
                match rename_no_replace(temporary, &path) {
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => None,
                    other => Some(other.map(|()| path)),
                }
            })
            .unwrap_or_else(|| Err(io::Error::other("every name for this epoch file is taken")));
        if result.is_err() {
            let _ = std::fs::remove_file(temporary);
        }
        result
    }

    /// Removes whole epochs older than the one containing `now`, oldest first, while the
    /// database is over its byte budget or they are older than the age limit. Only directories
    /// named as epochs are touched, never through a symbolic link, and in them only regular
    /// `*.prof` files: a temporary file of a process still writing keeps its directory.
    pub fn apply_budget(&self, now: SystemTime) {
        if self.options.max_bytes.is_none() && self.options.max_age.is_none() {
            return;
        }
        let (current, _) = epoch_bounds(now, self.options.length);
        let mut epochs = epoch_directories(&self.dir);
        epochs.sort();
        let mut total: u64 = epochs.iter().map(|(_, _, bytes)| bytes).sum();
        for (start, path, bytes) in epochs {
            if start >= current {
                break;
            }
            let too_old = self
                .options
                .max_age
                .is_some_and(|age| now.duration_since(start).unwrap_or_default() > age);
            let too_big = self.options.max_bytes.is_some_and(|max| total > max);
            if !too_old && !too_big {
                break;
            }
            remove_epoch(&path, now, self.options.length);
            total -= bytes;
        }
    }
}

impl Epoch {
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    pub fn temporary(&self) -> &Path {
        &self.temporary
    }
}

/// The epoch containing `now`: its start and the next one's.
pub fn epoch_bounds(now: SystemTime, length: Duration) -> (SystemTime, SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let length_ns = length.as_nanos().max(1);
    let start = since / length_ns * length_ns;
    let at = |ns: u128| UNIX_EPOCH + Duration::from_nanos(ns as u64);
    (at(start), at(start + length_ns))
}

/// Basename of `/proc/self/exe`, kept to characters that are safe in a file name (a leading
/// dot would hide the file from readers; `~` separates the image number in
/// [`FileName::to_name`]).
fn program_name() -> String {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let base = exe
        .as_deref()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cleaned: String = base
        .trim_end_matches(" (deleted)")
        .chars()
        .map(|c| if c.is_control() || c == '/' || c == '~' { '_' } else { c })
        .collect();
    match cleaned.strip_prefix('.') {
        _ if cleaned.is_empty() => "unknown".to_string(),
        Some(rest) => format!("_{rest}"),
        None => cleaned,
    }
}

/// `mkdir`, accepting a directory that exists (made by another process) but not a symbolic
/// link or anything else in its place.
fn make_directory(path: &Path) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(path)?.is_dir() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "'{}' exists and is not a directory (symbolic links are not followed)",
                    path.display()
                )))
            }
        }
        Err(e) => Err(e),
    }
}

fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("NUL in path"));
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: renameat2 with NUL-terminated paths relative to the current directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Epoch directories of the database (real directories only) with their starts and the bytes
/// of their regular files.
fn epoch_directories(db: &Path) -> Vec<(SystemTime, PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(db) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let start = parse_epoch_name(entry.file_name().to_str()?)?;
            // DirEntry::file_type does not follow symbolic links.
            if !entry.file_type().ok()?.is_dir() {
                return None;
            }
            let bytes = std::fs::read_dir(entry.path())
                .ok()?
                .flatten()
                .filter_map(|f| f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len()))
                .sum();
            Some((start, entry.path(), bytes))
        })
        .collect()
}

/// Removes an epoch's finished profiles, and temporary files left behind (not written for
/// an epoch length and a minute: a live writer touches its file at every harvest, at most 30 s
/// apart, and completes it when its epoch ends), then the directory if that left it empty.
fn remove_epoch(dir: &Path, now: SystemTime, length: Duration) {
    let abandoned = now.checked_sub(length + Duration::from_secs(60));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            // DirEntry::metadata does not follow symbolic links.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let finished = name.ends_with(".prof") && !name.starts_with('.');
            let left_behind = name.starts_with('.')
                && name.ends_with(".prof.tmp")
                && abandoned.is_some_and(|limit| meta.modified().is_ok_and(|m| m < limit));
            if finished || left_behind {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_aligned_to_their_length() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_123) + Duration::from_millis(456);
        let (start, ends) = epoch_bounds(t, Duration::from_secs(600));
        assert_eq!(epoch_name(start, Duration::from_secs(600)), "20261118T110000Z");
        assert_eq!(ends.duration_since(start).unwrap(), Duration::from_secs(600));
        let short = Duration::from_millis(50);
        let (start, _) = epoch_bounds(t, short);
        assert_eq!(epoch_name(start, short), "20261118T110843.450Z");
    }

    #[test]
    fn environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let o = EpochOptions::from_env(env(&[]));
        assert_eq!(
            (o.length, o.max_bytes, o.max_age),
            (Duration::from_secs(600), None, None)
        );
        let o = EpochOptions::from_env(env(&[
            ("CPUPROFILE_EPOCH", "0.05"),
            ("CPUPROFILE_DB_MAX_BYTES", "1000000"),
            ("CPUPROFILE_DB_MAX_AGE", "3600"),
        ]));
        assert_eq!(o.length, Duration::from_millis(50));
        assert_eq!(
            (o.max_bytes, o.max_age),
            (Some(1_000_000), Some(Duration::from_secs(3600)))
        );
        let o = EpochOptions::from_env(env(&[("CPUPROFILE_EPOCH", "-1"), ("CPUPROFILE_DB_MAX_BYTES", "lots")]));
        assert_eq!((o.length, o.max_bytes), (Duration::from_secs(600), None));
        assert_eq!(EpochOptions::new(Duration::ZERO).length, MIN_EPOCH);
    }
}
