//! Contention profiles: the text google-pprof reads (`--- contention:`, see
//! [`cpuprof::format::contention`]), told from other profiles by their first bytes and read
//! whole (one text line per call chain).
//!
//! A contention profile becomes the same [`Stacks`] a heap profile does: each line a chain
//! weighing the value asked for (`--sample-index`: `delay`, the default, or `contentions`).
//! Every address is a return address, looked up at its call (minus one), as pprof does.

use crate::error::{Error, Result};
use crate::input::Source;
use crate::model::filters::Filters;
use crate::model::stacks::Stacks;
use crate::model::unit::{SampleValue, Unit};
use crate::symbols::Locator;
use cpuprof::format::contention::{looks_like_contention, ContentionProfile, ContentionValue};
use std::path::Path;

/// The value read when `--sample-index` is not given: pprof's default for contention profiles.
pub const DEFAULT_VALUE: ContentionValue = ContentionValue::Delay;

/// Whether `source` is a contention profile (it starts with `--- contention`).
pub fn is_contention(source: &Source) -> Result<bool> {
    Ok(looks_like_contention(&source.read_at(0, b"--- contention".len())?))
}

/// The contention profile in `source` (named `file` in messages), or `None` when it is not one.
pub fn read(file: &Path, source: &Source) -> Result<Option<ContentionProfile>> {
    if !is_contention(source)? {
        return Ok(None);
    }
    let profile = ContentionProfile::parse(&source.whole()?).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(Some(profile))
}

/// The contention value `index` (`--sample-index`) names for the contention profile `file`:
/// [`DEFAULT_VALUE`] when none is given.
pub fn value(index: Option<SampleValue>, file: &Path) -> Result<ContentionValue> {
    match index {
        None => Ok(DEFAULT_VALUE),
        Some(SampleValue::Contention(value)) => Ok(value),
        Some(other) => Err(Error::Input(format!(
            "{}: a contention profile, whose values are delay and contentions, not {}",
            file.display(),
            other.name()
        ))),
    }
}

/// The lines of `profile` as chains symbolised with the maps it carries, each weighing its
/// `value`, as `filters` leave them.
pub fn stacks(profile: &ContentionProfile, value: ContentionValue, locator: &Locator, filters: &Filters) -> Stacks {
    let maps = profile.maps();
    // Every address is a return address: the first too (the reader keeps a chain's first as
    // it is, as heap profiles need), so it is moved onto its call here.
    let chains: Vec<(Vec<u64>, u64)> = profile
        .records
        .iter()
        .map(|r| {
            let mut stack = r.stack.clone();
            if let Some(first) = stack.first_mut() {
                *first = first.saturating_sub(1);
            }
            (stack, value.of(r))
        })
        .collect();
    Stacks::symbolise_weighted(
        &maps,
        locator,
        Unit::Contention {
            value,
            view: profile.view,
        },
        chains.iter().map(|(s, v)| (s.as_slice(), *v)),
    )
    .filter(filters)
}

/// Each line's waits and what they weigh for `value`: what `diff` takes as the profile's
/// observations (the waits, each one look at a waiting stack).
pub fn lines(profile: &ContentionProfile, value: ContentionValue) -> impl Iterator<Item = (u64, u64)> + '_ {
    profile.records.iter().map(move |r| (r.count, value.of(r)))
}

/// The error of a command (or a comparison) that needs a CPU profile, given the contention
/// profile `file`.
pub fn not_for_contention(file: &Path) -> Error {
    Error::Input(format!(
        "{}: a contention profile, where a CPU profile is needed (contention profiles are read by top, peek, \
         collapse, flamegraph, convert --to pprof, diff and check, and compared with contention profiles only)",
        file.display()
    ))
}

/// What `check` says of a contention profile.
pub fn check(profile: &ContentionProfile) -> String {
    let (delay, count) = profile.totals();
    format!(
        "contention profile over {:.1} s, {} line{}, {} mappings; {} waits, {} waited{}",
        profile.duration_ms as f64 / 1000.0,
        profile.records.len(),
        if profile.records.len() == 1 { "" } else { "s" },
        profile.maps().entries.len(),
        count,
        crate::render::units::nanoseconds(delay),
        if profile.discarded > 0 {
            format!("; {} sampled waits discarded (the table was full)", profile.discarded)
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpuprof::format::contention::View;

    const TEXT: &str = "--- contention:\ncycles/second = 1000000000\nsampling period = 1\nms since reset = 2000\n\
        3000000 30 @ 0x1001 0x2001\n1000000 10 @ 0x1101 0x2001\n--- Memory map: ---\n";

    #[test]
    fn lines_weigh_the_value_asked_for() {
        let source = Source::bytes(TEXT.as_bytes());
        assert!(is_contention(&source).unwrap());
        assert!(!is_contention(&Source::bytes(b"heap profile: 1")).unwrap());
        let profile = read(Path::new("x.contention"), &source).unwrap().unwrap();
        let locator = Locator::default();
        let delay = stacks(&profile, DEFAULT_VALUE, &locator, &Filters::default());
        assert_eq!(delay.total(), 4_000_000);
        assert_eq!(
            delay.unit,
            Unit::Contention {
                value: ContentionValue::Delay,
                view: View::Waiters,
            }
        );
        // Every address is looked up at its call.
        let folded = delay.folded();
        assert!(folded[0].starts_with("0x2000;0x1000 "), "{folded:?}");
        let waits = stacks(&profile, ContentionValue::Contentions, &locator, &Filters::default());
        assert_eq!(waits.total(), 40);
        assert!(check(&profile).contains("40 waits, 4ms waited"), "{}", check(&profile));
    }

    #[test]
    fn a_heap_value_is_refused_for_a_contention_profile() {
        let e = value(
            Some(SampleValue::Heap(cpuprof::format::heap::HeapValue::InuseSpace)),
            Path::new("x"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("delay and contentions, not inuse_space"), "{e}");
    }
}
