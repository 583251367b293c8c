//! Turns profile addresses into function names, from the binaries named in the maps section:
//! ELF symbol tables and DWARF (with inlined frames and line numbers), demangled, for PIE
//! executables and shared libraries at any load address.
//!
//! A binary that has moved since profiling is found through `--binary` or a search path
//! ([`Locator`]). Substitutes are checked: a file whose inode differs from the one recorded in
//! the maps, or whose build-id differs from the original's, is used with a warning.
//!
//! A profile's maps are input like any other and may name anything: only regular files are
//! ever opened ([`open_regular`]; a device such as `/dev/zero` never ends and opening a FIFO
//! waits for a writer), and an object reached by several spellings of its path
//! (`/lib//libc.so.6`, `/lib/./libc.so.6`) is loaded once, by device and inode.

pub mod debug_info;
mod locator;
pub mod plt;
mod symbolizer;

pub use locator::{open_regular, read_opened, BuildIds, Locator};
pub use symbolizer::Symbolizer;

/// The last component of a path as the maps spell it.
pub fn file_name(path: &str) -> &str {
    cpuprof::elf::file_name(path)
}
