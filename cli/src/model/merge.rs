//! `merge`: one profile summing many profiles of the same program (a fleet, or repeated runs).
//!
//! Each process mapped its objects at its own addresses, so addresses are translated through
//! the maps: an address becomes (object, file offset), then the address of that offset in the
//! first profile's mapping of the object. Objects the first profile did not map get a mapping
//! of their own above everything else; addresses in no mapping are kept as they are.

use crate::error::{Error, Result};
use cpuprof::format::sample_labels::{labels_line, labelset_line, Labels};
use cpuprof::format::{build_id, MapEntry, Profile, ProfileWriter, SignalWeights, SlotFormat};
use std::collections::HashMap;
use std::fmt::Write as _;

const PAGE: u64 = 4096;

/// The merged profile and its total sample count. Counts that would pass 2^64 - 1 are an
/// error naming the profile that took them there, never a wrapped number.
pub fn merge(profiles: &[(String, Profile)]) -> Result<(Vec<u8>, u64)> {
    let Some((first_name, first)) = profiles.first() else {
        return Err(Error::Input("nothing to merge".to_string()));
    };
    let mut maps: Vec<MapEntry> = first.maps.entries.clone();
    // None when the first profile's maps reach the top of the address space.
    let mut next_free = maps
        .iter()
        .map(|e| e.end)
        .max()
        .unwrap_or(0)
        .checked_next_multiple_of(PAGE);
    // Samples of one stack with different labels stay apart.
    let mut stacks: HashMap<(Vec<u64>, Option<Labels>), u64> = HashMap::new();
    let mut total = 0u64;
    for (name, profile) in profiles {
        if profile.period_us != first.period_us {
            return Err(format!(
                "{name} samples every {} us but {first_name} every {} us; merged counts would mean nothing",
                profile.period_us, first.period_us
            )
            .into());
        }
        let mut translated: HashMap<u64, u64> = HashMap::new();
        for s in &profile.samples {
            let pcs: Vec<u64> = s
                .pcs
                .iter()
                .map(|&pc| {
                    *translated
                        .entry(pc)
                        .or_insert_with(|| translate(pc, profile, &mut maps, &mut next_free))
                })
                .collect();
            let overflow = || format!("{name}: merged sample counts would pass 2^64 - 1");
            total = total.checked_add(s.count).ok_or_else(overflow)?;
            let count = stacks.entry((pcs, s.labels.clone())).or_default();
            *count = count.checked_add(s.count).ok_or_else(overflow)?;
        }
    }
    let mut out = ProfileWriter::new(Vec::new(), SlotFormat::NATIVE, first.period_us).map_err(|e| e.to_string())?;
    let mut sorted: Vec<_> = stacks.into_iter().collect();
    sorted.sort();
    // Label sets numbered in the merged profile, and which record carries which.
    let mut sets: HashMap<Labels, u32> = HashMap::new();
    let mut labelled: Vec<(u64, u32)> = Vec::new();
    for (ordinal, ((pcs, labels), count)) in sorted.into_iter().enumerate() {
        out.write_record(count, &pcs).map_err(|e| e.to_string())?;
        if let Some(labels) = labels {
            let next = sets.len() as u32 + 1;
            labelled.push((ordinal as u64, *sets.entry(labels).or_insert(next)));
        }
    }
    let mut text = String::new();
    for e in &maps {
        let _ = writeln!(
            text,
            "{:x}-{:x} {} {:08x} 00:00 {} {}",
            e.start, e.end, e.perms, e.offset, e.inode, e.path
        );
    }
    // Recorded build-ids travel with their mappings, so the merged profile still names the
    // code that ran.
    for e in &maps {
        if let Some(id) = &e.build_id {
            text.push_str(&build_id::line(e.start, e.end, id));
        }
    }
    // The signals behind the merged samples are those of every profile, if each recorded them.
    let weights = profiles.iter().try_fold(SignalWeights::default(), |sum, (_, p)| {
        Some(sum.combined(p.maps.signal_weights?))
    });
    if let Some(weights) = weights {
        text.push_str(&weights.line());
    }
    // The process that wrote the profiles, if they all say the same one (a profile merged with
    // itself, or snapshots of one process); profiles of different processes name none.
    if let Some(process) = &first.maps.process {
        if profiles.iter().all(|(_, p)| p.maps.process.as_ref() == Some(process)) {
            text.push_str(&process.line());
        }
    }
    let mut numbered: Vec<(&Labels, &u32)> = sets.iter().collect();
    numbered.sort_by_key(|(_, &id)| id);
    for (labels, &id) in numbered {
        text.push_str(&labelset_line(id, labels));
    }
    for (ordinal, id) in labelled {
        text.push_str(&labels_line(ordinal, id));
    }
    Ok((out.finish(text.as_bytes()).map_err(|e| e.to_string())?, total))
}

/// `pc` of `profile` as an address in the merged profile's maps, adding a mapping if needed;
/// kept as it is when the address space has no room left for the mapping (crafted maps).
fn translate(pc: u64, profile: &Profile, maps: &mut Vec<MapEntry>, next_free: &mut Option<u64>) -> u64 {
    let Some(entry) = profile.maps.find(pc) else { return pc };
    if entry.path.is_empty() {
        return pc;
    }
    // Offsets are file offsets as the map gave them: they may be anything, hence wrapping.
    let offset = (pc - entry.start).wrapping_add(entry.offset);
    let same_object = |e: &MapEntry| {
        e.path == entry.path && e.perms == entry.perms && offset.wrapping_sub(e.offset) < e.end - e.start
    };
    if let Some(e) = maps.iter().find(|e| same_object(e)) {
        return e.start + offset.wrapping_sub(e.offset);
    }
    let Some(start) = *next_free else { return pc };
    let Some(end) = start.checked_add(entry.end - entry.start) else {
        return pc;
    };
    let added = MapEntry {
        start,
        end,
        ..entry.clone()
    };
    *next_free = end.checked_next_multiple_of(PAGE);
    let addr = added.start + (pc - entry.start);
    maps.push(added);
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(base: u64, libs: &[(&str, u64)], samples: &[(&[u64], u64)]) -> Profile {
        let mut maps = format!("{base:x}-{:x} r-xp 00001000 08:01 7 /bin/app\n", base + 0x1000);
        for (path, start) in libs {
            let _ = writeln!(maps, "{start:x}-{:x} r-xp 00000000 08:01 9 {path}", start + 0x2000);
        }
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10_000).unwrap();
        for (pcs, count) in samples {
            w.write_record(*count, pcs).unwrap();
        }
        Profile::parse(&w.finish(maps.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn addresses_follow_their_objects_across_processes() {
        let a = profile(0x10000, &[("/lib/libc.so", 0x70000)], &[(&[0x10010, 0x70020], 2)]);
        // The same code, loaded elsewhere, plus a library only the second process loaded.
        let b = profile(
            0x50000,
            &[("/lib/libc.so", 0x90000), ("/lib/extra.so", 0xa0000)],
            &[(&[0x50010, 0x90020], 3), (&[0xa0100], 1)],
        );
        let merged = Profile::parse(&merge(&[("a".into(), a), ("b".into(), b)]).unwrap().0).unwrap();
        let mut samples: Vec<_> = merged.samples.iter().map(|s| (s.pcs.clone(), s.count)).collect();
        samples.sort();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0], (vec![0x10010, 0x70020], 5));
        let extra = merged.maps.find(samples[1].0[0]).unwrap();
        assert_eq!(extra.path, "/lib/extra.so");
        assert_eq!(samples[1].0[0] - extra.start, 0x100);
    }

    #[test]
    fn the_process_line_is_kept_only_when_every_profile_has_the_same() {
        use cpuprof::format::ProcessLine;
        let with = |pid: u32| {
            let mut p = profile(0x10000, &[], &[(&[0x10010], 1)]);
            p.maps.process = Some(ProcessLine {
                pid,
                ppid: 1,
                forked: false,
                args: vec![b"app".to_vec(), b"a=b ]".to_vec()],
            });
            p
        };
        let merged = |profiles: Vec<Profile>| {
            let named: Vec<(String, Profile)> = profiles.into_iter().map(|p| ("p".to_string(), p)).collect();
            Profile::parse(&merge(&named).unwrap().0).unwrap().maps.process
        };
        assert_eq!(merged(vec![with(5), with(5)]), with(5).maps.process);
        assert_eq!(merged(vec![with(5), with(6)]), None);
        assert_eq!(merged(vec![with(5), profile(0x10000, &[], &[])]), None);
        assert_eq!(merged(vec![profile(0x10000, &[], &[]), with(5)]), None);
    }

    #[test]
    fn different_periods_are_refused() {
        let a = profile(0x10000, &[], &[(&[0x10010], 1)]);
        let mut b = a.clone();
        b.period_us = 1000;
        let e = merge(&[("a".into(), a), ("b".into(), b)]).unwrap_err();
        assert!(e.to_string().contains("1000 us"), "{e}");
    }
}
