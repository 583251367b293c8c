//! The ELF file header, program headers (segments) and section headers, read through
//! [`ReadAt`]: 32- and 64-bit, either byte order. Only the ranges the headers name are read.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Largest table (program or section headers, a symbol table, its names, `.eh_frame`) read
/// from one file: the symbol table of a large C++ library is tens of MiB; anything beyond
/// this is not a real one.
pub const MAX_TABLE: u64 = 256 << 20;
/// Most program headers read (real files have a dozen or two).
const MAX_SEGMENTS: u64 = 512;

pub const PT_LOAD: u32 = 1;
pub const PT_NOTE: u32 = 4;
pub const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
pub const PF_X: u32 = 1;
pub const SHT_SYMTAB: u32 = 2;
pub const SHT_NOTE: u32 = 7;
pub const SHT_NOBITS: u32 = 8;
pub const SHT_DYNSYM: u32 = 11;
pub const SHF_COMPRESSED: u64 = 0x800;

/// Where an ELF file is read from: only the ranges the headers name are read, never the whole
/// file.
pub trait ReadAt {
    /// `len` bytes at file offset `offset`, or `None` if they lie outside the file or over
    /// [`MAX_TABLE`].
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>>;
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

/// An opened file of a known size (its size when opened: a file that grows is not followed).
pub struct FileReader {
    /// The file.
    pub file: File,
    /// Its size.
    pub size: u64,
}

impl ReadAt for FileReader {
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        if len > MAX_TABLE || offset.checked_add(len)? > self.size {
            return None;
        }
        let mut buf = vec![0; usize::try_from(len).ok()?];
        self.file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }
}

/// A program header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// `p_type`.
    pub kind: u32,
    /// `p_flags` (`PF_X` = 1 for code).
    pub flags: u32,
    /// `p_offset`: where it starts in the file.
    pub offset: u64,
    /// `p_vaddr`: its link-time address.
    pub vaddr: u64,
    /// `p_filesz`: its size in the file.
    pub file_size: u64,
    /// `p_memsz`: its size in memory.
    pub mem_size: u64,
    /// `p_align`.
    pub align: u64,
}

/// A section header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Section {
    /// `sh_name`: where its name is in the section names' table.
    pub name: u32,
    /// `sh_type`.
    pub kind: u32,
    /// `sh_flags`.
    pub flags: u64,
    /// `sh_addr`: its link-time address.
    pub addr: u64,
    /// `sh_offset`: where it starts in the file.
    pub offset: u64,
    /// `sh_size`.
    pub size: u64,
    /// `sh_link` (a symbol table's names).
    pub link: u32,
    /// `sh_addralign`.
    pub align: u64,
    /// `sh_entsize`.
    pub entry_size: u64,
}

/// The section headers of a file, with the section names' table (`e_shstrndx`; empty if it
/// could not be read).
#[derive(Clone, Debug, Default)]
pub struct Sections {
    /// The headers, in file order.
    pub headers: Vec<Section>,
    names: Vec<u8>,
}

impl Sections {
    /// The name of `section`, if the names' table holds it.
    pub fn name(&self, section: &Section) -> Option<&[u8]> {
        let rest = self.names.get(usize::try_from(section.name).ok()?..)?;
        Some(&rest[..rest.iter().position(|&c| c == 0)?])
    }

    /// The first section named `name`.
    pub fn by_name(&self, name: &[u8]) -> Option<&Section> {
        self.headers.iter().find(|s| self.name(s) == Some(name))
    }

    /// The sections of type `kind`, in file order.
    pub fn of_kind(&self, kind: u32) -> impl Iterator<Item = &Section> + '_ {
        self.headers.iter().filter(move |s| s.kind == kind)
    }
}

/// An ELF file: its class and byte order, and where its header tables are. Reading the
/// tables ([`Elf::segments`], [`Elf::sections`]) and anything they name is up to the caller,
/// so that an image in memory (which has no section headers) is read as well as a file.
pub struct Elf<'r, R: ReadAt + ?Sized> {
    read: &'r R,
    /// 64-bit (`ELFCLASS64`).
    pub wide: bool,
    /// Big-endian (`ELFDATA2MSB`).
    pub big: bool,
    /// (offset, entry size, count) of the program headers.
    program_headers: (u64, u64, u64),
    /// (offset, entry size, count) of the section headers, and the names' section index.
    section_headers: (u64, u64, u64),
    names_index: u64,
}

impl<'r, R: ReadAt + ?Sized> Elf<'r, R> {
    /// The file `read` reads, if it starts with an ELF header; `None` for anything else.
    pub fn parse(read: &'r R) -> Option<Self> {
        let ident = read.read_at(0, 16)?;
        if ident.get(..4)? != b"\x7fELF" {
            return None;
        }
        let wide = match ident[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let big = match ident[5] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let mut elf = Elf {
            read,
            wide,
            big,
            program_headers: (0, 0, 0),
            section_headers: (0, 0, 0),
            names_index: 0,
        };
        let h = read.read_at(0, if wide { 64 } else { 52 })?;
        (elf.program_headers, elf.section_headers, elf.names_index) = if wide {
            (
                (elf.u(&h, 0x20, 8)?, elf.u(&h, 0x36, 2)?, elf.u(&h, 0x38, 2)?),
                (elf.u(&h, 0x28, 8)?, elf.u(&h, 0x3a, 2)?, elf.u(&h, 0x3c, 2)?),
                elf.u(&h, 0x3e, 2)?,
            )
        } else {
            (
                (elf.u(&h, 0x1c, 4)?, elf.u(&h, 0x2a, 2)?, elf.u(&h, 0x2c, 2)?),
                (elf.u(&h, 0x20, 4)?, elf.u(&h, 0x2e, 2)?, elf.u(&h, 0x30, 2)?),
                elf.u(&h, 0x32, 2)?,
            )
        };
        Some(elf)
    }

    /// What reads the file.
    pub fn reader(&self) -> &'r R {
        self.read
    }

    /// The size of an address: 8 or 4 bytes.
    pub fn word(&self) -> usize {
        if self.wide {
            8
        } else {
            4
        }
    }

    /// The `size`-byte unsigned field at `at` of `b`, in the file's byte order; `None`, never
    /// a panic, when it lies outside `b`.
    pub fn u(&self, b: &[u8], at: usize, size: usize) -> Option<u64> {
        let bytes = b.get(at..at.checked_add(size)?)?;
        let fold = |v: u64, &x: &u8| (v << 8) | u64::from(x);
        Some(if self.big {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        })
    }

    /// The entries of a header table, `None` if there is none or it cannot be read.
    fn table(&self, (offset, entry_size, count): (u64, u64, u64), min_entry: u64, max: u64) -> Option<Vec<u8>> {
        let count = count.min(max);
        if offset == 0 || count == 0 || entry_size < min_entry {
            return None;
        }
        self.read.read_at(offset, entry_size.checked_mul(count)?)
    }

    /// The program headers (at most 512); `None` if there are none or they cannot be read.
    pub fn segments(&self) -> Option<Vec<Segment>> {
        let entry_size = self.program_headers.1;
        let table = self.table(self.program_headers, if self.wide { 56 } else { 32 }, MAX_SEGMENTS)?;
        let w = self.word();
        // Offsets of type, flags, offset, vaddr, filesz, memsz, align.
        let at = if self.wide {
            [0, 4, 8, 16, 32, 40, 48]
        } else {
            [0, 24, 4, 8, 16, 20, 28]
        };
        table
            .chunks_exact(usize::try_from(entry_size).ok()?)
            .map(|h| {
                Some(Segment {
                    kind: self.u(h, at[0], 4)? as u32,
                    flags: self.u(h, at[1], 4)? as u32,
                    offset: self.u(h, at[2], w)?,
                    vaddr: self.u(h, at[3], w)?,
                    file_size: self.u(h, at[4], w)?,
                    mem_size: self.u(h, at[5], w)?,
                    align: self.u(h, at[6], w)?,
                })
            })
            .collect()
    }

    /// The section headers and their names; `None` if there are none or they cannot be read.
    pub fn sections(&self) -> Option<Sections> {
        let entry_size = self.section_headers.1;
        let table = self.table(self.section_headers, if self.wide { 64 } else { 40 }, u64::MAX)?;
        let w = self.word();
        // Offsets of flags, addr, offset, size, link, addralign, entsize.
        let at = if self.wide {
            [8, 16, 24, 32, 40, 48, 56]
        } else {
            [8, 12, 16, 20, 24, 32, 36]
        };
        let headers = table
            .chunks_exact(usize::try_from(entry_size).ok()?)
            .map(|h| {
                Some(Section {
                    name: self.u(h, 0, 4)? as u32,
                    kind: self.u(h, 4, 4)? as u32,
                    flags: self.u(h, at[0], w)?,
                    addr: self.u(h, at[1], w)?,
                    offset: self.u(h, at[2], w)?,
                    size: self.u(h, at[3], w)?,
                    link: self.u(h, at[4], 4)? as u32,
                    align: self.u(h, at[5], w)?,
                    entry_size: self.u(h, at[6], w)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let names = usize::try_from(self.names_index)
            .ok()
            .and_then(|i| headers.get(i))
            .and_then(|s| self.contents(s))
            .unwrap_or_default();
        Some(Sections { headers, names })
    }

    /// The contents of `section` (none for `SHT_NOBITS`, which has none in the file).
    pub fn contents(&self, section: &Section) -> Option<Vec<u8>> {
        if section.kind == SHT_NOBITS {
            return Some(Vec::new());
        }
        self.read.read_at(section.offset, section.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_code_and_named_sections() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let elf = Elf::parse(&exe[..]).unwrap();
        assert!(elf.wide);
        let segments = elf.segments().unwrap();
        assert!(segments.iter().any(|s| s.kind == PT_LOAD && s.flags & PF_X != 0));
        let sections = elf.sections().unwrap();
        assert!(sections.by_name(b".text").is_some_and(|s| s.size > 0));
        assert!(sections.by_name(b".eh_frame").is_some());
        assert!(Elf::parse(&b"not an elf file"[..]).is_none());
        for cut in [0, 5, 16, 64, 100] {
            if let Some(elf) = Elf::parse(&exe[..cut]) {
                assert!(elf.segments().is_none() && elf.sections().is_none());
            }
        }
    }
}
