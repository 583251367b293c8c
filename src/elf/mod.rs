//! The one ELF reader of cpuprof, for the `cpuprof` command and the library's own users; not
//! part of the API.
//!
//! Every symboliser (the library's, for [`Report`](crate::Report) and the HTTP endpoint, and
//! the command's) reads objects through it, so that they name the same address the same way:
//! * [`Elf`]: the file header, segments and sections, 32- or 64-bit, either byte order, read
//!   through [`ReadAt`] (a file, bytes, or an image in memory);
//! * [`function_symbols`] and [`FunctionSymbols`]: `.symtab` and `.dynsym`, with the one
//!   policy for symbols at one address and symbols without a size;
//! * [`FunctionExtents`]: function extents from `.eh_frame`, for code no symbol covers;
//! * [`build_id`]: the GNU build-id;
//! * [`eh_frame_hdr`]: `.eh_frame_hdr` look-ups that allocate nothing, for stack walks.
//!
//! How code is named, everywhere: a symbol holding the address names it; else the function
//! the unwind tables give is [`unnamed`] after its link-time start (`object+0xSTART`); else the
//! code is its object's, [`unknown_code`] (`[object]`).

pub mod eh_frame_hdr;
mod extents;
mod file;
mod notes;
mod symbols;

pub use extents::FunctionExtents;
pub use file::{
    Elf, FileReader, ReadAt, Section, Sections, Segment, MAX_TABLE, PF_X, PT_GNU_EH_FRAME, PT_LOAD, PT_NOTE,
    SHF_COMPRESSED, SHT_DYNSYM, SHT_NOBITS, SHT_NOTE, SHT_SYMTAB,
};
pub use notes::{build_id, MAX_BUILD_ID};
pub use symbols::{function_symbols, FunctionSymbols, Symbol};

/// The name of a function no symbol names, from the start its unwind tables give: the object's
/// file name and the link-time start (`libfoo.so+0x1234`), stable across runs and load
/// addresses, and what `addr2line -e object 0x1234` looks up in an unstripped build.
pub fn unnamed(object_path: &str, start: u64) -> String {
    format!("{}+{start:#x}", file_name(object_path))
}

/// The name of code in `object_path` that neither symbols nor unwind tables name:
/// `[object]`, as pprof names it, so that all of it adds up in one row per object.
pub fn unknown_code(object_path: &str) -> String {
    format!("[{}]", file_name(object_path))
}

/// The file name of a path (all of it if it has no `/`).
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The link-time address of file offset `offset`, if a loadable segment (`PT_LOAD`, by its
/// file offset and size) holds it. Wrapping: the numbers come from the file; a wrong address
/// only finds no symbol.
pub fn svma_of_offset(segments: &[Segment], offset: u64) -> Option<u64> {
    let s = segments
        .iter()
        .find(|s| s.kind == PT_LOAD && s.offset <= offset && offset - s.offset < s.file_size)?;
    Some((offset - s.offset).wrapping_add(s.vaddr))
}
