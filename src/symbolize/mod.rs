//! In-process symbolisation, for the HTTP endpoint and [`Report`](crate::Report)s: function
//! names for addresses of this process (or of files that have not changed since a profile
//! listed them), from the ELF symbol tables (`.symtab` and `.dynsym`) of the files in
//! `/proc/self/maps`. Runs on the endpoint's thread, never in signal context.
//!
//! The files are read by the ELF reader the `cpuprof` command also uses ([`crate::elf`]),
//! with its policy for symbols at one address and symbols without a size, and its names for
//! code no symbol covers: static functions of a stripped binary, a library's internal
//! functions with only `.dynsym` left. The unwind tables survive `strip --strip-all`, and
//! `.eh_frame` gives the extent of every function with an FDE: such a function is named
//! `object+0xSTART`, START its link-time address (stable across runs, and
//! `addr2line -e object 0xSTART` looks it up in the unstripped build). The extents are read
//! the first time an address of the object misses its symbols (or lands on a symbol without
//! a size), so objects whose symbols cover everything never pay for them. Names are returned
//! as the symbol tables hold them (C++ and Rust names mangled; pprof demangles them).

mod lines;

use crate::elf::{self, Elf, FileReader, FunctionExtents, FunctionSymbols, ReadAt, Sections, Segment};
use crate::format::Maps;
use lines::Section;
use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

/// What the symboliser knows of one file: its function symbols, its loadable segments and
/// its line tables.
#[derive(Default)]
struct FileSymbols {
    functions: FunctionSymbols,
    segments: Vec<Segment>,
    /// The DWARF line tables and their strings, if the file has them uncompressed.
    debug_line: Option<Section>,
    debug_line_str: Option<Section>,
}

/// One object as the symboliser knows it: its symbols, and the function extents of its
/// unwind tables, read when first needed.
struct Object {
    path: String,
    /// Device and inode of the file the symbols came from: the unwind tables are read from
    /// the same file or not at all. (The file is opened again rather than kept open: a
    /// request touching hundreds of objects must not hold hundreds of the program's
    /// descriptors.)
    identity: (u64, u64),
    symbols: FileSymbols,
    extents: OnceCell<FunctionExtents>,
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
    /// the unwind tables give ([`elf::unnamed`]); `None` if neither covers it.
    pub(crate) fn function(&mut self, addr: u64) -> Option<Cow<'_, str>> {
        let (object, svma) = self.locate(addr)?;
        let object = &*object;
        let extents = || object.extents();
        if let Some(symbol) = object.symbols.functions.at(svma, extents) {
            return Some(Cow::Borrowed(symbol.2.as_str()));
        }
        let (start, _) = object.extents().containing(svma)?;
        Some(Cow::Owned(elf::unnamed(&object.path, start)))
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
        let svma = elf::svma_of_offset(&object.symbols.segments, file_offset)?;
        Some((object, svma))
    }
}

impl Object {
    /// The object's file opened again, if the path still holds the same file.
    fn reopen(&self) -> Option<FileReader> {
        let (file, size) = open_regular(&self.path)?;
        let meta = file.metadata().ok()?;
        ((meta.dev(), meta.ino()) == self.identity).then_some(FileReader { file, size })
    }

    /// The function extents of the object's unwind tables, read at the first call.
    fn extents(&self) -> &FunctionExtents {
        self.extents.get_or_init(|| {
            self.reopen()
                .and_then(|file| Some(FunctionExtents::read(&Elf::parse(&file)?)))
                .unwrap_or_default()
        })
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
    let symbols = parse_elf(&FileReader { file, size })?;
    Some(Object {
        path: path.to_string(),
        identity: (meta.dev(), meta.ino()),
        symbols,
        extents: OnceCell::new(),
    })
}

/// An ELF file's loadable segments, function symbols and line sections; `None` for anything
/// that is not an ELF file.
fn parse_elf(file: &(impl ReadAt + ?Sized)) -> Option<FileSymbols> {
    let elf = Elf::parse(file)?;
    let mut out = FileSymbols {
        segments: elf.segments().unwrap_or_default(),
        ..FileSymbols::default()
    };
    if let Some(sections) = elf.sections() {
        out.functions = FunctionSymbols::new(elf::function_symbols(&elf, &sections));
        // Line tables are read as 64-bit little-endian DWARF only.
        if elf.wide && !elf.big {
            (out.debug_line, out.debug_line_str) = line_sections(&sections);
        }
    }
    Some(out)
}

/// `.debug_line` and `.debug_line_str`; a compressed or absent one is `None`.
fn line_sections(sections: &Sections) -> (Option<Section>, Option<Section>) {
    let find = |name: &[u8]| {
        let s = sections.by_name(name)?;
        (s.kind != elf::SHT_NOBITS && s.flags & elf::SHF_COMPRESSED == 0).then_some(Section {
            offset: s.offset,
            size: s.size,
        })
    };
    (find(b".debug_line"), find(b".debug_line_str"))
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

    /// Code no symbol names is named after the start of its unwind-table extent, and a symbol
    /// without a size holds the extent it starts: shown on this binary's own symbols, with
    /// the names taken away or the sizes zeroed.
    #[test]
    fn unwind_extents_name_what_symbols_do_not() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let symbols = parse_elf(&exe[..]).unwrap();
        let extents = FunctionExtents::read(&Elf::parse(&exe[..]).unwrap());
        let &(start, size, _) = symbols
            .functions
            .as_slice()
            .iter()
            .find(|f| f.2.contains("a_function_of_this_test"))
            .unwrap();
        assert_eq!(extents.containing(start + size - 1), Some((start, start + size)));
        let object = Object {
            path: "/some/where/test-binary".to_string(),
            identity: (0, 0),
            symbols: FileSymbols::default(),
            extents: OnceCell::from(extents.clone()),
        };
        let stripped = FunctionSymbols::default();
        assert!(stripped.at(start + 1, || object.extents()).is_none());
        assert_eq!(
            elf::unnamed(&object.path, object.extents().containing(start + 1).unwrap().0),
            format!("test-binary+{start:#x}")
        );
        let sizeless = FunctionSymbols::new(vec![(start, 0, "asm".to_string())]);
        assert_eq!(
            sizeless.at(start + size - 1, || &extents).map(|f| f.2.as_str()),
            Some("asm")
        );
        assert_eq!(sizeless.at(start + size, || &extents), None);
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
