//! DCPI profiles read (format version 0.07, `shared/spec/dcpi-format.txt`; written by
//! `render::dcpi`): one file per image, the samples of each instruction address of that image
//! (the leaf PCs; DCPI has no call chains).

use crate::model::stacks::Stacks;
use crate::symbols::{file_name, Locator, Symbolizer};
use std::collections::HashMap;

/// A parsed DCPI profile.
#[derive(Debug)]
pub struct DcpiProfile {
    pub path: Option<String>,
    pub tstart: u64,
    pub period_us: u64,
    pub runtime: bool,
    /// (offset from tstart, count), in file order.
    pub counts: Vec<(u64, u64)>,
}

/// Whether `bytes` look like a DCPI profile.
pub fn is_dcpi(bytes: &[u8]) -> bool {
    bytes.starts_with(b"version")
}

/// Parses a DCPI profile of major version 0; errors name the byte offset.
pub fn parse(bytes: &[u8]) -> Result<DcpiProfile, String> {
    let mut pos = 0;
    let mut fields: HashMap<String, String> = HashMap::new();
    loop {
        let end = bytes[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(format!("header line at byte {pos} has no end (no `samples` line)"))?;
        let line = String::from_utf8_lossy(&bytes[pos..pos + end]).into_owned();
        pos += end + 1;
        let line = line.trim_end_matches([' ', '\t']);
        if line == "samples" {
            break;
        }
        let (key, value) = line.split_once([' ', '\t']).unwrap_or((line, ""));
        fields.insert(key.to_string(), value.trim().to_string());
    }
    let version = fields.get("version").ok_or("header has no `version` line")?;
    if !version.starts_with("pdb-0.") {
        return Err(format!("unsupported DCPI version {version} (major version 0 is read)"));
    }
    let tstart = fields
        .get("tstart")
        .and_then(|t| u64::from_str_radix(t, 16).ok())
        .ok_or("header has no valid `tstart` line")?;
    let period_us = fields.get("period").and_then(|p| p.parse().ok()).unwrap_or(1);
    let word = |at: usize| -> Result<u64, String> {
        let b = bytes
            .get(at..at + 4)
            .ok_or(format!("truncated at byte {at}: expected a 4-byte value"))?;
        Ok(u64::from(u32::from_le_bytes(b.try_into().unwrap())))
    };
    let mut counts = Vec::new();
    let mut last_end: Option<u64> = None;
    while bytes.len().saturating_sub(pos) > 8 {
        let (offset, number) = (word(pos)?, word(pos + 4)?);
        if last_end.is_some_and(|e| offset < e) {
            return Err(format!("chunk at byte {pos} overlaps or precedes the previous one"));
        }
        let chunk_end = pos + 8 + 4 * number as usize;
        if chunk_end + 8 > bytes.len() {
            return Err(format!("chunk at byte {pos} of {number} counts runs past the footer"));
        }
        for i in 0..number {
            let c = word(pos + 8 + 4 * i as usize)?;
            if c > 0 {
                counts.push((offset + i, c));
            }
        }
        last_end = Some(offset + number);
        pos = chunk_end;
    }
    if bytes.len() - pos != 8 {
        return Err(format!("truncated footer at byte {pos}"));
    }
    let (addresses, total) = (word(pos)?, word(pos + 4)?);
    let (have_addresses, have_total) = (counts.len() as u64, counts.iter().map(|c| c.1).sum::<u64>());
    if (addresses, total) != (have_addresses, have_total) {
        return Err(format!(
            "footer at byte {pos} says {addresses} addresses and {total} samples; the chunks hold {have_addresses} and {have_total}"
        ));
    }
    Ok(DcpiProfile {
        path: fields.get("path").cloned(),
        tstart,
        period_us,
        runtime: fields.get("addresses").is_some_and(|a| a == "runtime"),
        counts,
    })
}

/// DCPI profiles as one-frame stacks (the function at each address, inlined frames
/// expanded), for `top`.
pub fn stacks(profiles: &[DcpiProfile], locator: &Locator) -> Stacks {
    let mut symbolizer = Symbolizer::new(locator.clone(), &Default::default());
    let mut out = Stacks::new(profiles.first().map_or(1, |p| p.period_us));
    for p in profiles {
        let path = p.path.clone().unwrap_or_default();
        for &(offset, count) in &p.counts {
            let addr = p.tstart + offset;
            let frames: Vec<String> = (!p.runtime)
                .then(|| symbolizer.frames_at_svma(&path, addr))
                .flatten()
                .map(|f| f.into_iter().rev().map(|f| f.function).collect())
                .unwrap_or_else(|| vec![format!("[{}]", file_name(&path))]);
            out.push(frames, count);
        }
    }
    out
}
