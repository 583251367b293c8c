//! Turns profile addresses into function names, from the binaries named in the maps section:
//! ELF symbol tables and DWARF (with inlined frames), demangled, for PIE executables and
//! shared libraries at any load address.

use addr2line::Loader;
use cpuprof::format::Maps;
use object::{Object, ObjectSegment};
use std::collections::HashMap;

/// One binary's symbol source and its loadable segments (file offset, size, virtual address).
struct Binary {
    loader: Loader,
    segments: Vec<(u64, u64, u64)>,
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
            if let Some(sym) = binary.loader.find_symbol(svma) {
                names.push(addr2line::demangle_auto(sym.into(), None).into_owned());
            }
        }
        if names.is_empty() {
            return unknown();
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
    let loader = Loader::new(path).ok()?;
    Some(Binary { loader, segments })
}
