//! Names for addresses: ELF symbols and DWARF (inlined frames, lines) of each mapped object.

use super::file_name;
use super::locator::{open_regular, read_regular, Locator};
use crate::symbols::debug_info::{self, DebugSearch};
use crate::symbols::plt;
use addr2line::Loader;
use cpuprof::elf::{self, Elf, FileReader, FunctionExtents, FunctionSymbols, Segment};
use cpuprof::format::pprof::Frame;
use cpuprof::format::{MapEntry, Maps};
use object::Object;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// One binary's symbol sources and its loadable segments. Segments come from the object;
/// symbols from the object and its separate debug file; DWARF from the debug file when there
/// is one.
struct Binary {
    /// The object file read (not its separate debug file): where its code is.
    file: PathBuf,
    /// The instruction set of its code.
    architecture: object::Architecture,
    loader: Loader,
    /// The `PT_LOAD` segments.
    segments: Vec<Segment>,
    /// Function symbols from .symtab and .dynsym of the object and of its debug file, and PLT
    /// stubs, under the ELF reader's policy ([`FunctionSymbols`]).
    functions: FunctionSymbols,
    /// Link-time address and size of the (first) executable segment.
    text: Option<(u64, u64)>,
    /// Function extents from the unwind tables, for addresses no symbol covers: read from
    /// the object file (not a separate debug file, whose `.eh_frame` is empty) on first use,
    /// as most objects of a profile are fully covered by symbols and never need them.
    extents: OnceCell<FunctionExtents>,
}

impl Binary {
    /// The unwind-table extents, read at the first call.
    fn extents(&self) -> &FunctionExtents {
        self.extents.get_or_init(|| {
            let Ok((file, size, _)) = open_regular(&self.file) else {
                return FunctionExtents::default();
            };
            let file = FileReader { file, size };
            Elf::parse(&file).map_or_else(FunctionExtents::default, |elf| FunctionExtents::read(&elf))
        })
    }

    /// The name of the function symbol whose extent holds `svma` (see [`FunctionSymbols`]).
    fn function_at(&self, svma: u64) -> Option<&str> {
        Some(self.functions.at(svma, || self.extents())?.2.as_str())
    }

    /// The extent (link-time start, end) of the function holding `svma`: its symbol's, else
    /// the unwind-table extent.
    fn extent(&self, svma: u64) -> Option<(u64, u64)> {
        self.functions.extent(svma, || self.extents())
    }

    /// The link-time address of file offset `offset`, if a loadable segment holds it.
    fn svma(&self, offset: u64) -> Option<u64> {
        elf::svma_of_offset(&self.segments, offset)
    }
}

pub struct Symbolizer {
    locator: Locator,
    /// The profile's main executable (the first mapped file), for `--binary` without a name match.
    main: Option<String>,
    binaries: HashMap<String, Option<Rc<Binary>>>,
    /// The same binaries by (device, inode) of the file read.
    by_identity: HashMap<(u64, u64), Rc<Binary>>,
    /// Build-ids the profile recorded, by path (the first one, if a path was mapped twice).
    recorded: HashMap<String, String>,
    debug: DebugSearch,
}

impl Symbolizer {
    pub fn new(locator: Locator, maps: &Maps) -> Self {
        let main = maps
            .entries
            .iter()
            .find(|e| e.path.starts_with('/'))
            .map(|e| e.path.clone());
        let mut recorded = HashMap::new();
        for e in &maps.entries {
            if let Some(id) = &e.build_id {
                recorded.entry(e.path.clone()).or_insert_with(|| id.clone());
            }
        }
        Symbolizer {
            debug: DebugSearch::new(&locator.debug_dirs),
            locator,
            main,
            binaries: HashMap::new(),
            by_identity: HashMap::new(),
            recorded,
        }
    }

    /// Frames at `addr`, innermost inlined frame first; none where neither symbols, DWARF nor
    /// unwind tables name the code, so that a protobuf keeps just the address and mapping and
    /// its reader may symbolise it. `addr` must already point inside the call instruction for
    /// return addresses.
    pub fn frames(&mut self, maps: &Maps, addr: u64) -> Vec<Frame> {
        let Some(map) = maps.find(addr) else {
            return Vec::new();
        };
        // Wrapping: offsets in a crafted map may be anything; a wrong offset finds no symbol.
        let file_offset = (addr - map.start).wrapping_add(map.offset);
        self.frames_in(map, file_offset).unwrap_or_default()
    }

    /// Function names at `addr`, innermost first (see [`Symbolizer::frames`]). Unnamed code is
    /// one frame named `[object]` (as pprof names it), so what even the unwind tables do not
    /// cover adds up in one row per object instead of scattering; an address in no mapping is
    /// named in hex.
    pub fn functions(&mut self, maps: &Maps, addr: u64) -> Vec<String> {
        let names: Vec<String> = self.frames(maps, addr).into_iter().map(|f| f.function).collect();
        if !names.is_empty() {
            return names;
        }
        vec![match maps.find(addr) {
            Some(map) => elf::unknown_code(&map.path),
            None => format!("{addr:#x}"),
        }]
    }

    /// Frames at link-time address `svma` of the object mapped from `path`.
    pub fn frames_at_svma(&mut self, path: &str, svma: u64) -> Option<Vec<Frame>> {
        let binary = self.binary(path, 0)?;
        frames_of(binary, file_name(path), svma)
    }

    /// The code of the function holding link-time address `svma` in the object mapped from
    /// `path`: its link-time start and its bytes as the file holds them (for disassembly),
    /// and their instruction set. At most `limit` bytes; none if the extent is not in the file.
    pub fn function_code(&mut self, path: &str, svma: u64, limit: u64) -> Option<(u64, Vec<u8>, object::Architecture)> {
        use std::os::unix::fs::FileExt;
        let binary = self.binary(path, 0)?;
        let (start, end) = binary.extent(svma)?;
        let &Segment { offset: off, vaddr, .. } = binary
            .segments
            .iter()
            .find(|s| s.vaddr <= start && end - s.vaddr <= s.file_size)?;
        let mut code = vec![0; (end - start).min(limit) as usize];
        let (file, _, _) = open_regular(&binary.file).ok()?;
        file.read_exact_at(&mut code, off.checked_add(start - vaddr)?).ok()?;
        Some((start, code, binary.architecture))
    }

    /// Link-time start and size of the executable segment of the object mapped from `path`.
    pub fn text(&mut self, path: &str) -> Option<(u64, u64)> {
        self.binary(path, 0)?.text
    }

    /// The link-time address of `addr` in its object, and that object's recorded path.
    pub fn svma(&mut self, maps: &Maps, addr: u64) -> Option<(String, u64)> {
        let map = maps.find(addr)?;
        let svma = self
            .binary(&map.path, map.inode)?
            .svma((addr - map.start).wrapping_add(map.offset))?;
        Some((map.path.clone(), svma))
    }

    fn frames_in(&mut self, map: &MapEntry, file_offset: u64) -> Option<Vec<Frame>> {
        let binary = self.binary(&map.path, map.inode)?;
        frames_of(binary, file_name(&map.path), binary.svma(file_offset)?)
    }

    fn binary(&mut self, path: &str, inode: u64) -> Option<&Binary> {
        if !self.binaries.contains_key(path) {
            let loaded = self.load(path, inode);
            self.binaries.insert(path.to_string(), loaded);
        }
        self.binaries[path].as_deref()
    }

    fn load(&mut self, path: &str, inode: u64) -> Option<Rc<Binary>> {
        if !path.starts_with('/') {
            return None;
        }
        let recorded = self.recorded.get(path).map(String::as_str);
        let (file, warning) = self.locator.locate(path, self.main.as_deref() == Some(path), recorded);
        // Without a recorded build-id, the inode is the only sign of a replaced file (a
        // rebuild in place keeps it: only the build-id sees that).
        let warning = warning.or_else(|| {
            if recorded.is_some() {
                return None;
            }
            let now = std::fs::metadata(file.as_ref()?).ok()?.ino();
            (file.as_deref() == Some(Path::new(path)) && inode != 0 && now != inode).then(|| {
                format!("{path}: replaced since the profile was taken (inode {inode}, now {now}); symbols may be wrong")
            })
        });
        if let Some(w) = warning {
            eprintln!("cpuprof: warning: {w}");
        }
        let file = file?;
        let (data, identity) = match read_regular(&file) {
            Some(read) => read,
            None => {
                if let Err(why) = open_regular(&file) {
                    eprintln!("cpuprof: warning: {why}");
                }
                return None;
            }
        };
        if let Some(known) = self.by_identity.get(&identity) {
            return Some(known.clone());
        }
        let binary = Rc::new(load_binary(&file, &data, &mut self.debug)?);
        self.by_identity.insert(identity, binary.clone());
        Some(binary)
    }
}

/// Frames at `svma` in `binary`, mapped from a file named `object`: from DWARF, else the
/// symbol holding it, else the unwind-table extent holding it (`object+0xSTART`).
fn frames_of(binary: &Binary, object: &str, svma: u64) -> Option<Vec<Frame>> {
    let mut out = Vec::new();
    if let Ok(mut frames) = binary.loader.find_frames(svma) {
        while let Ok(Some(frame)) = frames.next() {
            let Some(function) = frame.function.and_then(|f| f.demangle().ok().map(|n| n.into_owned())) else {
                continue;
            };
            let (file, line) = frame.location.map_or((String::new(), 0), |l| {
                (l.file.unwrap_or("").to_string(), l.line.unwrap_or(0))
            });
            out.push(Frame {
                function,
                file,
                line: u64::from(line),
            });
        }
    }
    if out.is_empty() {
        let name = match binary.function_at(svma) {
            Some(sym) => addr2line::demangle_auto(sym.into(), None).into_owned(),
            None => {
                let (start, _) = binary.extents().containing(svma)?;
                elf::unnamed(object, start)
            }
        };
        out.push(unknown(name));
    }
    Some(out)
}

fn unknown(name: String) -> Frame {
    Frame {
        function: name,
        ..Frame::default()
    }
}

/// `path`'s symbols from `data`, its contents, and from its separate debug file if it has no
/// DWARF of its own; DWARF is read by `addr2line` from whichever of the two files has it.
fn load_binary(path: &Path, data: &[u8], debug: &mut DebugSearch) -> Option<Binary> {
    let file = object::File::parse(data).ok()?;
    let image = Elf::parse(data)?;
    let segments: Vec<Segment> = image
        .segments()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.kind == elf::PT_LOAD)
        .collect();
    let text = segments
        .iter()
        .find(|s| s.flags & elf::PF_X != 0)
        .map(|s| (s.vaddr, s.mem_size));
    let mut functions = function_symbols(data);
    let separate = if debug_info::has_dwarf(&file) {
        None
    } else {
        debug.find(path, &file)
    };
    if let Some(found) = &separate {
        functions.extend(function_symbols(&found.data));
    }
    let stubs = plt::stubs(&file, &functions);
    functions.extend(stubs);
    let functions = FunctionSymbols::new(functions);
    // A debug file addr2line cannot read still gave its symbols: fall back to the object.
    let loader = separate
        .and_then(|found| {
            let alt = debug.find_alt(&found);
            Loader::new_with_sup(&found.path, alt.as_deref()).ok()
        })
        .or_else(|| Loader::new(path).ok())?;
    Some(Binary {
        file: path.to_path_buf(),
        architecture: file.architecture(),
        loader,
        segments,
        functions,
        text,
        extents: OnceCell::new(),
    })
}

/// Function symbols (start, size, name) of .symtab and .dynsym of the ELF file `data`.
fn function_symbols(data: &[u8]) -> Vec<elf::Symbol> {
    let Some(image) = Elf::parse(data) else {
        return Vec::new();
    };
    image
        .sections()
        .map(|sections| elf::function_symbols(&image, &sections))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{ObjectSymbol, SymbolKind};

    /// The ELF reader's function symbols are those the `object` crate lists (what this
    /// command read before it), on this test binary and on libc.
    #[test]
    fn function_symbols_are_those_object_lists() {
        let exe = std::env::current_exe().unwrap();
        for path in [exe.as_path(), Path::new("/lib/x86_64-linux-gnu/libc.so.6")] {
            let Ok(data) = std::fs::read(path) else { continue };
            let file = object::File::parse(&*data).unwrap();
            let mut theirs: Vec<elf::Symbol> = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
                .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
                .collect();
            let mut ours = function_symbols(&data);
            assert!(ours.len() > 100, "{}", path.display());
            theirs.sort();
            ours.sort();
            assert_eq!(ours, theirs, "{}", path.display());
        }
    }
}
