//! Names for x86-64 PLT stubs (`strlen@plt`), as perf and objdump name them. No symbol table
//! covers the PLT, so a sample in a stub (a call through the PLT, frequent for libc's own
//! IFUNC-selected string functions) was charged to an unnamed `[object]` row even with full
//! debug info.
//!
//! Each stub jumps through its GOT slot (`jmp *disp(%rip)`, after `endbr64` and a `bnd`
//! prefix in `.plt.sec`); the slot's relocation in `.rela.plt` says which function it is. Stubs
//! are decoded rather than counted, so lazy (`.plt`), IBT (`.plt.sec`) and `-z now` layouts
//! need no separate rules.

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget};
use std::collections::HashMap;

/// The stub size on x86-64 in `.plt` and `.plt.sec`.
const STUB: usize = 16;
const R_X86_64_IRELATIVE: u32 = 37;

/// (start, size, name) of each PLT stub of `file` whose GOT slot has a relocation.
/// `functions` (start, size, name) names IFUNC resolvers, which an IRELATIVE slot names only
/// by address.
pub fn stubs(file: &object::File, functions: &[(u64, u64, String)]) -> Vec<(u64, u64, String)> {
    if file.architecture() != object::Architecture::X86_64 {
        return Vec::new();
    }
    let Some(relocations) = file.dynamic_relocations() else {
        return Vec::new();
    };
    let dynsym = file.dynamic_symbol_table();
    let mut slots: HashMap<u64, String> = HashMap::new();
    for (slot, relocation) in relocations {
        let name = match relocation.target() {
            RelocationTarget::Symbol(index) => dynsym
                .as_ref()
                .and_then(|t| t.symbol_by_index(index).ok())
                .and_then(|s| s.name().ok().map(str::to_string)),
            RelocationTarget::Absolute if matches!(relocation.flags(), RelocationFlags::Elf { r_type } if r_type == R_X86_64_IRELATIVE) =>
            {
                // Wrapping: a crafted addend only names nothing.
                let resolver = relocation.addend() as u64;
                let named = functions.iter().find(|(start, _, _)| *start == resolver);
                Some(named.map_or_else(|| format!("*ABS*+{resolver:#x}"), |(_, _, n)| n.clone()))
            }
            _ => None,
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            slots.insert(slot, name);
        }
    }
    let mut out = Vec::new();
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let Ok(data) = section.data() else { continue };
        // `.plt.got` (functions also taken by address) has 8-byte stubs that start with the
        // jump, or 16-byte ones after endbr64 in IBT builds; `.plt` and `.plt.sec` 16-byte ones.
        let stride = match name {
            ".plt" | ".plt.sec" => STUB,
            ".plt.got" if data.starts_with(&[0xff, 0x25]) => STUB / 2,
            ".plt.got" => STUB,
            _ => continue,
        };
        for (i, stub) in data.chunks_exact(stride).enumerate() {
            let address = section.address().wrapping_add((i * stride) as u64);
            let Some(at) = stub.windows(6).position(|w| w[..2] == [0xff, 0x25]) else {
                continue;
            };
            let disp = i32::from_le_bytes(stub[at + 2..at + 6].try_into().unwrap());
            let slot = address
                .wrapping_add((at + 6) as u64)
                .wrapping_add(i64::from(disp) as u64);
            if let Some(name) = slots.get(&slot) {
                out.push((address, stride as u64, format!("{name}@plt")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// objdump's `<name@plt>` labels of `path`, by address.
    fn objdump_labels(path: &str) -> HashMap<u64, String> {
        let out = std::process::Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", path])
            .output()
            .expect("objdump (binutils) runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (address, rest) = l.split_once(" <")?;
                let name = rest.strip_suffix("@plt>:")?;
                Some((u64::from_str_radix(address, 16).ok()?, name.to_string()))
            })
            .collect()
    }

    /// The same stubs as objdump finds, with the same names, except that where objdump can
    /// only say `*ABS*+0xADDR` (an IFUNC slot) the resolver's symbol names it.
    #[test]
    fn stubs_match_objdump() {
        // An IBT build has its stubs in .plt.sec, the lazy ones in .plt being mere trampolines.
        let dir = std::env::temp_dir().join(format!("cpuprof-plt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("ibt.c");
        std::fs::write(&source, "#include <stdio.h>\n#include <string.h>\nint main(int c, char **v) { printf(\"%zu\\n\", strlen(v[0])); puts(\"x\"); return c; }\n").unwrap();
        let ibt = dir.join("ibt");
        let built = std::process::Command::new("cc")
            .args(["-fcf-protection=full", "-Wl,-z,ibtplt", "-o"])
            .arg(&ibt)
            .arg(&source)
            .status()
            .unwrap();
        assert!(built.success());
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/bin/objdump",
            ibt.to_str().unwrap(),
        ] {
            let data = std::fs::read(path).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let functions: Vec<(u64, u64, String)> = file
                .dynamic_symbols()
                .map(|s| (s.address(), s.size(), s.name().unwrap_or("").to_string()))
                .collect();
            let ours: HashMap<u64, String> = stubs(&file, &functions)
                .into_iter()
                .map(|(a, _, n)| (a, n.strip_suffix("@plt").unwrap().to_string()))
                .collect();
            let theirs = objdump_labels(path);
            assert!(!theirs.is_empty(), "{path} has PLT stubs");
            let mut addresses: Vec<_> = theirs.keys().collect();
            addresses.sort();
            for address in addresses {
                let name = &theirs[address];
                let our = ours
                    .get(address)
                    .unwrap_or_else(|| panic!("{path}: no stub at {address:#x} ({name})"));
                if !name.starts_with("*ABS*") {
                    assert_eq!(our, name, "{path} at {address:#x}");
                }
            }
            assert_eq!(ours.len(), theirs.len(), "{path}: {ours:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
