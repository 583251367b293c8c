//! Function symbols of `.symtab` and `.dynsym`, and the one policy for symbols that share an
//! address or have no size.

use super::extents::FunctionExtents;
use super::file::{Elf, ReadAt, Sections, SHT_DYNSYM, SHT_SYMTAB};

const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
/// Longest symbol name kept; a longer one (only crafted files have them) is skipped.
const MAX_NAME: usize = 64 << 10;

/// A function symbol: link-time start, size (0 when the symbol gives none) and name as the
/// table holds it (mangled).
pub type Symbol = (u64, u64, String);

/// The function symbols (`STT_FUNC`, `STT_GNU_IFUNC`; not at address 0; names in UTF-8) of
/// the first `.symtab` and the first `.dynsym` of `elf` (both: a stripped file has only the
/// dynamic one, and either may name what the other does not), unsorted.
pub fn function_symbols<R: ReadAt + ?Sized>(elf: &Elf<'_, R>, sections: &Sections) -> Vec<Symbol> {
    let mut out = Vec::new();
    for kind in [SHT_SYMTAB, SHT_DYNSYM] {
        if let Some(table) = sections.of_kind(kind).next() {
            read_table(elf, sections, table, &mut out);
        }
    }
    out
}

fn read_table<R: ReadAt + ?Sized>(
    elf: &Elf<'_, R>,
    sections: &Sections,
    table: &super::file::Section,
    out: &mut Vec<Symbol>,
) -> Option<()> {
    let names = sections
        .headers
        .get(usize::try_from(table.link).ok()?)
        .and_then(|s| elf.contents(s))?;
    let symbols = elf.contents(table)?;
    // Names copied, over all symbols: a crafted table pointing every symbol at one long name
    // must not make the copies much larger than the table.
    let mut budget = names.len().saturating_mul(4).saturating_add(1 << 20);
    let (w, size) = if elf.wide { (8, 24) } else { (4, 16) };
    // Offsets of name, info, value, size.
    let at = if elf.wide { [0, 4, 8, 16] } else { [0, 12, 4, 8] };
    for sym in symbols.chunks_exact(size) {
        let info = elf.u(sym, at[1], 1)? as u8;
        let (value, sym_size) = (elf.u(sym, at[2], w)?, elf.u(sym, at[3], w)?);
        if !matches!(info & 0xf, STT_FUNC | STT_GNU_IFUNC) || value == 0 {
            continue;
        }
        let Some(name) = usize::try_from(elf.u(sym, at[0], 4)?)
            .ok()
            .and_then(|at| names.get(at..))
            .map(|rest| &rest[..rest.len().min(MAX_NAME + 1)])
            .and_then(|rest| Some(&rest[..rest.iter().position(|&c| c == 0)?]))
            .and_then(|name| std::str::from_utf8(name).ok())
        else {
            continue;
        };
        budget = budget.checked_sub(name.len())?;
        out.push((value, sym_size, name.to_string()));
    }
    Some(())
}

/// Function symbols sorted by start, one per start, with the policy every symboliser of
/// cpuprof follows:
/// * Of the symbols at one address, the one with the largest size is kept, and of those the
///   name first in byte order (a debug file's `.symtab` adds zero-size labels, assembly entry
///   points, beside sized functions; aliases such as `write` and `__write` tie).
/// * An address belongs to the symbol starting last at or before it, if its extent holds it:
///   an address in a function no symbol lists (a static function of a stripped library)
///   stays unknown rather than being charged to its neighbour.
/// * A symbol without a size (hand-written assembly) holds its own address and the
///   unwind-table extent ([`FunctionExtents`]) it starts.
#[derive(Clone, Debug, Default)]
pub struct FunctionSymbols {
    functions: Vec<Symbol>,
}

impl FunctionSymbols {
    /// Applies the policy to `functions`, from any number of tables.
    pub fn new(mut functions: Vec<Symbol>) -> Self {
        functions.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        functions.dedup_by_key(|f| f.0);
        FunctionSymbols { functions }
    }

    /// The symbols kept, sorted by start.
    pub fn as_slice(&self) -> &[Symbol] {
        &self.functions
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The symbol holding `svma` (a link-time address). `extents` gives the unwind-table
    /// extents, asked only for a symbol without a size.
    pub fn at<'e>(&self, svma: u64, extents: impl FnOnce() -> &'e FunctionExtents) -> Option<&Symbol> {
        let i = self.functions.partition_point(|f| f.0 <= svma).checked_sub(1)?;
        let symbol = &self.functions[i];
        let holds = match symbol.1 {
            0 => svma == symbol.0 || extents().containing(svma).is_some_and(|(s, _)| s == symbol.0),
            size => svma - symbol.0 < size,
        };
        holds.then_some(symbol)
    }

    /// The extent (link-time start, end) of the function holding `svma`: its symbol's if a
    /// sized symbol holds it, else the unwind-table extent.
    pub fn extent<'e>(&self, svma: u64, extents: impl FnOnce() -> &'e FunctionExtents) -> Option<(u64, u64)> {
        let i = self.functions.partition_point(|f| f.0 <= svma).checked_sub(1);
        match i.map(|i| &self.functions[i]) {
            Some(&(start, size, _)) if size > 0 && svma - start < size => Some((start, start.checked_add(size)?)),
            _ => extents().containing(svma),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbols(list: &[(u64, u64, &str)]) -> FunctionSymbols {
        FunctionSymbols::new(list.iter().map(|&(a, s, n)| (a, s, n.to_string())).collect())
    }

    #[test]
    fn largest_extent_then_first_name_wins_and_zero_size_takes_the_unwind_extent() {
        let s = symbols(&[
            (0x100, 0x10, "small"),
            (0x100, 0x40, "large_b"),
            (0x100, 0x40, "large_a"),
            (0x100, 0, "label"),
            (0x200, 0, "asm_entry"),
            (0x300, 0, "bare"),
        ]);
        let extents = FunctionExtents::new(vec![(0x200, 0x280)]);
        let name = |svma| s.at(svma, || &extents).map(|f| f.2.as_str());
        assert_eq!(name(0x120), Some("large_a"));
        assert_eq!(name(0x140), None);
        assert_eq!(name(0x27f), Some("asm_entry"));
        assert_eq!(name(0x280), None);
        assert_eq!(name(0x300), Some("bare"));
        assert_eq!(name(0x301), None);
        assert_eq!(name(0xff), None);
        assert_eq!(s.extent(0x120, || &extents), Some((0x100, 0x140)));
        assert_eq!(s.extent(0x210, || &extents), Some((0x200, 0x280)));
    }

    #[test]
    fn reads_this_test_binary_symbols_and_refuses_garbage() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let elf = Elf::parse(&exe[..]).unwrap();
        let all = function_symbols(&elf, &elf.sections().unwrap());
        assert!(all.iter().any(|f| f.2.contains("reads_this_test_binary_symbols")));
        let mut garbage = exe[..4096].to_vec();
        garbage[0x28..0x30].fill(0xff);
        assert!(Elf::parse(&garbage[..]).unwrap().sections().is_none());
        for cut in [64, 100, exe.len() / 2] {
            let cut = &exe[..cut];
            if let Some(sections) = Elf::parse(cut).unwrap().sections() {
                let _ = function_symbols(&Elf::parse(cut).unwrap(), &sections);
            }
        }
    }
}
