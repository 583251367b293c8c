//! In-process symbolisation, for the HTTP endpoint and [`Report`](crate::Report)s: function
//! names for addresses of this process (or of files that have not changed since a profile
//! listed them), from the ELF symbol tables (`.symtab`, else `.dynsym`) of the files in
//! `/proc/self/maps`. Runs on the endpoint's thread, never in signal context.
//!
//! Code no symbol covers (static functions of a stripped binary, a library's internal
//! functions with only `.dynsym` left) is named by function all the same: the unwind tables
//! survive `strip --strip-all`, and `.eh_frame_hdr`'s binary-search table gives the start of
//! every function with an FDE. Such a function is named `object+0xSTART`, START its link-time
//! address (the CLI's convention: stable across runs, and `addr2line -e object 0xSTART`
//! looks it up in the unstripped build). The table is read the first time an address of the
//! object misses its symbols, so objects whose symbols cover everything never pay for it.
//!
//! A small reader of ELF64 little-endian files rather than a general object-file crate: it
//! needs three tables, and it keeps the preloaded library small. Names are returned as the
//! symbol tables hold them (C++ and Rust names mangled; pprof demangles them).

mod lines;

use crate::format::Maps;
use gimli::{BaseAddresses, EhFrame, EhFrameOffset, LittleEndian, UnwindSection};
use lines::Section;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

/// Function symbols of one file: (link-time start, size, name), sorted by start, and its
/// loadable segments (file offset, file size, link-time address).
#[derive(Default)]
struct FileSymbols {
    functions: Vec<(u64, u64, String)>,
    segments: Vec<(u64, u64, u64)>,
    /// Where `.eh_frame_hdr` is (`PT_GNU_EH_FRAME`), if the file has one.
    eh_frame_hdr: Option<Segment>,
    /// The DWARF line tables and their strings, if the file has them uncompressed.
    debug_line: Option<Section>,
    debug_line_str: Option<Section>,
}

/// A program header's file offset, link-time address and size in the file.
#[derive(Clone, Copy, Debug)]
struct Segment {
    offset: u64,
    vaddr: u64,
    size: u64,
}

/// One object as the symboliser knows it: its symbols, and the function ranges of its unwind
/// tables, read at the first address the symbols do not cover.
struct Object {
    path: String,
    name: String,
    /// Device and inode of the file the symbols came from: the unwind tables are read from
    /// the same file or not at all. (The file is opened again rather than kept open: a
    /// request touching hundreds of objects must not hold hundreds of the program's
    /// descriptors.)
    identity: (u64, u64),
    symbols: FileSymbols,
    /// (link-time start, end) of each function with an FDE, sorted by start.
    unwind_functions: Option<Vec<(u64, u64)>>,
}

/// Symbolises addresses of the current process, reading each file once.
pub(crate) struct Symbolizer {
    maps: Maps,
    files: HashMap<String, Option<Object>>,
}

impl Symbolizer {
    /// A symboliser for the process's current mappings.
    pub(crate) fn for_current_process() -> Symbolizer {
        Symbolizer::new(Maps::parse(&std::fs::read("/proc/self/maps").unwrap_or_default()))
    }

    pub(crate) fn new(maps: Maps) -> Symbolizer {
        Symbolizer {
            maps,
            files: HashMap::new(),
        }
    }

    /// The function containing `addr`: its symbol, else `object+0xSTART` for the function
    /// the unwind tables give; `None` if neither covers it.
    pub(crate) fn function(&mut self, addr: u64) -> Option<Cow<'_, str>> {
        let (object, svma) = self.locate(addr)?;
        let functions = &object.symbols.functions;
        let symbol = functions.partition_point(|f| f.0 <= svma).checked_sub(1);
        if let Some(i) = symbol.filter(|&i| svma - functions[i].0 < functions[i].1.max(1)) {
            return Some(Cow::Borrowed(functions[i].2.as_str()));
        }
        if object.unwind_functions.is_none() {
            object.unwind_functions = Some(match (object.reopen(), object.symbols.eh_frame_hdr) {
                (Some(file), Some(hdr)) => unwind_functions(&file, hdr, &object.symbols.segments),
                _ => Vec::new(),
            });
        }
        let ranges = object.unwind_functions.as_deref().unwrap_or_default();
        let i = ranges.partition_point(|f| f.0 <= svma).checked_sub(1)?;
        let (start, end) = ranges[i];
        (svma < end).then(|| Cow::Owned(format!("{}+{start:#x}", object.name)))
    }

    /// The source file and line of each of `addresses` that the line tables of its object
    /// cover (see `lines` for what is read and the bounds). Objects are taken in path order,
    /// so which ones a request's budget reaches does not depend on hashing.
    pub(crate) fn lines(&mut self, addresses: &[u64]) -> HashMap<u64, (String, u64)> {
        let mut by_object: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
        for &addr in addresses {
            if let Some((object, svma)) = self.locate(addr) {
                by_object.entry(object.path.clone()).or_default().push((svma, addr));
            }
        }
        let mut objects: Vec<_> = by_object.into_iter().collect();
        objects.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut budget = lines::MAX_DEBUG_LINE_PER_REQUEST;
        let mut out = HashMap::new();
        for (path, mut wanted) in objects {
            let Some(Some(object)) = self.files.get(&path) else {
                continue;
            };
            let Some(debug_line) = object.symbols.debug_line else {
                continue;
            };
            if debug_line.size > budget.min(lines::MAX_DEBUG_LINE) {
                continue;
            }
            budget -= debug_line.size;
            let Some(file) = object.reopen() else {
                continue;
            };
            wanted.sort_unstable();
            let svmas: Vec<u64> = wanted.iter().map(|w| w.0).collect();
            let read = |offset, len| file.read_at(offset, len);
            let answers = lines::lines(&read, debug_line, object.symbols.debug_line_str, &svmas);
            for (&(_, addr), answer) in wanted.iter().zip(answers) {
                if let Some(answer) = answer {
                    out.insert(addr, answer);
                }
            }
        }
        out
    }

    /// The object mapped at `addr` (read at its first address) and `addr`'s link-time address.
    fn locate(&mut self, addr: u64) -> Option<(&mut Object, u64)> {
        let map = self.maps.find(addr)?;
        let (path, file_offset) = (map.path.clone(), (addr - map.start).wrapping_add(map.offset));
        let object = self
            .files
            .entry(path.clone())
            .or_insert_with(|| path.starts_with('/').then(|| read_object(&path)).flatten())
            .as_mut()?;
        let &(off, _, vaddr) = object
            .symbols
            .segments
            .iter()
            .find(|&&(off, size, _)| off <= file_offset && file_offset - off < size)?;
        // Wrapping: the file's numbers may be anything; a wrong answer is only a wrong name.
        Some((object, (file_offset - off).wrapping_add(vaddr)))
    }
}

impl Object {
    /// The object's file opened again, if the path still holds the same file.
    fn reopen(&self) -> Option<FileBytes> {
        let (file, size) = open_regular(&self.path)?;
        let meta = file.metadata().ok()?;
        ((meta.dev(), meta.ino()) == self.identity).then_some(FileBytes { file, size })
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

fn read_object(path: &str) -> Option<Object> {
    let (file, size) = open_regular(path)?;
    let meta = file.metadata().ok()?;
    let symbols = parse_elf(&FileBytes { file, size })?;
    Some(Object {
        path: path.to_string(),
        name: path.rsplit('/').next().unwrap_or(path).to_string(),
        identity: (meta.dev(), meta.ino()),
        symbols,
        unwind_functions: None,
    })
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
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const SHF_COMPRESSED: u64 = 0x800;
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
            let (offset, vaddr, size) = (u64_at(&phdrs, ph, 8)?, u64_at(&phdrs, ph, 16)?, u64_at(&phdrs, ph, 32)?);
            match u32_at(&phdrs, ph, 0)? {
                t if t == PT_LOAD as u64 => out.segments.push((offset, size, vaddr)),
                t if t == PT_GNU_EH_FRAME as u64 => out.eh_frame_hdr = Some(Segment { offset, vaddr, size }),
                _ => {}
            }
        }
    }
    if shentsize < SHDR_SIZE {
        return Some(out);
    }
    let shdrs = file.read_at(shoff, shnum * shentsize)?;
    let section = |i: u64| i.checked_mul(shentsize);
    (out.debug_line, out.debug_line_str) = line_sections(file, &shdrs, shentsize, shnum, u16_at(b, 0, 0x3e)?);
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

/// `.debug_line` and `.debug_line_str`, found by name through the section names' table
/// (`e_shstrndx`); a compressed or absent one is `None`.
fn line_sections(
    file: &(impl ReadAt + ?Sized),
    shdrs: &[u8],
    shentsize: u64,
    shnum: u64,
    names_index: u64,
) -> (Option<Section>, Option<Section>) {
    let names = names_index
        .checked_mul(shentsize)
        .and_then(|sh| file.read_at(u64_at(shdrs, sh, 24)?, u64_at(shdrs, sh, 32)?))
        .unwrap_or_default();
    let (mut line, mut line_str) = (None, None);
    for i in 0..shnum {
        let Some(found) = (|| {
            let sh = i.checked_mul(shentsize)?;
            let at = usize::try_from(u32_at(shdrs, sh, 0)?).ok()?;
            let name = names.get(at..)?;
            let name = &name[..name.iter().position(|&c| c == 0)?];
            let (kind, flags) = (u32_at(shdrs, sh, 4)?, u64_at(shdrs, sh, 8)?);
            if kind == SHT_NOBITS as u64 || flags & SHF_COMPRESSED != 0 {
                return None;
            }
            let section = Section {
                offset: u64_at(shdrs, sh, 24)?,
                size: u64_at(shdrs, sh, 32)?,
            };
            Some((name == b".debug_line", name == b".debug_line_str", section))
        })() else {
            continue;
        };
        match found {
            (true, _, section) => line = Some(section),
            (_, true, section) => line_str = Some(section),
            _ => {}
        }
    }
    (line, line_str)
}

/// `.eh_frame_hdr`'s encodings as every linker writes them (GNU ld, gold, lld, mold): the
/// pointer to `.eh_frame` relative to itself, the count as 4 bytes, the table as pairs of
/// 4-byte offsets from the header's start. Tables in other encodings are not read.
const EH_PE_PCREL_SDATA4: u8 = 0x1b;
const EH_PE_UDATA4: u8 = 0x03;
const EH_PE_DATAREL_SDATA4: u8 = 0x3b;

/// The (start, end) link-time range of every function in `.eh_frame_hdr`'s table, sorted by
/// start: the table gives each start and its FDE, whose length gives the end. Empty when the
/// header is not as expected. Reads the header and `.eh_frame` (from its start to the end of
/// the segment holding it, at most [`MAX_TABLE`] bytes).
fn unwind_functions(file: &(impl ReadAt + ?Sized), hdr: Segment, segments: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
    let read = || -> Option<Vec<(u64, u64)>> {
        let table = file.read_at(hdr.offset, hdr.size)?;
        let encodings = table.get(..4)?;
        if encodings != [1, EH_PE_PCREL_SDATA4, EH_PE_UDATA4, EH_PE_DATAREL_SDATA4] {
            return None;
        }
        let i32_at = |at: u64| Some(u32_at(&table, 0, at)? as u32 as i32 as i64 as u64);
        let eh_frame = hdr.vaddr.wrapping_add(4).wrapping_add(i32_at(4)?);
        let count = u32_at(&table, 0, 8)?.min((hdr.size.saturating_sub(12)) / 8);
        let &(seg_offset, seg_size, seg_vaddr) = segments
            .iter()
            .find(|&&(_, size, vaddr)| vaddr <= eh_frame && eh_frame - vaddr < size)?;
        let into_segment = eh_frame - seg_vaddr;
        let bytes = file.read_at(
            seg_offset.checked_add(into_segment)?,
            (seg_size - into_segment).min(MAX_TABLE),
        )?;
        let section = EhFrame::new(&bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame_hdr(hdr.vaddr)
            .set_eh_frame(eh_frame);
        let mut out = Vec::with_capacity(usize::try_from(count).ok()?);
        for k in 0..count {
            let fde = hdr.vaddr.wrapping_add(i32_at(12 + 8 * k + 4)?);
            let Ok(offset) = usize::try_from(fde.wrapping_sub(eh_frame)) else {
                continue;
            };
            if offset >= bytes.len() {
                continue;
            }
            let Ok(fde) = section.fde_from_offset(&bases, EhFrameOffset(offset), EhFrame::cie_from_offset) else {
                continue;
            };
            if fde.end_address() > fde.initial_address() {
                out.push((fde.initial_address(), fde.end_address()));
            }
        }
        Some(out)
    };
    let mut out = read().unwrap_or_default();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line of `a_function_of_this_test`'s `fn`, for the line-table test.
    const FUNCTION_LINE: u32 = line!() + 3;

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
    fn line_tables_give_this_process_source_lines() {
        let mut s = Symbolizer::for_current_process();
        let addr = a_function_of_this_test as *const () as usize as u64;
        let lines = s.lines(&[addr + 1, 8]);
        let (file, line) = lines.get(&(addr + 1)).expect("the test binary has .debug_line");
        assert!(file.ends_with("src/symbolize/mod.rs"), "{file}");
        assert!((FUNCTION_LINE..FUNCTION_LINE + 3).contains(&(*line as u32)), "{line}");
        assert_eq!(lines.len(), 1);
    }

    #[test]
    fn malformed_line_tables_give_nothing_without_panicking() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let symbols = parse_elf(&exe[..]).unwrap();
        let debug_line = symbols.debug_line.unwrap();
        let addr = a_function_of_this_test as *const () as usize as u64;
        let wanted = [addr, addr + 1];
        for (cut, scramble) in [(exe.len() / 2, false), (exe.len(), true)] {
            let mut bytes = exe[..cut].to_vec();
            if scramble {
                let start = usize::try_from(debug_line.offset).unwrap();
                let end = (start + usize::try_from(debug_line.size).unwrap()).min(bytes.len());
                for (i, b) in bytes[start..end].iter_mut().enumerate().filter(|(i, _)| i % 7 == 3) {
                    *b = (i * 151 % 256) as u8;
                }
            }
            let read = |offset, len| bytes.read_at(offset, len);
            let _ = lines::lines(&read, debug_line, symbols.debug_line_str, &wanted);
        }
        let read = |offset, len| exe.read_at(offset, len);
        let beyond = lines::Section {
            offset: u64::MAX - 4,
            size: 1 << 20,
        };
        assert!(lines::lines(&read, beyond, None, &wanted).iter().all(Option::is_none));
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
    fn unwind_tables_give_each_function_its_range() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let symbols = parse_elf(&exe[..]).unwrap();
        let hdr = symbols.eh_frame_hdr.expect("rustc links with --eh-frame-hdr");
        let ranges = unwind_functions(&exe[..], hdr, &symbols.segments);
        let &(start, size, _) = symbols
            .functions
            .iter()
            .find(|f| f.2.contains("a_function_of_this_test"))
            .unwrap();
        assert!(ranges.contains(&(start, start + size)), "{start:#x}+{size}");
        assert!(ranges.windows(2).all(|w| w[0] <= w[1]));
        // A header in another encoding, or cut short anywhere, gives no ranges and no panic.
        let mut other = exe.clone();
        other[usize::try_from(hdr.offset).unwrap() + 3] = 0x1b;
        assert!(unwind_functions(&other[..], hdr, &symbols.segments).is_empty());
        for cut in [0, 64, exe.len() / 3, exe.len() / 2, exe.len() - 1] {
            let _ = unwind_functions(&exe[..cut], hdr, &symbols.segments);
        }
        let mut scrambled = exe.clone();
        let table = usize::try_from(hdr.offset).unwrap() + 12;
        for (i, b) in scrambled[table..table + 4096].iter_mut().enumerate() {
            *b = (i * 151 % 256) as u8;
        }
        let _ = unwind_functions(&scrambled[..], hdr, &symbols.segments);
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
