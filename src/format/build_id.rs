//! GNU build-ids: read from an ELF image's notes, and recorded in a profile's maps section.
//!
//! A build-id names the contents of an object, where a path and an inode only name where it
//! was: `gcc -o prog` over an existing `prog` keeps the inode and changes the code. cpuprof
//! records the build-id of each executable mapping after the maps text, one line each:
//!
//! ```text
//! # build-id 7f0a1c028000-7f0a1c1a0000 4f536ac1cd2e8806aac8dc3b9e9aa1e0e0b04e10
//! ```
//!
//! The spelling is chosen so that every reader of the format skips the line (docs/FORMAT.md):
//! it starts with neither a hex digit nor `build=` (so neither google-pprof's nor go pprof's
//! mapping patterns match it), and it holds no `=` (go pprof reads any unrecognised line with
//! one as a `$attr` substitution for later lines) and no `]` (go pprof strips a glog prefix
//! ending in `:N] `). It names the mapping by its address range, not its path, because a path
//! may hold any of these characters.
//!
//! This module is pure code: the reader of the image is a closure.

use std::fmt::Write;

const PREFIX: &str = "# build-id ";
/// Longest build-id accepted, in bytes (GNU ld writes 16 or 20; some tools 32).
const MAX_ID: usize = 64;
const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
const NT_GNU_BUILD_ID: u32 = 3;
/// Bounds on what a crafted or damaged header can make us read.
const MAX_HEADERS: usize = 512;
const MAX_NOTES_BYTES: usize = 64 << 10;

/// The line recording build-id `id` (lower-case hex) for the mapping `start..end`, newline
/// included, to append to a profile's maps text after the mapping lines.
pub fn line(start: u64, end: u64, id: &str) -> String {
    format!("{PREFIX}{start:x}-{end:x} {id}\n")
}

/// `(start, end, id)` of a build-id line; `None` for any other line.
pub(crate) fn parse_line(line: &str) -> Option<(u64, u64, String)> {
    let mut fields = line.trim_start().strip_prefix(PREFIX)?.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let id = fields.next()?;
    let valid = id.len() % 2 == 0 && (2..=2 * MAX_ID).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit());
    (valid && fields.next().is_none()).then(|| (start, end, id.to_ascii_lowercase()))
}

/// Lower-case hex of `bytes`, as build-ids are written.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The GNU build-id of the ELF image that `read(offset, len)` returns bytes of (by file
/// offset; `None` if they cannot be read), in hex. Looks in the notes the program headers
/// name, which is what a loaded image has; with `sections`, also in note sections, which is
/// where a debug-info file made by `objcopy --only-keep-debug` keeps it.
///
/// `None` if the bytes are not an ELF image, the image has no build-id, or a read fails. Reads
/// are bounded, so a damaged or crafted image costs little and never panics.
///
/// ```
/// use cpuprof::format::build_id::read_elf;
///
/// let exe = std::fs::read(std::env::current_exe()?)?;
/// let id = read_elf(
///     |offset, len| {
///         let start = usize::try_from(offset).ok()?;
///         exe.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
///     },
///     true,
/// );
/// // `None` if this program was linked without a build-id.
/// if let Some(id) = id {
///     assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read_elf(mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>, sections: bool) -> Option<String> {
    let ident = read(0, 16)?;
    if ident[..4] != *b"\x7fELF" {
        return None;
    }
    let e = Elf {
        wide: match ident[4] {
            1 => false,
            2 => true,
            _ => return None,
        },
        big: match ident[5] {
            1 => false,
            2 => true,
            _ => return None,
        },
    };
    let header = read(0, if e.wide { 64 } else { 52 })?;
    let (ph, sh) = if e.wide {
        (
            (e.u(&header, 0x20, 8)?, e.u(&header, 0x36, 2)?, e.u(&header, 0x38, 2)?),
            (e.u(&header, 0x28, 8)?, e.u(&header, 0x3a, 2)?, e.u(&header, 0x3c, 2)?),
        )
    } else {
        (
            (e.u(&header, 0x1c, 4)?, e.u(&header, 0x2a, 2)?, e.u(&header, 0x2c, 2)?),
            (e.u(&header, 0x20, 4)?, e.u(&header, 0x2e, 2)?, e.u(&header, 0x30, 2)?),
        )
    };
    // (table offset, entry size, count): where each entry's type, offset, size and alignment are.
    let segments = e.notes_in(
        &mut read,
        ph,
        PT_NOTE,
        if e.wide { [0, 8, 32, 48] } else { [0, 4, 16, 28] },
    );
    if let Some(id) = segments {
        return Some(id);
    }
    if !sections {
        return None;
    }
    e.notes_in(
        &mut read,
        sh,
        SHT_NOTE,
        if e.wide { [4, 24, 32, 48] } else { [4, 16, 20, 32] },
    )
}

struct Elf {
    wide: bool,
    big: bool,
}

impl Elf {
    /// The `size`-byte unsigned field at `at` of `b`.
    fn u(&self, b: &[u8], at: usize, size: usize) -> Option<u64> {
        let bytes = b.get(at..at.checked_add(size)?)?;
        let fold = |v: u64, &x: &u8| (v << 8) | u64::from(x);
        Some(if self.big {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        })
    }

    /// The build-id in the note areas of a header table (program or section headers) given as
    /// (offset, entry size, count); `fields`: where type, offset, size and alignment are in an
    /// entry. Entries of type `note_type` are searched in order.
    fn notes_in(
        &self,
        read: &mut impl FnMut(u64, usize) -> Option<Vec<u8>>,
        (table, entry_size, count): (u64, u64, u64),
        note_type: u32,
        [ty, off, size, align]: [usize; 4],
    ) -> Option<String> {
        let word = if self.wide { 8 } else { 4 };
        let entry_size = usize::try_from(entry_size).ok()?;
        let count = usize::try_from(count).ok()?.min(MAX_HEADERS);
        if table == 0 || count == 0 || entry_size < align + word {
            return None;
        }
        let headers = read(table, entry_size.checked_mul(count)?)?;
        headers.chunks_exact(entry_size).find_map(|h| {
            if self.u(h, ty, 4)? != u64::from(note_type) {
                return None;
            }
            let len = usize::try_from(self.u(h, size, word)?).ok()?.min(MAX_NOTES_BYTES);
            let notes = read(self.u(h, off, word)?, len)?;
            self.build_id_note(&notes, if self.u(h, align, word)? == 8 { 8 } else { 4 })
        })
    }

    /// The descriptor of the `GNU` note of type `NT_GNU_BUILD_ID` in `notes`, in hex.
    fn build_id_note(&self, mut notes: &[u8], align: usize) -> Option<String> {
        let padded = |n: usize| n.checked_next_multiple_of(align);
        while notes.len() >= 12 {
            let name_size = usize::try_from(self.u(notes, 0, 4)?).ok()?;
            let desc_size = usize::try_from(self.u(notes, 4, 4)?).ok()?;
            let kind = self.u(notes, 8, 4)?;
            let desc_at = 12usize.checked_add(padded(name_size)?)?;
            let next = desc_at.checked_add(padded(desc_size)?)?;
            let name = notes.get(12..12 + name_size)?;
            let desc = notes.get(desc_at..desc_at + desc_size)?;
            if kind == u64::from(NT_GNU_BUILD_ID) && name == b"GNU\0" && (1..=MAX_ID).contains(&desc.len()) {
                return Some(hex(desc));
            }
            notes = notes.get(next..)?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_bytes(data: &[u8]) -> impl FnMut(u64, usize) -> Option<Vec<u8>> + '_ {
        |offset, len| {
            let start = usize::try_from(offset).ok()?;
            data.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
        }
    }

    #[test]
    fn lines_round_trip_and_other_lines_are_not_build_ids() {
        let l = line(0x7f00_0000_1000, 0x7f00_0000_9000, "4f536ac1cd2e");
        assert_eq!(l, "# build-id 7f0000001000-7f0000009000 4f536ac1cd2e\n");
        assert_eq!(
            parse_line(l.trim_end()),
            Some((0x7f00_0000_1000, 0x7f00_0000_9000, "4f536ac1cd2e".to_string()))
        );
        for other in [
            "# build-id 1000-2000",
            "# build-id 1000-2000 abc",
            "# build-id 1000-2000 xyzw",
            "# build-id 1000 abcd",
            "# build-id 1000-2000 abcd extra",
            "build=/x",
            "1000-2000 r-xp 00000000 08:01 5 /bin/app",
        ] {
            assert_eq!(parse_line(other), None, "{other}");
        }
        assert_eq!(parse_line(&format!("# build-id 1-2 {}", "ab".repeat(MAX_ID + 1))), None);
    }

    #[test]
    fn reads_the_build_id_of_this_test_binary_as_readelf_does() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let id = read_elf(from_bytes(&exe), false).expect("rustc links with a build-id");
        let readelf = std::process::Command::new("readelf")
            .arg("-n")
            .arg(std::env::current_exe().unwrap())
            .output();
        if let Ok(out) = readelf {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains(&format!("Build ID: {id}")), "{id} not in:\n{text}");
        }
        assert_eq!(read_elf(from_bytes(&exe), true).as_deref(), Some(id.as_str()));
    }

    #[test]
    fn damaged_images_have_no_build_id_and_never_panic() {
        assert_eq!(read_elf(from_bytes(b"\x7fELF"), true), None);
        assert_eq!(read_elf(from_bytes(b"not an elf file at all, no"), true), None);
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..3000 {
            let mut bytes = exe[..exe.len().min(1 << 16)].to_vec();
            for _ in 0..8 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state as usize) % 1024;
                bytes[i] = (state >> 32) as u8;
            }
            let _ = read_elf(from_bytes(&bytes), true);
        }
    }
}
