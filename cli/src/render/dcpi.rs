//! DCPI profiles written (format version 0.07, `shared/spec/dcpi-format.txt`): one file per
//! image, holding the samples of each instruction address of that image (the leaf PCs; DCPI
//! has no call chains).
//!
//! The ASCII header (every required line once, plus `path` and two lines of our own that
//! readers must preserve), padded with blanks after `samples` so the binary part starts 4-byte
//! aligned; chunks of little-endian u32 `offset, number, counts...` sorted by offset; the
//! footer `addresses with samples, total samples`. Offsets are from `tstart`, the link-time
//! start of the image's executable segment, so profiles of one binary line up across runs; for
//! an image whose file cannot be read they are from its run-time mapping (`addresses runtime`).

use crate::error::{Error, Result};
use crate::symbols::{file_name, Locator, Symbolizer};
use cpuprof::format::Profile;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Sampled addresses closer than this share a chunk (the gap is stored as zero counts, cheaper
/// than a new chunk's 8-byte head).
const CHUNK_GAP: u64 = 8;

/// One image's samples: link-time (or run-time) address -> count.
struct Image {
    path: String,
    tstart: u64,
    tsize: u64,
    runtime: bool,
    counts: BTreeMap<u64, u64>,
}

/// Writes one DCPI file per sampled image into `dir`; returns the files written.
pub fn export(profile: &Profile, locator: &Locator, dir: &Path, epoch: std::time::SystemTime) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::create(dir, e))?;
    let mut symbolizer = Symbolizer::new(locator.clone(), &profile.maps);
    let mut images: BTreeMap<String, Image> = BTreeMap::new();
    let mut outside = 0u64;
    for s in &profile.samples {
        let Some(&pc) = s.pcs.first() else { continue };
        let Some(map) = profile.maps.find(pc) else { continue };
        let (addr, text, runtime) = match (symbolizer.svma(&profile.maps, pc), symbolizer.text(&map.path)) {
            (Some((_, svma)), Some(text)) => (svma, text, false),
            _ => (pc, (map.start, map.end - map.start), true),
        };
        let image = images.entry(map.path.clone()).or_insert_with(|| Image {
            path: map.path.clone(),
            tstart: text.0,
            tsize: text.1,
            runtime,
            counts: BTreeMap::new(),
        });
        // A run-time image spans all its executable mappings.
        let end = image.tstart.saturating_add(image.tsize);
        if image.runtime && !(image.tstart..end).contains(&addr) {
            image.tstart = image.tstart.min(map.start);
            image.tsize = end.max(map.end) - image.tstart;
        }
        if !image.runtime && !(image.tstart..end).contains(&addr) {
            // Outside the executable segment (a crafted or mismatched map): no offset in the
            // image to put it at.
            outside = outside.saturating_add(s.count);
            continue;
        }
        let count = image.counts.entry(addr).or_default();
        *count = count.saturating_add(s.count);
    }
    if outside > 0 {
        eprintln!(
            "cpuprof: warning: {outside} samples lie outside the executable segment of their object; not exported"
        );
    }
    let mut written = Vec::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    for image in images.values() {
        let base = match file_name(&image.path) {
            "" => "anonymous".to_string(),
            n => n.trim_matches(['[', ']']).to_string(),
        };
        let seen = names.entry(base.clone()).or_default();
        *seen += 1;
        let name = if *seen == 1 {
            format!("{base}.dcpi")
        } else {
            format!("{base}.{seen}.dcpi")
        };
        let path = dir.join(name);
        std::fs::write(&path, encode(image, profile.period_us, epoch)).map_err(|e| Error::write(&path, e))?;
        written.push(path);
    }
    Ok(written)
}

fn encode(image: &Image, period_us: u64, epoch: std::time::SystemTime) -> Vec<u8> {
    let mut header = String::new();
    let _ = writeln!(header, "version pdb-0.07");
    let _ = writeln!(header, "image {:016x}", fnv1a(image.path.as_bytes()));
    let _ = writeln!(header, "path {}", image.path);
    let _ = writeln!(header, "epoch {}", utc_yymmddhhmm(epoch));
    let _ = writeln!(header, "platform {}-linux", std::env::consts::ARCH);
    let _ = writeln!(header, "event cpu-time");
    let _ = writeln!(header, "period {period_us}");
    let _ = writeln!(header, "periodunit microseconds");
    let _ = writeln!(
        header,
        "addresses {}",
        if image.runtime { "runtime" } else { "link-time" }
    );
    let _ = writeln!(header, "tstart {:x}", image.tstart);
    let _ = writeln!(header, "tsize {}", image.tsize);
    let _ = writeln!(header, "cpuspeed {}", cpu_mhz());
    header.push_str("samples");
    while (header.len() + 1) % 4 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = header.into_bytes();
    let put = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&(v.min(u64::from(u32::MAX)) as u32).to_le_bytes());
    let addrs: Vec<(u64, u64)> = image.counts.iter().map(|(&a, &c)| (a - image.tstart, c)).collect();
    let mut i = 0;
    while i < addrs.len() {
        let mut j = i + 1;
        while j < addrs.len() && addrs[j].0 - addrs[j - 1].0 <= CHUNK_GAP {
            j += 1;
        }
        let (first, last) = (addrs[i].0, addrs[j - 1].0);
        put(&mut out, first);
        put(&mut out, last - first + 1);
        let mut k = i;
        for offset in first..=last {
            if addrs[k].0 == offset {
                put(&mut out, addrs[k].1);
                k += 1;
            } else {
                put(&mut out, 0);
            }
        }
        i = j;
    }
    put(&mut out, addrs.len() as u64);
    put(&mut out, addrs.iter().fold(0u64, |total, a| total.saturating_add(a.1)));
    out
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// `YYMMDDHHMM` in UTC.
fn utc_yymmddhhmm(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{:02}{month:02}{day:02}{:02}{:02}",
        year % 100,
        rem / 3600,
        rem % 3600 / 60
    )
}

fn cpu_mhz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("cpu MHz"))?;
            line.split(':').nth(1)?.trim().parse::<f64>().ok()
        })
        .map_or(0, |mhz| mhz.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::dcpi::parse;

    fn image(counts: &[(u64, u64)]) -> Image {
        Image {
            path: "/bin/x".into(),
            tstart: 0x1000,
            tsize: 0x1000,
            runtime: false,
            counts: counts.iter().copied().collect(),
        }
    }

    #[test]
    fn round_trip_with_aligned_header_and_sorted_chunks() {
        let bytes = encode(
            &image(&[(0x1010, 3), (0x1012, 1), (0x1800, 7)]),
            1000,
            std::time::UNIX_EPOCH,
        );
        let header_end = bytes.windows(8).position(|w| w.starts_with(b"samples")).unwrap();
        let binary_start = header_end + bytes[header_end..].iter().position(|&b| b == b'\n').unwrap() + 1;
        assert_eq!(binary_start % 4, 0);
        assert!(String::from_utf8_lossy(&bytes[..binary_start]).contains("epoch 7001010000\n"));
        let p = parse(&bytes).unwrap();
        assert_eq!(
            (p.tstart, p.period_us, p.path.as_deref()),
            (0x1000, 1000, Some("/bin/x"))
        );
        assert_eq!(p.counts, vec![(0x10, 3), (0x12, 1), (0x800, 7)]);
        // Two chunks: 0x10..=0x12 (gap filled with a zero) and 0x800.
        assert_eq!(bytes.len() - binary_start, (8 + 12) + (8 + 4) + 8);
    }

    #[test]
    fn corrupt_files_are_reported_with_offsets() {
        let bytes = encode(&image(&[(0x1010, 3)]), 1000, std::time::UNIX_EPOCH);
        let e = parse(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(e.contains("byte"), "{e}");
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 4] = 9;
        assert!(parse(&bad).unwrap_err().contains("footer"));
        assert!(parse(b"version pdb-1.01\nsamples\n")
            .unwrap_err()
            .contains("unsupported"));
        assert!(parse(b"version pdb-0.07\ntstart").unwrap_err().contains("no end"));
    }

    #[test]
    fn civil_dates() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        assert_eq!(utc_yymmddhhmm(t), "2611181106"); // 2026-11-18 11:06 UTC
    }
}
