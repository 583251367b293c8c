//! Mappings of code that was unloaded before the profile stopped, and the build-ids of the
//! code that ran.
//!
//! The maps section is read at stop, so a library loaded with `dlopen` and unloaded with
//! `dlclose` while profiling would leave its samples as bare addresses (a known gperftools
//! complaint). The writer thread records the executable mapping lines it sees whenever the
//! set of loaded objects changes; at stop, lines no longer in `/proc/self/maps` are appended.
//!
//! At the same moments it reads the GNU build-id of each executable object from the process's
//! own memory: the loaded ELF image's header, program headers and notes, copied through the
//! `/proc/self/mem` descriptor (`unwind::safe_read`), so a library unmapped meanwhile by another
//! thread yields an error, never a fault. Memory rather than the file at the path: the file may
//! have been rebuilt or replaced since it was loaded (the very case the build-id is for), and
//! an unloaded library's file may be gone; memory is what ran. Each mapping is read once
//! (four `pread`s of at most a few hundred bytes: 15 us per object measured here), on the
//! writer thread, never in signal context. The ids follow the maps text as `# build-id`
//! lines (`format::build_id`).

use crate::format::{build_id, MapEntry, Maps};
use crate::unwind::safe_read::copy_bytes;
use std::collections::HashMap;

#[derive(Clone, Default)]
pub struct SeenMappings {
    lines: Vec<String>,
    /// Build-ids by executable mapping line (`None`: the object has none or was unreadable).
    build_ids: HashMap<String, Option<String>>,
}

impl SeenMappings {
    /// Remembers the executable, file-backed lines of `maps_text`.
    pub fn record(&mut self, maps_text: &[u8]) {
        for (line, _) in code_lines(&String::from_utf8_lossy(maps_text)) {
            if !self.lines.iter().any(|l| l == line) {
                self.lines.push(line.to_string());
            }
        }
    }

    /// Reads the build-id of each executable, file-backed mapping of `maps_text` (the current
    /// `/proc/self/maps`) not read before, from this process's memory.
    pub fn read_build_ids(&mut self, maps_text: &[u8]) {
        let text = String::from_utf8_lossy(maps_text);
        let new: Vec<_> = code_lines(&text)
            .filter(|(line, _)| !self.build_ids.contains_key(*line))
            .collect();
        if new.is_empty() {
            return;
        }
        let entries = Maps::parse(text.as_bytes()).entries;
        for (line, entry) in new {
            let id = image_reader(&entries, &entry).and_then(|read| build_id::read_elf(read, false));
            self.build_ids.insert(line.to_string(), id);
        }
    }

    /// `current` followed by the remembered lines it no longer contains, then a `# build-id`
    /// line for each of these mappings whose build-id was read.
    pub fn complete(&self, current: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(current);
        let present: std::collections::HashSet<&str> = text.lines().collect();
        let mut out = current.to_vec();
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        for line in self.lines.iter().filter(|l| !present.contains(l.as_str())) {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        let mut ids = String::new();
        for (line, entry) in code_lines(&String::from_utf8_lossy(&out)) {
            if let Some(Some(id)) = self.build_ids.get(line) {
                ids.push_str(&build_id::line(entry.start, entry.end, id));
            }
        }
        out.extend_from_slice(ids.as_bytes());
        out
    }
}

/// The executable, file-backed mapping lines of `text`, parsed.
fn code_lines(text: &str) -> impl Iterator<Item = (&str, MapEntry)> {
    text.lines().filter_map(|line| {
        let entry = Maps::parse(line.as_bytes()).entries.pop()?;
        (entry.is_executable() && entry.path.starts_with('/')).then_some((line, entry))
    })
}

/// Reads bytes of the object mapped by `code` by file offset, from this process's memory:
/// through the mapping of the same file (path and inode) that holds the offset, among those
/// from the object's header mapping (offset 0, at or below `code`) up to the next one (the same
/// file may be mapped twice).
fn image_reader(entries: &[MapEntry], code: &MapEntry) -> Option<impl FnMut(u64, usize) -> Option<Vec<u8>>> {
    let same_file = |m: &&MapEntry| m.path == code.path && m.inode == code.inode;
    let headers = || entries.iter().filter(same_file).filter(|m| m.offset == 0);
    let base = headers().map(|m| m.start).filter(|&s| s <= code.start).max()?;
    let next = headers()
        .map(|m| m.start)
        .filter(|&s| s > base)
        .min()
        .unwrap_or(u64::MAX);
    let object: Vec<(u64, u64, u64)> = entries
        .iter()
        .filter(same_file)
        .filter(|m| (base..next).contains(&m.start))
        .map(|m| (m.start, m.end - m.start, m.offset))
        .collect();
    Some(move |offset: u64, len: usize| {
        let end = offset.checked_add(len as u64)?;
        let &(start, _, at) = object
            .iter()
            .find(|&&(_, size, at)| at <= offset && end <= at.saturating_add(size))?;
        let mut buf = vec![0; len];
        (copy_bytes(start + (offset - at), &mut buf) == len).then_some(buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unloaded_code_mappings_are_appended_once() {
        let mut seen = SeenMappings::default();
        let before = b"1000-2000 r-xp 00000000 08:01 5 /bin/app\n3000-4000 r-xp 00001000 08:01 6 /lib/plugin.so\n5000-6000 rw-p 00000000 00:00 0\n";
        seen.record(before);
        seen.record(before);
        let after = b"1000-2000 r-xp 00000000 08:01 5 /bin/app\n";
        let text = String::from_utf8(seen.complete(after)).unwrap();
        assert_eq!(
            text,
            "1000-2000 r-xp 00000000 08:01 5 /bin/app\n3000-4000 r-xp 00001000 08:01 6 /lib/plugin.so\n"
        );
    }

    #[test]
    fn build_ids_of_this_process_are_read_from_memory_and_follow_the_maps() {
        let _descriptor = crate::unwind::safe_read::for_tests();
        let maps = crate::in_program::procfs::read_self_maps();
        let mut seen = SeenMappings::default();
        seen.read_build_ids(&maps);
        let text = String::from_utf8(seen.complete(&maps)).unwrap();
        assert!(
            text.starts_with(std::str::from_utf8(&maps).unwrap()),
            "the maps text is kept as it is"
        );
        let parsed = Maps::parse(text.as_bytes());
        let exe = std::env::current_exe().unwrap();
        let exe_data = std::fs::read(&exe).unwrap();
        let on_disk = build_id::read_elf(
            |offset, len| {
                let start = usize::try_from(offset).ok()?;
                exe_data.get(start..start + len).map(<[u8]>::to_vec)
            },
            false,
        );
        let exe = exe.to_str().unwrap();
        let recorded: Vec<_> = parsed
            .entries
            .iter()
            .filter(|e| e.path == exe && e.is_executable())
            .map(|e| e.build_id.clone())
            .collect();
        assert_eq!(recorded, vec![on_disk.clone()], "{text}");
        assert!(on_disk.is_some());
        let libc_ids = parsed
            .entries
            .iter()
            .filter(|e| e.path.contains("libc.so") && e.build_id.is_some())
            .count();
        assert_eq!(libc_ids, 1, "{text}");
    }
}
