//! Turns profile addresses into function names, from the binaries named in the maps section:
//! ELF symbol tables and DWARF (with inlined frames), demangled, for PIE executables and
//! shared libraries at any load address.

use addr2line::Loader;
use cpuprof::format::Maps;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use std::collections::HashMap;

/// One binary's symbol sources and its loadable segments (file offset, size, virtual address).
struct Binary {
    loader: Loader,
    segments: Vec<(u64, u64, u64)>,
    /// Function symbols (start, size, name) from .symtab and .dynsym, sorted by start.
    functions: Vec<(u64, u64, String)>,
}

impl Binary {
    /// The function symbol whose extent holds `svma`. Unlike nearest-preceding lookup, an
    /// address in a function the table does not list (a static function in a stripped
    /// library) stays unknown instead of being charged to its neighbour.
    fn function_at(&self, svma: u64) -> Option<&str> {
        let i = self
            .functions
            .partition_point(|&(start, _, _)| start <= svma)
            .checked_sub(1)?;
        let (start, size, name) = &self.functions[i];
        (svma < start + size.max(&1)).then_some(name.as_str())
    }
}

#[derive(Default)]
pub struct Symbolizer {
    binaries: HashMap<String, Option<Binary>>,
}

impl Symbolizer {
    /// Function names at `addr`, innermost inlined frame first; a hex address when unknown.
    /// `addr` must already point inside the call instruction for return addresses.
    pub fn functions(&mut self, maps: &Maps, addr: u64) -> Vec<String> {
        let unknown = || vec![format!("{addr:#x}")];
        let Some(map) = maps.find(addr) else { return unknown() };
        let file_offset = addr - map.start + map.offset;
        let Some(binary) = self.binary(&map.path) else {
            return unknown();
        };
        let Some(&(off, _, vaddr)) = binary
            .segments
            .iter()
            .find(|&&(off, size, _)| off <= file_offset && file_offset < off + size)
        else {
            return unknown();
        };
        let svma = file_offset - off + vaddr;
        let mut names = Vec::new();
        if let Ok(mut frames) = binary.loader.find_frames(svma) {
            while let Ok(Some(frame)) = frames.next() {
                if let Some(name) = frame.function.and_then(|f| f.demangle().ok().map(|n| n.into_owned())) {
                    names.push(name);
                }
            }
        }
        if names.is_empty() {
            match binary.function_at(svma) {
                Some(sym) => names.push(addr2line::demangle_auto(sym.into(), None).into_owned()),
                None => names.push(format!("{}+{:#x}", file_name(&map.path), file_offset)),
            }
        }
        names
    }

    fn binary(&mut self, path: &str) -> Option<&Binary> {
        self.binaries
            .entry(path.to_string())
            .or_insert_with(|| load(path))
            .as_ref()
    }
}

fn load(path: &str) -> Option<Binary> {
    if !path.starts_with('/') {
        return None;
    }
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let segments = file
        .segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (off, size, s.address())
        })
        .collect();
    let mut functions: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .collect();
    functions.sort();
    functions.dedup_by_key(|f| f.0);
    let loader = Loader::new(path).ok()?;
    Some(Binary {
        loader,
        segments,
        functions,
    })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
