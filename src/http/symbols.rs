//! In-process symbolisation for the HTTP endpoint: function names for addresses of this
//! process, from the ELF symbol tables (`.symtab`, else `.dynsym`) of the files in
//! `/proc/self/maps`. Runs on the endpoint's thread, never in signal context.
//!
//! A small reader of ELF64 little-endian files rather than a general object-file crate: it
//! needs three tables, and it keeps the preloaded library small. Names are returned as the
//! symbol tables hold them (C++ and Rust names mangled; pprof demangles them).

use crate::format::Maps;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

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
        let (path, file_offset) = (map.path.clone(), (addr - map.start).wrapping_add(map.offset));
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

/// Opens `path` only if it is a regular file: a mapping may name a device (`/dev/zero`, whose
/// "contents" never end), and the file at a mapping's path may since have been replaced by a
/// FIFO (opening one for reading blocks until a writer comes). `O_NONBLOCK` makes the open
/// itself return at once whatever the path is; the check is made on the opened descriptor,
/// so nothing swapped in between the check and the reads can be read.
pub(crate) fn open_regular(path: &str) -> Option<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    meta.file_type().is_file().then_some((file, meta.len()))
}

fn read_symbols(path: &str) -> Option<FileSymbols> {
    let (file, size) = open_regular(path)?;
    parse_elf(&FileBytes { file, size })
}

/// Largest table (program or section headers, symbols, symbol names) read from one file: the
/// symbol table of a large C++ library is tens of MiB; anything beyond this is not a real one.
const MAX_TABLE: u64 = 256 << 20;
/// Longest symbol name kept; longer ones (mangled templates aside, only crafted files have
/// them) are skipped rather than copied once per symbol.
const MAX_NAME: usize = 4096;

/// Where `parse_elf` reads from: only the ranges the ELF headers name are read, never the
/// whole file.
trait ReadAt {
    /// `len` bytes at `offset`, or `None` if they lie outside the file or over [`MAX_TABLE`].
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>>;
}

struct FileBytes {
    file: File,
    size: u64,
}

impl ReadAt for FileBytes {
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        if len > MAX_TABLE || offset.checked_add(len)? > self.size {
            return None;
        }
        let mut buf = vec![0; usize::try_from(len).ok()?];
        self.file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        if len > MAX_TABLE {
            return None;
        }
        let start = usize::try_from(offset).ok()?;
        Some(
            self.get(start..start.checked_add(usize::try_from(len).ok()?)?)?
                .to_vec(),
        )
    }
}

const PT_LOAD: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
/// Sizes of the ELF64 file header, program header and section header entries.
const EHDR_SIZE: u64 = 64;
const PHDR_SIZE: u64 = 56;
const SHDR_SIZE: u64 = 64;
/// Size of an ELF64 symbol.
const SYM_SIZE: u64 = 24;

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
/// else or anything malformed. Reads the file header, the two header tables and the symbol
/// tables with their names, each at most [`MAX_TABLE`] bytes.
fn parse_elf(file: &(impl ReadAt + ?Sized)) -> Option<FileSymbols> {
    let header = file.read_at(0, EHDR_SIZE)?;
    if header.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let b = &header[..];
    let (phoff, shoff) = (u64_at(b, 0, 0x20)?, u64_at(b, 0, 0x28)?);
    let (phentsize, phnum) = (u16_at(b, 0, 0x36)?, u16_at(b, 0, 0x38)?);
    let (shentsize, shnum) = (u16_at(b, 0, 0x3a)?, u16_at(b, 0, 0x3c)?);
    let mut out = FileSymbols::default();
    if phnum > 0 && phentsize >= PHDR_SIZE {
        let phdrs = file.read_at(phoff, phnum * phentsize)?;
        for i in 0..phnum {
            let ph = i * phentsize;
            if u32_at(&phdrs, ph, 0)? == PT_LOAD as u64 {
                out.segments
                    .push((u64_at(&phdrs, ph, 8)?, u64_at(&phdrs, ph, 32)?, u64_at(&phdrs, ph, 16)?));
            }
        }
    }
    if shentsize < SHDR_SIZE {
        return Some(out);
    }
    let shdrs = file.read_at(shoff, shnum * shentsize)?;
    let section = |i: u64| i.checked_mul(shentsize);
    // Prefer the full table; a stripped file still has the dynamic one.
    for wanted in [SHT_SYMTAB, SHT_DYNSYM] {
        for i in 0..shnum {
            let sh = section(i)?;
            if u32_at(&shdrs, sh, 4)? != wanted as u64 {
                continue;
            }
            let (offset, size, link, entsize) = (
                u64_at(&shdrs, sh, 24)?,
                u64_at(&shdrs, sh, 32)?,
                u32_at(&shdrs, sh, 40)?,
                u64_at(&shdrs, sh, 56)?.max(SYM_SIZE),
            );
            let strings = section(link)?;
            let (str_off, str_size) = (u64_at(&shdrs, strings, 24)?, u64_at(&shdrs, strings, 32)?);
            let (symbols, names) = (file.read_at(offset, size)?, file.read_at(str_off, str_size)?);
            for k in 0..size / entsize {
                let sym = k * entsize;
                let info = u8_at(&symbols, sym, 4)?;
                let (value, sym_size) = (u64_at(&symbols, sym, 8)?, u64_at(&symbols, sym, 16)?);
                if !matches!(info & 0xf, STT_FUNC | STT_GNU_IFUNC) || value == 0 {
                    continue;
                }
                let Some(name) = usize::try_from(u32_at(&symbols, sym, 0)?)
                    .ok()
                    .and_then(|at| names.get(at..))
                    .map(|rest| &rest[..rest.len().min(MAX_NAME + 1)])
                    .and_then(|rest| Some(&rest[..rest.iter().position(|&c| c == 0)?]))
                else {
                    continue;
                };
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
        assert!(parse_elf(&exe[..]).is_some_and(|f| !f.functions.is_empty()));
        for cut in [0, 5, 64, 100, exe.len() / 2] {
            let _ = parse_elf(&exe[..cut]);
        }
        let mut garbage = exe[..4096].to_vec();
        garbage[0x28..0x30].fill(0xff);
        assert!(parse_elf(&garbage[..]).is_none_or(|f| f.functions.is_empty()));
        assert!(parse_elf(&b"not an elf file"[..]).is_none());
    }

    #[test]
    fn only_regular_files_are_read() {
        assert!(open_regular("/proc/self/exe").is_some());
        assert!(open_regular("/dev/zero").is_none());
        let fifo = std::env::temp_dir().join(format!("cpuprof-symbols-fifo-{}", std::process::id()));
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        assert!(open_regular(fifo.to_str().unwrap()).is_none());
        let maps = format!(
            "1000-2000 r-xp 00000000 00:06 4 /dev/zero\n3000-4000 r-xp 00000000 00:06 5 {}\n",
            fifo.display()
        );
        let mut s = Symbolizer::new(Maps::parse(maps.as_bytes()));
        assert_eq!(s.function(0x1800), None);
        assert_eq!(s.function(0x3800), None);
        std::fs::remove_file(&fifo).unwrap();
    }
}
