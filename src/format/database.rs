//! Names in a profile database, shared by the writer (`writer::epochs`) and the readers (the
//! CLI's `db`, `history`, `--db`): `DB/<epoch>/<file>`.
//!
//! * `<epoch>` is the epoch's start in UTC, `YYYYMMDDTHHMMSSZ`, with milliseconds
//!   (`YYYYMMDDTHHMMSS.mmmZ`) when the epoch length is not whole seconds, so that short epochs
//!   do not share a directory. Readers order epochs by the time a name stands for, never by the
//!   name's text (`.` sorts before `Z`).
//! * `<file>` is `<program>.<pid>.prof` for the first image of a process in an epoch and
//!   `<program>~N.<pid>.prof` (N >= 2) for the images after it (a program that execs itself).
//!   `<program>` may contain dots (the pid is the last dot-separated field) but no `~` (the
//!   writer replaces it, as it replaces `/` and control characters).
//! * A name starting with `.` or not ending in `.prof` is a writer's unfinished file
//!   (`.<program>.<pid>.<ns>.prof.tmp`), to be skipped.
//!
//! Pure code: no file is touched here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The name of the epoch starting at `start`, for epochs of `length`.
pub fn epoch_name(start: SystemTime, length: Duration) -> String {
    let since = start.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil_from_days((secs / 86400) as i64);
    let s = secs % 86400;
    let mut name = format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}", s / 3600, s / 60 % 60, s % 60);
    if length.subsec_nanos() != 0 {
        name += &format!(".{:03}", since.subsec_millis());
    }
    name + "Z"
}

/// The start of the epoch named `name`, if it is an epoch name (either form).
pub fn parse_epoch_name(name: &str) -> Option<SystemTime> {
    let body = name.strip_suffix('Z')?;
    let (whole, millis) = match body.split_once('.') {
        Some((w, f)) if f.len() == 3 && f.bytes().all(|b| b.is_ascii_digit()) => (w, f.parse::<u64>().ok()?),
        Some(_) => return None,
        None => (body, 0),
    };
    let b = whole.as_bytes();
    if b.len() != 15 || b[8] != b'T' || !b.iter().enumerate().all(|(i, c)| i == 8 || c.is_ascii_digit()) {
        return None;
    }
    let num = |r: std::ops::Range<usize>| whole[r].parse::<u64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 59 {
        return None;
    }
    let days = days_from_civil(y as i64, m as u32, d as u32);
    let secs = u64::try_from(days).ok()? * 86400 + hh * 3600 + mm * 60 + ss;
    Some(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis))
}

/// A finished profile's name in an epoch directory, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileName {
    /// The program's name, as the writer made it safe for a file name.
    pub program: String,
    /// The process id.
    pub pid: u32,
    /// 1 for `<program>.<pid>.prof`, N for `<program>~N.<pid>.prof`.
    pub image: u32,
}

impl FileName {
    /// The file's name: `<program>.<pid>.prof`, or `<program>~N.<pid>.prof` after the first
    /// image.
    pub fn to_name(&self) -> String {
        match self.image {
            0 | 1 => format!("{}.{}.prof", self.program, self.pid),
            n => format!("{}~{n}.{}.prof", self.program, self.pid),
        }
    }
}

/// What an entry of an epoch directory is.
#[derive(Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A finished profile.
    Profile(FileName),
    /// A writer's unfinished file: not to be read, not an error.
    Unfinished,
    /// Anything else: worth a warning.
    Foreign,
}

/// Classifies a name found in an epoch directory.
pub fn parse_file_name(name: &str) -> FileKind {
    let Some(stem) = name.strip_suffix(".prof").filter(|_| !name.starts_with('.')) else {
        return if name.starts_with('.') || name.ends_with(".prof.tmp") {
            FileKind::Unfinished
        } else {
            FileKind::Foreign
        };
    };
    let Some((program, pid)) = stem.rsplit_once('.') else {
        return FileKind::Foreign;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return FileKind::Foreign;
    };
    let (program, image) = match program.rsplit_once('~') {
        Some((p, n)) => match n.parse::<u32>() {
            Ok(image) if image >= 2 && n == image.to_string() => (p, image),
            _ => (program, 1),
        },
        None => (program, 1),
    };
    if program.is_empty() {
        return FileKind::Foreign;
    }
    FileKind::Profile(FileName {
        program: program.to_string(),
        pid,
        image,
    })
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_names_are_utc_starts_in_either_form() {
        let start = UNIX_EPOCH + Duration::from_secs(1_795_000_200);
        assert_eq!(epoch_name(start, Duration::from_secs(600)), "20261118T111000Z");
        assert_eq!(parse_epoch_name("20261118T111000Z"), Some(start));
        let short = start + Duration::from_millis(450);
        assert_eq!(epoch_name(short, Duration::from_millis(50)), "20261118T111000.450Z");
        assert_eq!(parse_epoch_name("20261118T111000.450Z"), Some(short));
        // `date -u -d 2026-11-23T08:48:41Z +%s`
        assert_eq!(
            parse_epoch_name("20261123T084841Z"),
            Some(UNIX_EPOCH + Duration::from_secs(1_795_423_721))
        );
        assert_eq!(epoch_name(UNIX_EPOCH, Duration::from_secs(1)), "19700101T000000Z");
        for bad in [
            "20261119T064800",
            "2026111xT064800Z",
            "20261319T064800Z",
            "1970010T000000Z",
            ".x",
            "20261119T064800.5Z",
        ] {
            assert_eq!(parse_epoch_name(bad), None, "{bad}");
        }
        for days in [0, 59, 60, 365, 10_957, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn file_names_round_trip_and_unfinished_files_are_told_apart() {
        for (name, program, pid, image) in [
            ("hot.123.prof", "hot", 123, 1),
            ("python3.11.77.prof", "python3.11", 77, 1),
            ("epoch_workers~2.9.prof", "epoch_workers", 9, 2),
            ("a~b.5.prof", "a~b", 5, 1),
            ("x~1.5.prof", "x~1", 5, 1),
            ("x~02.5.prof", "x~02", 5, 1),
        ] {
            let parsed = FileName {
                program: program.to_string(),
                pid,
                image,
            };
            assert_eq!(parse_file_name(name), FileKind::Profile(parsed.clone()), "{name}");
            assert_eq!(parsed.to_name(), name);
        }
        for name in [
            ".hot.12.1795000000000000000.prof.tmp",
            ".hot.9.prof",
            "hot.10.prof.tmp",
            ".prof",
        ] {
            assert_eq!(parse_file_name(name), FileKind::Unfinished, "{name}");
        }
        for name in ["hot.prof", "12.prof", "notes.txt", "hot.x.prof"] {
            assert_eq!(parse_file_name(name), FileKind::Foreign, "{name}");
        }
    }
}
