//! Reading a profile database: `DB/<epoch start, UTC, YYYYMMDDTHHMMSSZ>/<program>.<pid>.prof`,
//! each file a complete profile of one process over one epoch (written under a temporary name
//! and renamed, so names not ending in `.prof`, or starting with `.`, are a writer's unfinished
//! files and are skipped without a word). The names are those of [`cpuprof::format::database`]:
//! epochs may carry milliseconds (`YYYYMMDDTHHMMSS.mmmZ`), and a program that execs itself
//! within an epoch writes `<program>~N.<pid>.prof` after its first image, summed with it.
//!
//! A database is read by people looking at history, so one bad file never stops a reading: a
//! file that is not a profile, or whose name is not `<program>.<pid>.prof`, is reported on
//! stderr and skipped; one cut short is read up to the cut (with [`crate::input::raw`]'s warning).
//! Processes of one program in one epoch are summed as `merge` sums them (addresses translated
//! through each process's maps), and so are epochs when a range is read as one profile.

use crate::error::Result;
use crate::symbols::Locator;
use cpuprof::format::database::{parse_epoch_name, parse_file_name, FileKind};
use cpuprof::format::Profile;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Which epochs of which program to read.
#[derive(clap::Args, Clone, Default)]
pub struct Selection {
    /// The program (the file names' `<program>` part). Needed when the database holds several.
    #[arg(long, value_name = "NAME")]
    pub program: Option<String>,
    /// Only epochs starting at or after TIME (UTC: YYYYMMDDTHHMMSSZ or 2026-11-23T08:00:00Z;
    /// trailing fields may be left out, as in 20261123T08).
    #[arg(long, value_name = "TIME", value_parser = time_bound)]
    pub from: Option<SystemTime>,
    /// Only epochs starting before TIME (same forms as --from). Not `--to`, which `convert`
    /// already has for the output format.
    #[arg(long = "until", value_name = "TIME", value_parser = time_bound)]
    pub to: Option<SystemTime>,
    /// Only these epochs (directory names, comma-separated or repeated).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub epochs: Vec<String>,
}

/// The epoch-name template a partial time is completed from.
const TEMPLATE: &str = "00000101T000000Z";

/// A --from/--until bound: an epoch name, separators allowed, trailing fields left out as zero,
/// milliseconds allowed (`20261123T080000.250Z`).
fn time_bound(text: &str) -> std::result::Result<SystemTime, String> {
    let compact: String = text.chars().filter(|c| !matches!(c, '-' | ':')).collect();
    let compact = compact.strip_suffix('Z').unwrap_or(&compact);
    let (whole, millis) = compact.split_once('.').unwrap_or((compact, ""));
    let full = format!(
        "{whole}{}",
        &TEMPLATE[whole.len().min(TEMPLATE.len() - 1)..TEMPLATE.len() - 1]
    );
    let name = match millis {
        "" => format!("{full}Z"),
        m => format!("{full}.{m}Z"),
    };
    match parse_epoch_name(&name) {
        Some(t) if whole.len() >= 4 && whole.len() <= 15 => Ok(t),
        _ => Err(format!(
            "`{text}`: expected a UTC time as YYYYMMDDTHHMMSSZ (trailing fields may be left out)"
        )),
    }
}

/// Whether `name` is an epoch directory's name.
pub fn is_epoch_name(name: &str) -> bool {
    parse_epoch_name(name).is_some()
}

/// One process's file in one epoch.
#[derive(Clone, Debug)]
pub struct Entry {
    pub epoch: String,
    /// The epoch's start (what epochs are ordered and selected by).
    pub start: SystemTime,
    pub program: String,
    pub pid: u32,
    /// 1, or N for the image a self-exec wrote as `<program>~N.<pid>.prof`.
    pub image: u32,
    pub path: PathBuf,
}

/// One epoch's name and its files.
pub type EpochFiles = (String, Vec<Entry>);

/// The files of a database, by name (nothing is read yet).
pub struct Database {
    pub dir: PathBuf,
    /// Sorted by epoch, then program, then pid.
    pub entries: Vec<Entry>,
}

impl Database {
    /// Lists `dir`. Names that are neither epochs nor profiles are reported once and skipped.
    pub fn open(dir: &Path) -> Result<Database> {
        let mut entries = Vec::new();
        for epoch_dir in crate::input::sorted_entries(dir)? {
            let Some(epoch) = name_of(&epoch_dir) else { continue };
            if epoch.starts_with('.') {
                continue;
            }
            let Some(start) = parse_epoch_name(&epoch).filter(|_| epoch_dir.is_dir()) else {
                eprintln!(
                    "cpuprof: skipping {}: not an epoch directory (YYYYMMDDTHHMMSSZ)",
                    epoch_dir.display()
                );
                continue;
            };
            let files = match crate::input::sorted_entries(&epoch_dir) {
                Ok(files) => files,
                Err(e) => {
                    eprintln!("cpuprof: skipping epoch {epoch}: {e}");
                    continue;
                }
            };
            for path in files {
                let Some(name) = name_of(&path) else { continue };
                match parse_file_name(&name) {
                    FileKind::Profile(file) => entries.push(Entry {
                        epoch: epoch.clone(),
                        start,
                        program: file.program,
                        pid: file.pid,
                        image: file.image,
                        path,
                    }),
                    // A writer's temporary file, renamed into place when complete.
                    FileKind::Unfinished => {}
                    FileKind::Foreign => {
                        eprintln!("cpuprof: skipping {}: not named <program>.<pid>.prof", path.display())
                    }
                }
            }
        }
        entries.sort_by(|a, b| (a.start, &a.program, a.pid, a.image).cmp(&(b.start, &b.program, b.pid, b.image)));
        Ok(Database {
            dir: dir.to_path_buf(),
            entries,
        })
    }

    /// Whether `dir` looks like a database (has an epoch directory) rather than a directory of
    /// profiles.
    pub fn is_database(dir: &Path) -> bool {
        crate::input::sorted_entries(dir)
            .map(|children| {
                children
                    .iter()
                    .any(|c| c.is_dir() && name_of(c).is_some_and(|n| is_epoch_name(&n)))
            })
            .unwrap_or(false)
    }

    pub fn programs(&self) -> BTreeSet<&str> {
        self.entries.iter().map(|e| e.program.as_str()).collect()
    }

    /// The selected program's files, by epoch in time order: `--program`, or the only program
    /// there is.
    pub fn select(&self, selection: &Selection) -> Result<(String, Vec<EpochFiles>)> {
        let program = match &selection.program {
            Some(p) => p.clone(),
            None => {
                let programs = self.programs();
                match programs.len() {
                    1 => programs.first().unwrap().to_string(),
                    0 => return Err(format!("{}: no profiles in this database", self.dir.display()).into()),
                    _ => {
                        return Err(format!(
                            "{} holds several programs ({}): choose one with --program",
                            self.dir.display(),
                            programs.into_iter().collect::<Vec<_>>().join(", ")
                        )
                        .into())
                    }
                }
            }
        };
        let wanted: BTreeSet<&str> = selection.epochs.iter().map(String::as_str).collect();
        // Entries are in time order: consecutive ones of an epoch make its group.
        let mut epochs: Vec<EpochFiles> = Vec::new();
        for e in self.entries.iter().filter(|e| e.program == program) {
            let after_from = selection.from.is_none_or(|f| e.start >= f);
            let before_to = selection.to.is_none_or(|t| e.start < t);
            if after_from && before_to && (wanted.is_empty() || wanted.contains(e.epoch.as_str())) {
                match epochs.last_mut() {
                    Some((name, group)) if *name == e.epoch => group.push(e.clone()),
                    _ => epochs.push((e.epoch.clone(), vec![e.clone()])),
                }
            }
        }
        for w in &wanted {
            if !epochs.iter().any(|(name, _)| name == w) {
                eprintln!("cpuprof: epoch {w} has no profile of {program} in the selection");
            }
        }
        if epochs.is_empty() {
            return Err(format!("{}: no epoch of {program} in the selection", self.dir.display()).into());
        }
        Ok((program, epochs))
    }
}

fn name_of(path: &Path) -> Option<String> {
    Some(path.file_name()?.to_str()?.to_string())
}

/// The profiles of `entries` that can be read; the others are reported and skipped.
pub fn read_all(entries: &[Entry], locator: &Locator) -> Vec<(String, Profile)> {
    let mut out = Vec::new();
    for e in entries {
        let read = crate::input::raw::read_file(&e.path, locator);
        match read {
            Ok(profile) => out.push((e.path.display().to_string(), profile)),
            Err(err) => eprintln!("cpuprof: skipping {err}"),
        }
    }
    out
}

/// The readable profiles of `entries` summed into one raw profile, as `merge` writes it; None
/// when none could be read.
pub fn merged(entries: &[Entry], locator: &Locator) -> Result<Option<Vec<u8>>> {
    let profiles = read_all(entries, locator);
    if profiles.is_empty() {
        return Ok(None);
    }
    Ok(Some(crate::model::merge::merge(&profiles)?.0))
}

/// The whole selection as one raw profile, and a name for it in messages.
pub fn merged_selection(dir: &Path, selection: &Selection, locator: &Locator) -> Result<(PathBuf, Vec<u8>)> {
    let db = Database::open(dir)?;
    let (program, epochs) = db.select(selection)?;
    let entries: Vec<Entry> = epochs.into_iter().flat_map(|(_, group)| group).collect();
    let bytes = merged(&entries, locator)?
        .ok_or_else(|| format!("{}: no readable profile of {program} in the selection", dir.display()))?;
    Ok((dir.join(&program), bytes))
}

/// `cpuprof db DIR`: every program with its epochs, processes, samples and time span, then
/// every epoch. Unreadable files are reported on stderr and counted.
pub fn listing(dir: &Path, locator: &Locator) -> Result<String> {
    let db = Database::open(dir)?;
    #[derive(Default)]
    struct Line {
        epochs: BTreeSet<(SystemTime, String)>,
        pids: BTreeSet<u32>,
        samples: u64,
        files: usize,
        unreadable: usize,
    }
    let mut programs: BTreeMap<&str, Line> = BTreeMap::new();
    // Keyed by start, then name: in time order whatever the names' forms.
    let mut epochs: BTreeMap<(SystemTime, &str), Line> = BTreeMap::new();
    for e in &db.entries {
        let samples = read_all(std::slice::from_ref(e), locator)
            .first()
            .map(|(_, p)| p.total_samples());
        for line in [
            programs.entry(&e.program).or_default(),
            epochs.entry((e.start, &e.epoch)).or_default(),
        ] {
            line.epochs.insert((e.start, e.epoch.clone()));
            line.pids.insert(e.pid);
            line.files += 1;
            match samples {
                Some(n) => line.samples = line.samples.saturating_add(n),
                None => line.unreadable += 1,
            }
        }
    }
    let mut out = format!(
        "{}: {} programs, {} epochs, {} files\n\n",
        db.dir.display(),
        programs.len(),
        epochs.len(),
        db.entries.len()
    );
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>9} {:>10} {:>10}  first epoch .. last epoch",
        "program", "epochs", "processes", "samples", "unreadable"
    );
    for (name, l) in &programs {
        let _ = writeln!(
            out,
            "{name:<24} {:>6} {:>9} {:>10} {:>10}  {} .. {}",
            l.epochs.len(),
            l.pids.len(),
            l.samples,
            l.unreadable,
            l.epochs.first().map_or("", |(_, name)| name.as_str()),
            l.epochs.last().map_or("", |(_, name)| name.as_str())
        );
    }
    let width = epochs.keys().map(|(_, name)| name.len()).max().unwrap_or(16);
    let _ = writeln!(
        out,
        "\n{:<width$} {:>8} {:>9} {:>10} {:>10}",
        "epoch", "programs", "processes", "samples", "unreadable"
    );
    for ((_, name), l) in &epochs {
        let in_epoch = db.entries.iter().filter(|e| e.epoch == *name);
        let programs: BTreeSet<&str> = in_epoch.map(|e| e.program.as_str()).collect();
        let _ = writeln!(
            out,
            "{name:<width$} {:>8} {:>9} {:>10} {:>10}",
            programs.len(),
            l.files,
            l.samples,
            l.unreadable
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_completed_epoch_names() {
        let at = |name: &str| parse_epoch_name(name).unwrap();
        assert_eq!(time_bound("20261123T08").unwrap(), at("20261123T080000Z"));
        assert_eq!(time_bound("2026-11-23T08:30:00Z").unwrap(), at("20261123T083000Z"));
        assert_eq!(time_bound("2026").unwrap(), at("20260101T000000Z"));
        assert_eq!(time_bound("20261123T080000.250Z").unwrap(), at("20261123T080000.250Z"));
        assert!(time_bound("yesterday").is_err());
        assert!(time_bound("20261123X08").is_err());
        assert!(time_bound("20261123T0800001").is_err());
    }
}
