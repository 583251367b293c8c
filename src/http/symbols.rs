//! In-process symbolisation for the HTTP endpoint: function names for addresses of this
//! process, from the ELF symbol tables (`.symtab`, else `.dynsym`) of the files in
//! `/proc/self/maps`. Runs on the endpoint's thread, never in signal context.
//!
//! A small reader of ELF64 little-endian files rather than a general object-file crate: it
//! needs three tables, and it keeps the preloaded library small. Names are returned as the
//! symbol tables hold them (C++ and Rust names mangled; pprof demangles them).

use crate::format::Maps;
use std::collections::HashMap;

/// Function symbols of one file: (link-time start, size, name), sorted by start, and its
/// loadable segments (file offset, file size, link-time address).
#[derive(Default)]
struct FileSymbols {
    functions: Vec<(u64, u64, String)>,
    segments: Vec<(u64, u64, u64)>,
}

/// Symbolises addresses of the current process, reading each file once.
pub struct Symbolizer {
    maps: Maps,
    files: HashMap<String, Option<FileSymbols>>,
}

impl Symbolizer {
    /// A symboliser for the process's current mappings.
    pub fn for_current_process() -> Symbolizer {
        Symbolizer::new(Maps::parse(&std::fs::read("/proc/self/maps").unwrap_or_default()))
    }

    pub fn new(maps: Maps) -> Symbolizer {
        Symbolizer {
            maps,
            files: HashMap::new(),
        }
    }

    /// The function containing `addr`, if a symbol table covers it.
    pub fn function(&mut self, addr: u64) -> Option<&str> {
        let map = self.maps.find(addr)?;
        let (path, file_offset) = (map.path.clone(), addr - map.start + map.offset);
        let file = self
            .files
            .entry(path.clone())
            .or_insert_with(|| path.starts_with('/').then(|| read_symbols(&path)).flatten())
            .as_ref()?;
        let &(off, _, vaddr) = file
            .segments
            .iter()
            .find(|&&(off, size, _)| off <= file_offset && file_offset - off < size)?;
        // Wrapping: the file's numbers may be anything; a wrong answer is only a wrong name.
        let svma = (file_offset - off).wrapping_add(vaddr);
        let i = file.functions.partition_point(|f| f.0 <= svma).checked_sub(1)?;
        let (start, size, name) = &file.functions[i];
        (svma - start < (*size).max(1)).then_some(name.as_str())
    }
}

fn read_symbols(path: &str) -> Option<FileSymbols> {
    parse_elf(&std::fs::read(path).ok()?)
}

const PT_LOAD: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

/// The `N` bytes at `base + off`; `None`, never a panic, when that lies outside `b` (the
/// offsets come from the file and may be anything).
fn bytes_at<const N: usize>(b: &[u8], base: u64, off: u64) -> Option<[u8; N]> {
    let at = usize::try_from(base.checked_add(off)?).ok()?;
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}
fn u8_at(b: &[u8], base: u64, off: u64) -> Option<u8> {
    Some(bytes_at::<1>(b, base, off)?[0])
}
fn u16_at(b: &[u8], base: u64, off: u64) -> Option<u64> {
    Some(u16::from_le_bytes(bytes_at(b, base, off)?).into())
}
fn u32_at(b: &[u8], base: u64, off: u64) -> Option<u64> {
    Some(u32::from_le_bytes(bytes_at(b, base, off)?).into())
}
fn u64_at(b: &[u8], base: u64, off: u64) -> Option<u64> {
    Some(u64::from_le_bytes(bytes_at(b, base, off)?))
}

/// Parses an ELF64 little-endian file's segments and function symbols; `None` for anything
/// else or anything malformed.
fn parse_elf(b: &[u8]) -> Option<FileSymbols> {
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (phoff, shoff) = (u64_at(b, 0, 0x20)?, u64_at(b, 0, 0x28)?);
    let (phentsize, phnum) = (u16_at(b, 0, 0x36)?, u16_at(b, 0, 0x38)?);
    let (shentsize, shnum) = (u16_at(b, 0, 0x3a)?, u16_at(b, 0, 0x3c)?);
    let mut out = FileSymbols::default();
    for i in 0..phnum {
        let ph = phoff.checked_add(i * phentsize)?;
        if u32_at(b, ph, 0)? == PT_LOAD as u64 {
            out.segments
                .push((u64_at(b, ph, 8)?, u64_at(b, ph, 32)?, u64_at(b, ph, 16)?));
        }
    }
    let section = |i: u64| shoff.checked_add(i.checked_mul(shentsize)?);
    // Prefer the full table; a stripped file still has the dynamic one.
    for wanted in [SHT_SYMTAB, SHT_DYNSYM] {
        for i in 0..shnum {
            let sh = section(i)?;
            if u32_at(b, sh, 4)? != wanted as u64 {
                continue;
            }
            let (offset, size, link, entsize) = (
                u64_at(b, sh, 24)?,
                u64_at(b, sh, 32)?,
                u32_at(b, sh, 40)?,
                u64_at(b, sh, 56)?.max(24),
            );
            let strings = section(link)?;
            let (str_off, str_size) = (u64_at(b, strings, 24)?, u64_at(b, strings, 32)?);
            for k in 0..size / entsize {
                let sym = offset.checked_add(k * entsize)?;
                let info = u8_at(b, sym, 4)?;
                let (value, sym_size) = (u64_at(b, sym, 8)?, u64_at(b, sym, 16)?);
                if !matches!(info & 0xf, STT_FUNC | STT_GNU_IFUNC) || value == 0 {
                    continue;
                }
                let name_at = u32_at(b, sym, 0)?;
                if name_at >= str_size {
                    continue;
                }
                let start = usize::try_from(str_off.checked_add(name_at)?).ok()?;
                let bytes = b.get(start..)?;
                let name = &bytes[..bytes.iter().position(|&c| c == 0)?];
                out.functions
                    .push((value, sym_size, String::from_utf8_lossy(name).into_owned()));
            }
        }
        if !out.functions.is_empty() {
            break;
        }
    }
    out.functions.sort();
    out.functions.dedup_by_key(|f| f.0);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_of_this_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn names_functions_of_this_process() {
        let mut s = Symbolizer::for_current_process();
        let addr = a_function_of_this_test as *const () as usize as u64;
        let name = s.function(addr + 1).expect("the test binary's symbol table covers it");
        assert!(name.contains("a_function_of_this_test"), "{name}");
        let libc_fn = libc::getpid as *const () as usize as u64;
        assert!(s.function(libc_fn).is_some_and(|n| n.contains("getpid")));
        assert_eq!(s.function(8), None);
    }

    #[test]
    fn malformed_files_are_refused_without_panicking() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        assert!(parse_elf(&exe).is_some());
        for cut in [0, 5, 64, 100, exe.len() / 2] {
            let _ = parse_elf(&exe[..cut]);
        }
        let mut garbage = exe[..4096].to_vec();
        garbage[0x28..0x30].fill(0xff);
        assert!(parse_elf(&garbage).is_none_or(|f| f.functions.is_empty()));
        assert!(parse_elf(b"not an elf file").is_none());
    }
}
