//! Function extents from an object's unwind tables, for code no symbol covers.
//!
//! Every function the compiler emits call-frame information for has a `.eh_frame` FDE giving
//! its start and length, and `strip --strip-all` keeps `.eh_frame` (exceptions and unwinding
//! need it at run time). So even in a fully stripped binary, or for the static functions of a
//! library that only exports `.dynsym`, each function can be its own row, named by its
//! link-time start (`object+0xSTART`, [`super::unnamed`]).

use super::file::{Elf, ReadAt};
use gimli::{BaseAddresses, CieOrFde, EhFrame, RunTimeEndian, UnwindSection};
use std::collections::HashMap;

/// How many extents starting at or before an address a look-up examines.
const MAX_OVERLAPS: usize = 64;

/// Function extents `[start, end)` at link-time addresses, sorted by start.
#[derive(Clone, Debug, Default)]
pub struct FunctionExtents {
    ranges: Vec<(u64, u64)>,
    /// `reach[i]`: the largest end among `ranges[..=i]`, so a lookup walking back over
    /// overlapping extents knows where to stop.
    reach: Vec<u64>,
}

impl FunctionExtents {
    /// The FDE extents of `elf`'s `.eh_frame` section (found by name); none if it has no
    /// readable one (a separate debug file keeps the header with no contents). Entries are
    /// found by following lengths: a malformed entry ends the walk, keeping the extents read
    /// before it.
    pub fn read<R: ReadAt + ?Sized>(elf: &Elf<'_, R>) -> FunctionExtents {
        let Some(sections) = elf.sections() else {
            return FunctionExtents::default();
        };
        let Some(section) = sections.by_name(b".eh_frame") else {
            return FunctionExtents::default();
        };
        let Some(bytes) = elf.contents(section) else {
            return FunctionExtents::default();
        };
        let endian = if elf.big {
            RunTimeEndian::Big
        } else {
            RunTimeEndian::Little
        };
        let mut eh_frame = EhFrame::new(&bytes, endian);
        eh_frame.set_address_size(elf.word() as u8);
        // Pointer encodings in FDEs may be relative to these sections (GCC uses pc-relative).
        let mut bases = BaseAddresses::default().set_eh_frame(section.addr);
        if let Some(text) = sections.by_name(b".text") {
            bases = bases.set_text(text.addr);
        }
        if let Some(got) = sections.by_name(b".got") {
            bases = bases.set_got(got.addr);
        }
        let mut cies = HashMap::new();
        let mut ranges = Vec::new();
        let mut entries = eh_frame.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else { continue };
            let fde = partial.parse(|section, bases, offset| {
                cies.entry(offset)
                    .or_insert_with(|| section.cie_from_offset(bases, offset))
                    .clone()
            });
            if let Ok(fde) = fde {
                let start = fde.initial_address();
                // An extent past the end of the address space is malformed: dropped.
                if let Some(end) = start.checked_add(fde.len()).filter(|&end| end > start) {
                    ranges.push((start, end));
                }
            }
        }
        FunctionExtents::new(ranges)
    }

    /// Extents given as (start, end) pairs, in any order.
    pub fn new(mut ranges: Vec<(u64, u64)>) -> FunctionExtents {
        ranges.sort_unstable();
        ranges.dedup();
        let reach = ranges
            .iter()
            .scan(0, |max, &(_, end)| {
                *max = end.max(*max);
                Some(*max)
            })
            .collect();
        FunctionExtents { ranges, reach }
    }

    /// The extents, sorted.
    pub fn as_slice(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// The extent holding `svma`; of nested extents (rare: hand-written CFI), the innermost.
    /// The walk back over extents that start earlier is bounded, so that a crafted table (one
    /// extent over all the others) cannot make every look-up scan the whole table.
    pub fn containing(&self, svma: u64) -> Option<(u64, u64)> {
        let mut i = self.ranges.partition_point(|&(start, _)| start <= svma);
        let stop = i.saturating_sub(MAX_OVERLAPS);
        while i > stop && self.reach[i - 1] > svma {
            i -= 1;
            let (start, end) = self.ranges[i];
            if svma < end {
                return Some((start, end));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn innermost_extent_wins_and_gaps_find_nothing() {
        let r = FunctionExtents::new(vec![(0x300, 0x310), (0x100, 0x200), (0x140, 0x150), (0x100, 0x200)]);
        assert_eq!(r.containing(0xff), None);
        assert_eq!(r.containing(0x100), Some((0x100, 0x200)));
        assert_eq!(r.containing(0x145), Some((0x140, 0x150)));
        // Past the nested extent, back in the outer one.
        assert_eq!(r.containing(0x150), Some((0x100, 0x200)));
        assert_eq!(r.containing(0x200), None);
        assert_eq!(r.containing(0x30f), Some((0x300, 0x310)));
        assert_eq!(r.containing(u64::MAX), None);
        // One extent over thousands of others: a gap between them is looked up in bounded
        // steps (and found in none).
        let mut crafted: Vec<(u64, u64)> = (1..10_000).map(|i| (i * 16, i * 16 + 8)).collect();
        crafted.push((0, u64::MAX));
        let r = FunctionExtents::new(crafted);
        assert_eq!(r.containing(16 * 5000 + 8), None);
        assert_eq!(r.containing(16 * 5000 + 4), Some((16 * 5000, 16 * 5000 + 8)));
        assert_eq!(r.containing(8), Some((0, u64::MAX)));
    }

    #[test]
    fn sized_symbols_of_this_test_binary_start_fdes() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let elf = Elf::parse(&exe[..]).unwrap();
        let extents = FunctionExtents::read(&elf);
        let sections = elf.sections().unwrap();
        let text = sections.by_name(b".text").unwrap();
        let (lo, hi) = (text.addr, text.addr + text.size);
        let symbols = super::super::symbols::function_symbols(&elf, &sections);
        let sized: Vec<_> = symbols.iter().filter(|f| f.1 > 0 && (lo..hi).contains(&f.0)).collect();
        let missed = sized
            .iter()
            .filter(|f| extents.containing(f.0).map(|e| e.0) != Some(f.0))
            .count();
        // Rust and C emit unwind tables for every function (a hand-written assembly routine in
        // a linked-in runtime may lack one, hence not all).
        assert!(
            sized.len() > 100 && missed * 100 <= sized.len(),
            "{missed} of {}",
            sized.len()
        );
    }

    #[test]
    fn corrupted_or_truncated_unwind_tables_end_the_walk_without_harm() {
        let mut data = std::fs::read("/proc/self/exe").unwrap();
        for len in [0, 64, data.len() / 3] {
            if let Some(elf) = Elf::parse(&data[..len]) {
                let _ = FunctionExtents::read(&elf);
            }
        }
        let (start, len) = {
            let elf = Elf::parse(&data[..]).unwrap();
            let s = *elf.sections().unwrap().by_name(b".eh_frame").unwrap();
            (s.offset as usize, s.size as usize)
        };
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..100 {
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data[start + (x as usize % len)] = (x >> 32) as u8;
            }
            let read = FunctionExtents::read(&Elf::parse(&data[..]).unwrap());
            assert!(read.ranges.iter().all(|&(s, e)| s < e), "round {round}");
            let _ = read.containing(x);
        }
    }
}
