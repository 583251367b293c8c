//! Reading a profile database: `DB/<epoch start, UTC, YYYYMMDDTHHMMSSZ>/<program>.<pid>.prof`,
//! each file a complete profile of one process over one epoch (written under a temporary name
//! and renamed, so names not ending in `.prof`, or starting with `.`, are a writer's unfinished
//! files and are skipped without a word).
//!
//! A database is read by people looking at history, so one bad file never stops a reading: a
//! file that is not a profile, or whose name is not `<program>.<pid>.prof`, is reported on
//! stderr and skipped; one cut short is read up to the cut (with [`crate::cut_short`]'s warning).
//! Processes of one program in one epoch are summed as `merge` sums them (addresses translated
//! through each process's maps), and so are epochs when a range is read as one profile.

use crate::symbolize::Locator;
use cpuprof::format::Profile;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Which epochs of which program to read.
#[derive(clap::Args, Clone, Default)]
pub struct Selection {
    /// The program (the file names' `<program>` part). Needed when the database holds several.
    #[arg(long, value_name = "NAME")]
    pub program: Option<String>,
    /// Only epochs starting at or after TIME (UTC: YYYYMMDDTHHMMSSZ or 2026-11-23T08:00:00Z;
    /// trailing fields may be left out, as in 20261123T08).
    #[arg(long, value_name = "TIME", value_parser = time_bound)]
    pub from: Option<String>,
    /// Only epochs starting before TIME (same forms as --from). Not `--to`, which `convert`
    /// already has for the output format.
    #[arg(long = "until", value_name = "TIME", value_parser = time_bound)]
    pub to: Option<String>,
    /// Only these epochs (directory names, comma-separated or repeated).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub epochs: Vec<String>,
}

/// The epoch-name template a partial time is completed from.
const TEMPLATE: &str = "00000101T000000Z";

/// A --from/--to bound as a full epoch name: separators dropped, missing fields zero.
fn time_bound(text: &str) -> Result<String, String> {
    let compact: String = text.chars().filter(|c| !matches!(c, '-' | ':')).collect();
    let compact = compact.strip_suffix('Z').unwrap_or(&compact).to_string();
    let full = format!("{compact}{}", &TEMPLATE[compact.len().min(TEMPLATE.len())..]);
    if compact.len() >= 4 && is_epoch_name(&full) {
        Ok(full)
    } else {
        Err(format!(
            "`{text}`: expected a UTC time as YYYYMMDDTHHMMSSZ (trailing fields may be left out)"
        ))
    }
}

/// `YYYYMMDDTHHMMSSZ`.
pub fn is_epoch_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 16
        && b.iter().enumerate().all(|(i, c)| match i {
            8 => *c == b'T',
            15 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// The epoch's start as a time (for DCPI's epoch stamps).
pub fn epoch_start(name: &str) -> Option<std::time::SystemTime> {
    if !is_epoch_name(name) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| name[r].parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (hh, mm, ss) = (n(9..11)?, n(11..13)?, n(13..15)?);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's civil algorithm).
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// One process's file in one epoch.
#[derive(Clone, Debug)]
pub struct Entry {
    pub epoch: String,
    pub program: String,
    pub pid: u32,
    pub path: PathBuf,
}

/// The files of a database, by name (nothing is read yet).
pub struct Database {
    pub dir: PathBuf,
    /// Sorted by epoch, then program, then pid.
    pub entries: Vec<Entry>,
}

impl Database {
    /// Lists `dir`. Names that are neither epochs nor profiles are reported once and skipped.
    pub fn open(dir: &Path) -> Result<Database, String> {
        let mut entries = Vec::new();
        for epoch_dir in sorted(dir)? {
            let Some(epoch) = name_of(&epoch_dir) else { continue };
            if epoch.starts_with('.') {
                continue;
            }
            if !is_epoch_name(&epoch) || !epoch_dir.is_dir() {
                eprintln!(
                    "cpuprof: skipping {}: not an epoch directory (YYYYMMDDTHHMMSSZ)",
                    epoch_dir.display()
                );
                continue;
            }
            let files = match sorted(&epoch_dir) {
                Ok(files) => files,
                Err(e) => {
                    eprintln!("cpuprof: skipping epoch {epoch}: {e}");
                    continue;
                }
            };
            for path in files {
                let Some(name) = name_of(&path) else { continue };
                // A writer's temporary file, renamed into place when complete.
                let Some(stem) = name.strip_suffix(".prof").filter(|_| !name.starts_with('.')) else {
                    continue;
                };
                match stem
                    .rsplit_once('.')
                    .and_then(|(p, pid)| Some((p, pid.parse::<u32>().ok()?)))
                {
                    Some((program, pid)) if !program.is_empty() => entries.push(Entry {
                        epoch: epoch.clone(),
                        program: program.to_string(),
                        pid,
                        path,
                    }),
                    _ => eprintln!("cpuprof: skipping {}: not named <program>.<pid>.prof", path.display()),
                }
            }
        }
        entries.sort_by(|a, b| (&a.epoch, &a.program, a.pid).cmp(&(&b.epoch, &b.program, b.pid)));
        Ok(Database {
            dir: dir.to_path_buf(),
            entries,
        })
    }

    /// Whether `dir` looks like a database (has an epoch directory) rather than a directory of
    /// profiles.
    pub fn is_database(dir: &Path) -> bool {
        sorted(dir)
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

    /// The selected program's files, by epoch: `--program`, or the only program there is.
    pub fn select(&self, selection: &Selection) -> Result<(String, BTreeMap<String, Vec<Entry>>), String> {
        let program = match &selection.program {
            Some(p) => p.clone(),
            None => {
                let programs = self.programs();
                match programs.len() {
                    1 => programs.first().unwrap().to_string(),
                    0 => return Err(format!("{}: no profiles in this database", self.dir.display())),
                    _ => {
                        return Err(format!(
                            "{} holds several programs ({}): choose one with --program",
                            self.dir.display(),
                            programs.into_iter().collect::<Vec<_>>().join(", ")
                        ))
                    }
                }
            }
        };
        let wanted: BTreeSet<&str> = selection.epochs.iter().map(String::as_str).collect();
        let mut epochs: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        for e in self.entries.iter().filter(|e| e.program == program) {
            let after_from = selection.from.as_deref().is_none_or(|f| e.epoch.as_str() >= f);
            let before_to = selection.to.as_deref().is_none_or(|t| e.epoch.as_str() < t);
            if after_from && before_to && (wanted.is_empty() || wanted.contains(e.epoch.as_str())) {
                epochs.entry(e.epoch.clone()).or_default().push(e.clone());
            }
        }
        for w in &wanted {
            if !epochs.contains_key(*w) {
                eprintln!("cpuprof: epoch {w} has no profile of {program} in the selection");
            }
        }
        if epochs.is_empty() {
            return Err(format!(
                "{}: no epoch of {program} in the selection",
                self.dir.display()
            ));
        }
        Ok((program, epochs))
    }
}

fn name_of(path: &Path) -> Option<String> {
    Some(path.file_name()?.to_str()?.to_string())
}

fn sorted(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    paths.sort();
    Ok(paths)
}

/// The profiles of `entries` that can be read; the others are reported and skipped.
pub fn read_all(entries: &[Entry], locator: &Locator) -> Vec<(String, Profile)> {
    let mut out = Vec::new();
    for e in entries {
        let read = std::fs::read(&e.path)
            .map_err(|err| format!("cannot read {}: {err}", e.path.display()))
            .and_then(|bytes| crate::cut_short::read(&e.path, &bytes, locator));
        match read {
            Ok(profile) => out.push((e.path.display().to_string(), profile)),
            Err(err) => eprintln!("cpuprof: skipping {err}"),
        }
    }
    out
}

/// The readable profiles of `entries` summed into one raw profile, as `merge` writes it; None
/// when none could be read.
pub fn merged(entries: &[Entry], locator: &Locator) -> Result<Option<Vec<u8>>, String> {
    let profiles = read_all(entries, locator);
    if profiles.is_empty() {
        return Ok(None);
    }
    Ok(Some(crate::merge::merge(&profiles)?.0))
}

/// The whole selection as one raw profile, and a name for it in messages.
pub fn merged_selection(dir: &Path, selection: &Selection, locator: &Locator) -> Result<(PathBuf, Vec<u8>), String> {
    let db = Database::open(dir)?;
    let (program, epochs) = db.select(selection)?;
    let entries: Vec<Entry> = epochs.into_values().flatten().collect();
    let bytes = merged(&entries, locator)?
        .ok_or_else(|| format!("{}: no readable profile of {program} in the selection", dir.display()))?;
    Ok((dir.join(&program), bytes))
}

/// `cpuprof db DIR`: every program with its epochs, processes, samples and time span, then
/// every epoch. Unreadable files are reported on stderr and counted.
pub fn listing(dir: &Path, locator: &Locator) -> Result<String, String> {
    let db = Database::open(dir)?;
    #[derive(Default)]
    struct Line {
        epochs: BTreeSet<String>,
        pids: BTreeSet<u32>,
        samples: u64,
        files: usize,
        unreadable: usize,
    }
    let mut programs: BTreeMap<&str, Line> = BTreeMap::new();
    let mut epochs: BTreeMap<&str, Line> = BTreeMap::new();
    for e in &db.entries {
        let samples = read_all(std::slice::from_ref(e), locator)
            .first()
            .map(|(_, p)| p.total_samples());
        for line in [
            programs.entry(&e.program).or_default(),
            epochs.entry(&e.epoch).or_default(),
        ] {
            line.epochs.insert(e.epoch.clone());
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
            l.epochs.first().map_or("", String::as_str),
            l.epochs.last().map_or("", String::as_str)
        );
    }
    let _ = writeln!(
        out,
        "\n{:<16} {:>8} {:>9} {:>10} {:>10}",
        "epoch", "programs", "processes", "samples", "unreadable"
    );
    for (name, l) in &epochs {
        let in_epoch = db.entries.iter().filter(|e| e.epoch == *name);
        let programs: BTreeSet<&str> = in_epoch.map(|e| e.program.as_str()).collect();
        let _ = writeln!(
            out,
            "{name:<16} {:>8} {:>9} {:>10} {:>10}",
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
        assert_eq!(time_bound("20261123T08").unwrap(), "20261123T080000Z");
        assert_eq!(time_bound("2026-11-23T08:30:00Z").unwrap(), "20261123T083000Z");
        assert_eq!(time_bound("2026").unwrap(), "20260101T000000Z");
        assert!(time_bound("yesterday").is_err());
        assert!(time_bound("20261123X08").is_err());
    }

    #[test]
    fn epoch_names_are_utc_times() {
        let t = epoch_start("20261123T084841Z").unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        // `date -u -d 2026-11-23T08:48:41Z +%s`
        assert_eq!(secs, 1_795_423_721);
        assert!(epoch_start("1970010T000000Z").is_none());
    }
}
