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
//! This module is pure code: the reader of the image is a closure; the notes are found by
//! the ELF reader (`crate::elf`).

use crate::elf::{Elf, ReadAt, MAX_BUILD_ID as MAX_ID};
use std::cell::RefCell;
use std::fmt::Write;

const PREFIX: &str = "# build-id ";

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
pub fn read_elf(read: impl FnMut(u64, usize) -> Option<Vec<u8>>, sections: bool) -> Option<String> {
    let reader = Closure(RefCell::new(read));
    let elf = Elf::parse(&reader)?;
    Some(hex(&crate::elf::build_id(&elf, sections)?))
}

/// A closure reading the image, as the ELF reader reads.
struct Closure<F>(RefCell<F>);

impl<F: FnMut(u64, usize) -> Option<Vec<u8>>> ReadAt for Closure<F> {
    fn read_at(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        (self.0.borrow_mut())(offset, usize::try_from(len).ok()?)
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
