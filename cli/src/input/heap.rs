//! Heap profiles: gperftools' text format (`heap profile: ... @ heap_v2/N`, see
//! [`cpuprof::format::heap`]), told from a CPU profile by its first bytes and read whole (a
//! heap profile is one text line per call chain: small beside the CPU profiles read in passes).
//!
//! A heap profile becomes the same [`Stacks`] a CPU profile does: each line a chain weighing
//! the value asked for (`--sample-index`, pprof's names, `inuse_space` by default), scaled back
//! from its samples line by line before anything is summed, as pprof does, so totals agree with
//! `go tool pprof -sample_index=X -top` of the same file. The first address of a line is where
//! the allocating call is and is looked up as it is; the others are return addresses, looked
//! up at their call (minus one), as in `HeapProfile::to_pprof`.

use crate::error::{Error, Result};
use crate::input::Source;
use crate::model::filters::Filters;
use crate::model::stacks::Stacks;
use crate::model::unit::{SampleValue, Unit};
use crate::symbols::Locator;
use cpuprof::format::heap::{looks_like_heap, HeapCounts, HeapKind, HeapProfile, HeapValue};
use std::path::Path;

/// The value read when `--sample-index` is not given: pprof's default for heap profiles.
pub const DEFAULT_VALUE: HeapValue = HeapValue::InuseSpace;

/// Whether `source` is a heap profile (it starts with `heap profile:`).
pub fn is_heap(source: &Source) -> Result<bool> {
    Ok(looks_like_heap(&source.read_at(0, b"heap profile:".len())?))
}

/// The heap profile in `source` (named `file` in messages), or `None` when it is not one.
pub fn read(file: &Path, source: &Source) -> Result<Option<HeapProfile>> {
    if !is_heap(source)? {
        return Ok(None);
    }
    let profile = HeapProfile::parse(&source.whole()?).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(Some(profile))
}

/// The period the lines are scaled back with: none for a growth profile, which is not sampled.
pub fn period(profile: &HeapProfile) -> u64 {
    match profile.kind {
        HeapKind::Heap => profile.period,
        HeapKind::Growth => 1,
    }
}

/// What the counts of `profile` read for `value` measure.
pub fn unit(profile: &HeapProfile, value: HeapValue) -> Unit {
    Unit::Heap {
        value,
        period: period(profile),
    }
}

/// One line's counts scaled back to the program's (pprof's `scaleHeapSample`).
pub fn scaled(profile: &HeapProfile, counts: HeapCounts) -> HeapCounts {
    counts.unsampled(period(profile))
}

/// The lines of `profile` as chains symbolised with the maps it carries, each weighing its
/// scaled `value`, as `filters` leave them.
pub fn stacks(profile: &HeapProfile, value: HeapValue, locator: &Locator, filters: &Filters) -> Stacks {
    let maps = profile.maps();
    let chains = profile
        .records
        .iter()
        .map(|r| (r.stack.as_slice(), scaled(profile, r.counts).get(value)));
    Stacks::symbolise_weighted(&maps, locator, unit(profile, value), chains).filter(filters)
}

/// Each line's samples behind `value` and what they weigh together (its scaled value): what
/// `diff` takes as the profile's observations.
pub fn lines(profile: &HeapProfile, value: HeapValue) -> impl Iterator<Item = (u64, u64)> + '_ {
    profile
        .records
        .iter()
        .map(move |r| (samples(r.counts, value), scaled(profile, r.counts).get(value)))
}

/// The samples behind `value` in a line: its sampled objects, in use or allocated in all.
pub fn samples(counts: HeapCounts, value: HeapValue) -> u64 {
    match value {
        HeapValue::InuseSpace | HeapValue::InuseObjects => counts.inuse_objects,
        HeapValue::AllocSpace | HeapValue::AllocObjects => counts.alloc_objects,
    }
}

/// The heap value `index` (`--sample-index`) names for the heap profile `file`:
/// [`DEFAULT_VALUE`] when none is given.
pub fn value(index: Option<SampleValue>, file: &Path) -> Result<HeapValue> {
    match index {
        None => Ok(DEFAULT_VALUE),
        Some(SampleValue::Heap(value)) => Ok(value),
        Some(other) => Err(Error::Input(format!(
            "{}: a heap profile, whose values are inuse_space, inuse_objects, alloc_space and alloc_objects, \
             not {}",
            file.display(),
            other.name()
        ))),
    }
}

/// The error of a command (or a comparison) that needs a CPU profile, given the heap profile
/// `file`.
pub fn not_for_heap(file: &Path) -> Error {
    Error::Input(format!(
        "{}: a heap profile, where a CPU profile is needed (heap profiles are read by top, peek, collapse, \
         flamegraph, report, convert --to pprof, diff and check, and compared with heap profiles only)",
        file.display()
    ))
}

/// `--sample-index` given for a profile that is neither a heap nor a contention profile.
pub fn cpu_takes_no_index(index: Option<SampleValue>) -> Result<()> {
    match index {
        Some(_) => Err(Error::Usage(
            "--sample-index chooses a heap or contention profile's value; a CPU profile has one (its samples)",
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "heap profile:    4:  4096 [   12: 20480] @ heap_v2/524288\n\
      3:  3072 [    4:  4096] @ 0x1000 0x2000\n\
      1:  1024 [    8: 16384] @ 0x1100 0x2000\n\
      0:     0 [    0:     0] @ 0x1200\n\
\n\
MAPPED_LIBRARIES:\n";

    #[test]
    fn lines_weigh_their_scaled_value_and_empty_ones_are_left_out() {
        let source = Source::bytes(TEXT.as_bytes());
        assert!(is_heap(&source).unwrap());
        assert!(!is_heap(&Source::bytes(b"\0\0\0\0\x03\0\0\0")).unwrap());
        let profile = read(Path::new("x.heap"), &source).unwrap().unwrap();
        let locator = Locator::default();
        let inuse = stacks(&profile, HeapValue::InuseSpace, &locator, &Filters::default());
        let scale = 1.0 / (1.0 - (-1024.0f64 / 524288.0).exp());
        assert_eq!(inuse.unit.heap_value(), Some(HeapValue::InuseSpace));
        assert_eq!(
            inuse.total(),
            (3072.0 * scale) as u64 + (1024.0 * scale) as u64,
            "scaled line by line, then summed"
        );
        // Unnamed code is named in hex: the first address as it is, return addresses minus one.
        let folded = inuse.folded();
        assert_eq!(folded.len(), 2, "{folded:?}");
        assert!(folded[0].starts_with("0x1fff;0x1000 "), "{folded:?}");
        let alloc = stacks(&profile, HeapValue::AllocObjects, &locator, &Filters::default());
        let per = alloc.per_function();
        assert!(per["0x1100"].flat > per["0x1000"].flat);
        assert_eq!(samples(profile.records[1].counts, HeapValue::AllocSpace), 8);
    }

    #[test]
    fn a_bad_line_is_named() {
        let bad = "heap profile: 1: 2 [3: 4] @ heap_v2/10\n1: 2 [3 4] @ 0x10\n";
        let e = read(Path::new("x.heap"), &Source::bytes(bad.as_bytes())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.heap: heap profile, line 2: not `objects: bytes [objects: bytes] @ addresses`"
        );
    }
}
