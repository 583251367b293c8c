//! `convert --to pprof`: the profile as gzipped pprof protobuf, symbolised here (functions,
//! files, lines, inlined frames) so readers need no access to the binaries.

use crate::progress::Progress;
use crate::symbolize::{build_id, Locator, Symbolizer};
use cpuprof::format::pprof::{Location, Mapping, Pprof, Sample};
use cpuprof::format::Profile;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

pub fn encode(profile: &Profile, locator: &Locator) -> Pprof {
    let mut symbolizer = Symbolizer::new(locator.clone(), &profile.maps);
    let mut pprof = Pprof {
        period_ns: profile.period_us * 1000,
        ..Pprof::default()
    };
    let mut mapping_of_entry: HashMap<usize, usize> = HashMap::new();
    let mut build_ids: HashMap<String, String> = HashMap::new();
    for (i, entry) in profile.maps.entries.iter().enumerate() {
        if !entry.is_executable() {
            continue;
        }
        let id = build_ids
            .entry(entry.path.clone())
            .or_insert_with(|| {
                let real = entry.path.starts_with('/');
                real.then(|| build_id(Path::new(&entry.path)))
                    .flatten()
                    .unwrap_or_default()
            })
            .clone();
        mapping_of_entry.insert(i, pprof.mappings.len());
        pprof.mappings.push(Mapping {
            start: entry.start,
            limit: entry.end,
            file_offset: entry.offset,
            file: entry.path.clone(),
            build_id: id,
        });
    }
    let mut location_of_addr: HashMap<u64, usize> = HashMap::new();
    let mut progress = Progress::new("converting", profile.samples.len());
    for (n, s) in profile.samples.iter().enumerate() {
        progress.update(n);
        let locations = s
            .pcs
            .iter()
            .enumerate()
            .map(|(i, &pc)| {
                // Return addresses point after the call; pprof expects the call itself, as its
                // own reader of raw profiles does.
                let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
                *location_of_addr.entry(addr).or_insert_with(|| {
                    let mapping = profile
                        .maps
                        .entries
                        .iter()
                        .position(|e| e.contains(addr) && e.is_executable())
                        .and_then(|i| mapping_of_entry.get(&i).copied());
                    pprof.locations.push(Location {
                        address: addr,
                        mapping,
                        frames: symbolizer.frames(&profile.maps, addr),
                    });
                    pprof.locations.len() - 1
                })
            })
            .collect();
        pprof.samples.push(Sample {
            locations,
            count: s.count,
        });
    }
    pprof
}

pub fn write(pprof: &Pprof, output: &Path) -> Result<(), String> {
    let file = std::fs::File::create(output).map_err(|e| format!("cannot create {}: {e}", output.display()))?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
    gz.write_all(&pprof.encode())
        .and_then(|()| gz.finish()?.flush())
        .map_err(|e| format!("cannot write {}: {e}", output.display()))
}
