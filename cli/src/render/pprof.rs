//! `convert --to pprof`: the profile as gzipped pprof protobuf, symbolised here (functions,
//! files, lines, inlined frames) so readers need no access to the binaries.

use crate::model::filters::Filters;
use crate::render::progress::Progress;
use crate::symbols::{BuildIds, Locator, Symbolizer};
use cpuprof::format::pprof::Pprof;
use cpuprof::format::Profile;
use flate2::write::GzEncoder;
use std::collections::HashSet;
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

pub fn write(pprof: &Pprof, output: &Path) -> Result<(), String> {
    let file = std::fs::File::create(output).map_err(|e| format!("cannot create {}: {e}", output.display()))?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
    gz.write_all(&pprof.encode())
        .and_then(|()| gz.finish()?.flush())
        .map_err(|e| format!("cannot write {}: {e}", output.display()))
}
