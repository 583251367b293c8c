//! Function boundaries from an object's unwind tables, for code no symbol covers.
//!
//! Every function the compiler emits call-frame information for has a `.eh_frame` FDE giving
//! its start and length, and `strip --strip-all` keeps `.eh_frame` (exceptions and unwinding
//! need it at run time). So even in a fully stripped binary, or for the static functions of a
//! library that only exports `.dynsym`, each function can be its own row, named by its
//! link-time start (`object+0xSTART`), which is stable across runs and load addresses and
//! can be looked up later (`addr2line -e object 0xSTART`).

use addr2line::gimli::{self, BaseAddresses, CieOrFde, EhFrame, UnwindSection};
use object::{Object, ObjectSection};
use std::cell::OnceCell;
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

/// How many extents starting at or before an address a look-up examines.
const MAX_OVERLAPS: usize = 64;

/// Function extents `[start, end)` at link-time addresses, sorted by start.
#[derive(Debug, Default)]
pub struct FunctionRanges {
    ranges: Vec<(u64, u64)>,
    /// `reach[i]`: the largest end among `ranges[..=i]`, so a lookup walking back over
    /// overlapping extents knows where to stop.
    reach: Vec<u64>,
}

impl FunctionRanges {
    /// The FDE extents of the ELF object `data`; none if it has no readable `.eh_frame`. A
    /// malformed entry ends the walk (entries are found by following lengths), keeping the
    /// extents read before it.
    pub fn read(data: &[u8]) -> FunctionRanges {
        let Ok(file) = object::File::parse(data) else {
            return FunctionRanges::default();
        };
        let Some(section) = file.section_by_name(".eh_frame") else {
            return FunctionRanges::default();
        };
        // A separate debug file keeps the section header with no contents (SHT_NOBITS).
        let Ok(bytes) = section.data() else {
            return FunctionRanges::default();
        };
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let mut eh_frame = EhFrame::new(bytes, endian);
        eh_frame.set_address_size(if file.is_64() { 8 } else { 4 });
        // Pointer encodings in FDEs may be relative to these sections (GCC uses pc-relative).
        let address_of = |name| file.section_by_name(name).map(|s| s.address());
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = address_of(".text") {
            bases = bases.set_text(text);
        }
        if let Some(got) = address_of(".got") {
            bases = bases.set_got(got);
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
        FunctionRanges::new(ranges)
    }

    fn new(mut ranges: Vec<(u64, u64)>) -> FunctionRanges {
        ranges.sort_unstable();
        ranges.dedup();
        let reach = ranges
            .iter()
            .scan(0, |max, &(_, end)| {
                *max = end.max(*max);
                Some(*max)
            })
            .collect();
        FunctionRanges { ranges, reach }
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

/// An object's [`FunctionRanges`], read from its file on first use: most objects of a profile
/// are fully covered by symbols and never need them.
#[derive(Debug)]
pub struct LazyFunctionRanges {
    /// The object file (not a separate debug file, whose `.eh_frame` is empty).
    path: PathBuf,
    ranges: OnceCell<FunctionRanges>,
}

impl LazyFunctionRanges {
    pub fn new(path: PathBuf) -> LazyFunctionRanges {
        LazyFunctionRanges {
            path,
            ranges: OnceCell::new(),
        }
    }

    pub fn get(&self) -> &FunctionRanges {
        self.ranges.get_or_init(|| {
            let Ok((file, size, _)) = crate::symbols::open_regular(&self.path) else {
                return FunctionRanges::default();
            };
            let mut data = Vec::new();
            match file.take(size).read_to_end(&mut data) {
                Ok(_) => FunctionRanges::read(&data),
                Err(_) => FunctionRanges::default(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn innermost_extent_wins_and_gaps_find_nothing() {
        let r = FunctionRanges::new(vec![(0x300, 0x310), (0x100, 0x200), (0x140, 0x150), (0x100, 0x200)]);
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
        let r = FunctionRanges::new(crafted);
        assert_eq!(r.containing(16 * 5000 + 8), None);
        assert_eq!(r.containing(16 * 5000 + 4), Some((16 * 5000, 16 * 5000 + 8)));
        assert_eq!(r.containing(8), Some((0, u64::MAX)));
    }

    #[test]
    fn reads_the_fdes_of_this_test_binary() {
        let path = std::env::current_exe().unwrap();
        let data = std::fs::read(&path).unwrap();
        let ranges = FunctionRanges::read(&data);
        let file = object::File::parse(&*data).unwrap();
        // Sized function symbols of this binary in .text start FDEs: Rust and C emit unwind
        // tables for every function (a hand-written assembly routine in a linked-in runtime
        // may lack one, hence not all).
        use object::ObjectSymbol;
        let text = file.section_by_name(".text").unwrap();
        let (lo, hi) = (text.address(), text.address() + text.size());
        let (mut checked, mut missed) = (0, Vec::new());
        for sym in file.symbols() {
            if sym.kind() == object::SymbolKind::Text && sym.size() > 0 && (lo..hi).contains(&sym.address()) {
                checked += 1;
                if ranges.containing(sym.address()).map(|e| e.0) != Some(sym.address()) {
                    missed.push(sym.name().unwrap_or("?").to_string());
                }
            }
        }
        assert!(checked > 100, "{checked}");
        assert!(
            missed.len() * 100 <= checked,
            "{} of {checked}: {missed:?}",
            missed.len()
        );
    }

    #[test]
    fn garbage_and_truncated_objects_give_no_extents() {
        assert!(FunctionRanges::read(b"not an object").ranges.is_empty());
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for len in [0, 64, data.len() / 3] {
            let _ = FunctionRanges::read(&data[..len]);
        }
    }

    #[test]
    fn corrupted_unwind_tables_end_the_walk_without_harm() {
        let mut data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let (start, len) = {
            let file = object::File::parse(&*data).unwrap();
            let (offset, size) = file.section_by_name(".eh_frame").unwrap().file_range().unwrap();
            (offset as usize, size as usize)
        };
        let intact = FunctionRanges::read(&data).ranges.len();
        // Deterministic pseudo-random bytes over lengths, CIE pointers and encodings.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..200 {
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data[start + (x as usize % len)] = (x >> 32) as u8;
            }
            let read = FunctionRanges::read(&data);
            assert!(read.ranges.iter().all(|&(s, e)| s < e), "round {round}");
            let _ = read.containing(x);
        }
        assert!(intact > 100, "{intact}");
    }
}
