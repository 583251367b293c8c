//! The GNU build-id, from an ELF file's notes.

use super::file::{Elf, ReadAt, PT_NOTE, SHT_NOTE};

/// Longest build-id accepted, in bytes (GNU ld writes 16 or 20; some tools 32).
pub const MAX_BUILD_ID: usize = 64;
/// Most bytes of one note area read.
const MAX_NOTES_BYTES: u64 = 64 << 10;
const NT_GNU_BUILD_ID: u64 = 3;

/// The GNU build-id of `elf`, as bytes: from the notes its program headers name (what a
/// loaded image has), then, with `sections`, from its note sections (where a debug-info file
/// made by `objcopy --only-keep-debug` keeps it). Reads at most 64 KiB of each note area.
pub fn build_id<R: ReadAt + ?Sized>(elf: &Elf<'_, R>, sections: bool) -> Option<Vec<u8>> {
    let read = elf.reader();
    let in_segments = elf.segments().and_then(|segments| {
        segments.iter().filter(|s| s.kind == PT_NOTE).find_map(|s| {
            let notes = read.read_at(s.offset, s.file_size.min(MAX_NOTES_BYTES))?;
            build_id_note(elf, &notes, if s.align == 8 { 8 } else { 4 })
        })
    });
    if in_segments.is_some() || !sections {
        return in_segments;
    }
    elf.sections()?.of_kind(SHT_NOTE).find_map(|s| {
        let notes = read.read_at(s.offset, s.size.min(MAX_NOTES_BYTES))?;
        build_id_note(elf, &notes, if s.align == 8 { 8 } else { 4 })
    })
}

/// The descriptor of the `GNU` note of type `NT_GNU_BUILD_ID` in `notes`.
fn build_id_note<R: ReadAt + ?Sized>(elf: &Elf<'_, R>, mut notes: &[u8], align: usize) -> Option<Vec<u8>> {
    let padded = |n: usize| n.checked_next_multiple_of(align);
    while notes.len() >= 12 {
        let name_size = usize::try_from(elf.u(notes, 0, 4)?).ok()?;
        let desc_size = usize::try_from(elf.u(notes, 4, 4)?).ok()?;
        let kind = elf.u(notes, 8, 4)?;
        let desc_at = 12usize.checked_add(padded(name_size)?)?;
        let next = desc_at.checked_add(padded(desc_size)?)?;
        let name = notes.get(12..12usize.checked_add(name_size)?)?;
        let desc = notes.get(desc_at..desc_at.checked_add(desc_size)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && (1..=MAX_BUILD_ID).contains(&desc.len()) {
            return Some(desc.to_vec());
        }
        notes = notes.get(next..)?;
    }
    None
}
