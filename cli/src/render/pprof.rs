//! `convert --to pprof`: the profile as gzipped pprof protobuf, symbolised here (functions,
//! files, lines, inlined frames) so readers need no access to the binaries. A heap profile
//! becomes pprof's four heap sample types ([`encode_heap`]).

use crate::error::{Error, Result};
use crate::input::raw::ChainSet;
use crate::input::Source;
use crate::model::filters::{self, Filters};
use crate::render::progress::Progress;
use crate::symbols::{BuildIds, Locator, Symbolizer};
use cpuprof::format::contention::{ContentionProfile, ContentionValue};
use cpuprof::format::heap::{HeapProfile, HeapValue};
use cpuprof::format::pprof::{Pprof, PprofWriter};
use cpuprof::format::{Profile, ReadContext, Scan};
use flate2::write::GzEncoder;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

/// `profile` (already filtered by [`crate::model::filters::profile`]) with the inlined frames that
/// `filters` hide left out.
pub fn encode(profile: &Profile, locator: &Locator, filters: &Filters) -> Pprof {
    let mut symbolizer = Symbolizer::new(locator.clone(), &profile.maps);
    let mut build_ids = BuildIds::default();
    let addresses: HashSet<u64> = profile.samples.iter().flat_map(|s| s.pcs.iter().copied()).collect();
    let mut progress = Progress::new("symbolising addresses", addresses.len());
    let mut done = 0;
    Pprof::from_profile(
        profile,
        |addr| {
            done += 1;
            progress.update(done);
            let mut frames = symbolizer.frames(&profile.maps, addr);
            if filters.active() {
                frames.retain(|f| !filters.hides(&f.function));
            }
            frames
        },
        |path| build_ids.get(path).unwrap_or_default(),
    )
}

/// A heap profile as pprof's `alloc_objects`, `alloc_space`, `inuse_objects` and
/// `inuse_space` ([`HeapProfile::to_pprof`]: each line scaled back), its addresses named here as
/// [`encode`] names a CPU profile's, as `filters` leave it. `value` is made the last sample type,
/// which readers show by default (pprof's order has `inuse_space` last).
pub fn encode_heap(profile: &HeapProfile, locator: &Locator, filters: &Filters, value: HeapValue) -> Pprof {
    let filtered;
    let profile = if filters.active() {
        filtered = filters::heap_profile(profile, locator, filters);
        &filtered
    } else {
        profile
    };
    let maps = profile.maps();
    let mut symbolizer = Symbolizer::new(locator.clone(), &maps);
    let mut build_ids = BuildIds::default();
    let mut pprof = profile.to_pprof(
        |addr| {
            let mut frames = symbolizer.frames(&maps, addr);
            if filters.active() {
                frames.retain(|f| !filters.hides(&f.function));
            }
            frames
        },
        |path| build_ids.get(path).unwrap_or_default(),
    );
    if let Some(at) = pprof.values.iter().position(|&(name, _)| name == value.name()) {
        let last = pprof.values.len() - 1;
        pprof.values[at..].rotate_left(1);
        for sample in &mut pprof.samples {
            if sample.values.len() == last + 1 {
                sample.values[at..].rotate_left(1);
            }
        }
    }
    pprof
}

/// A contention profile as pprof's `contentions` and `delay` ([`ContentionProfile::to_pprof`]),
/// its addresses named here as [`encode`] names a CPU profile's; `value` is the one readers
/// show by default. Filters hide frames (`--hide`); they do not drop lines.
pub fn encode_contention(
    profile: &ContentionProfile,
    locator: &Locator,
    filters: &Filters,
    value: ContentionValue,
) -> Pprof {
    let maps = profile.maps();
    let mut symbolizer = Symbolizer::new(locator.clone(), &maps);
    let mut build_ids = BuildIds::default();
    let mut pprof = profile.to_pprof(
        |addr| {
            let mut frames = symbolizer.frames(&maps, addr);
            frames.retain(|f| !filters.hides(&f.function));
            frames
        },
        |path| build_ids.get(path).unwrap_or_default(),
    );
    pprof.default_value = value.name();
    pprof
}

/// `convert --to pprof` without filters, of a raw profile read in passes (`outline` is what
/// the first found): a second pass sums identical chains (each distinct chain kept once, as
/// slots in one array), then each is written as it is named, straight into the gzip stream.
/// The same bytes as [`encode`] then [`write`] of the whole profile.
pub fn write_source(source: &Source, outline: &Scan, locator: &Locator, output: &Path) -> Result<()> {
    let contexts = &outline.maps.contexts;
    let labels = &outline.maps.labels;
    // Chains are keyed by two tags first: the context's (0: none) and the label set's.
    let with_tags = !contexts.is_empty() || !labels.is_empty();
    let (mut chains, mut counts) = (ChainSet::default(), Vec::new());
    let mut context_ids: HashMap<&ReadContext, u64> = HashMap::new();
    let mut context_list: Vec<&ReadContext> = Vec::new();
    let (mut key, mut ordinal, mut any_context) = (Vec::new(), 0, false);
    let _ = source.scan(|record| {
        key.clear();
        // As `Profile::parse` merges: within one context (none being one of its own).
        if with_tags {
            key.push(match contexts.of(ordinal) {
                Some(context) => {
                    any_context = true;
                    *context_ids.entry(context).or_insert_with(|| {
                        context_list.push(context);
                        context_list.len() as u64
                    })
                }
                None => 0,
            });
            key.push(labels.set_of(ordinal).map_or(0, u64::from));
            ordinal += 1;
        }
        key.extend(record.pcs());
        let i = chains.insert(&key);
        if i == counts.len() {
            counts.push(record.count);
        } else {
            // No overflow: the first pass found the total fits in a u64.
            counts[i] += record.count;
        }
    })?;
    chains.freeze();
    let maps = &outline.maps;
    let wall = !contexts.cpu_profile && any_context;
    let mut symbolizer = Symbolizer::new(locator.clone(), maps);
    let mut build_ids = BuildIds::default();
    let cannot_write = |e: std::io::Error| Error::write(output, e);
    let file = std::fs::File::create(output).map_err(|e| Error::create(output, e))?;
    // Messages are small: the compressor is handed them in blocks.
    let gz = std::io::BufWriter::with_capacity(
        1 << 16,
        GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default()),
    );
    let mut writer = PprofWriter::new(gz, maps, outline.period_us, wall, |path| {
        build_ids.get(path).unwrap_or_default()
    })
    .map_err(cannot_write)?;
    let mut progress = Progress::new("symbolising addresses", chains.len());
    for (i, &count) in counts.iter().enumerate() {
        progress.update(i);
        let (context, set, pcs) = match chains.chain(i) {
            [tag, set, pcs @ ..] if with_tags => (
                tag.checked_sub(1).map(|t| context_list[t as usize]),
                labels.sets.get(&(*set as u32)),
                pcs,
            ),
            pcs => (None, None, pcs),
        };
        writer
            .sample(pcs, count, context, set, |addr| symbolizer.frames(maps, addr))
            .map_err(cannot_write)?;
    }
    drop(progress);
    writer
        .finish()
        .and_then(|gz| gz.into_inner().map_err(|e| e.into_error()))
        .and_then(|gz| gz.finish()?.flush())
        .map_err(cannot_write)
}

pub fn write(pprof: &Pprof, output: &Path) -> Result<()> {
    let file = std::fs::File::create(output).map_err(|e| Error::create(output, e))?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
    gz.write_all(&pprof.encode())
        .and_then(|()| gz.finish()?.flush())
        .map_err(|e| Error::write(output, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heap_profile_carries_its_four_values_the_one_asked_for_last() {
        let text = "heap profile: 4: 4096 [12: 20480] @ heap_v2/524288\n\
                    3: 3072 [4: 4096] @ 0x1000 0x2000\n\
                    1: 1024 [8: 16384] @ 0x1100 0x2000\n";
        let profile = HeapProfile::parse(text.as_bytes()).unwrap();
        let locator = Locator::default();
        let default = encode_heap(&profile, &locator, &Filters::default(), HeapValue::InuseSpace);
        let names: Vec<&str> = default.values.iter().map(|v| v.0).collect();
        assert_eq!(names, ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]);
        let alloc = encode_heap(&profile, &locator, &Filters::default(), HeapValue::AllocSpace);
        let names: Vec<&str> = alloc.values.iter().map(|v| v.0).collect();
        assert_eq!(names, ["alloc_objects", "inuse_objects", "inuse_space", "alloc_space"]);
        for (a, d) in alloc.samples.iter().zip(&default.samples) {
            assert_eq!(a.values, [d.values[0], d.values[2], d.values[3], d.values[1]]);
        }
        // Filters: the line through 0x1100 ignored, the rest kept whole.
        let ignore = Filters {
            ignore: Some(regex::Regex::new("^0x1100$").unwrap()),
            ..Filters::default()
        };
        let filtered = encode_heap(&profile, &locator, &ignore, HeapValue::InuseSpace);
        assert_eq!(filtered.samples.len(), 1);
        assert_eq!(filtered.samples[0].values, default.samples[0].values);
        let addresses: Vec<u64> = filtered.samples[0]
            .locations
            .iter()
            .map(|&l| filtered.locations[l].address)
            .collect();
        assert_eq!(
            addresses,
            [0x1000, 0x1fff],
            "the allocating call as it is, return addresses minus one"
        );
    }
}
