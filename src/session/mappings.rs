//! Mappings of code that was unloaded before the profile stopped.
//!
//! The maps section is read at stop, so a library loaded with `dlopen` and unloaded with
//! `dlclose` while profiling would leave its samples as bare addresses (a known gperftools
//! complaint). The writer thread records the executable mapping lines it sees whenever the
//! set of loaded objects changes; at stop, lines no longer in `/proc/self/maps` are appended.

use crate::format::Maps;

#[derive(Default)]
pub struct SeenMappings {
    lines: Vec<String>,
}

impl SeenMappings {
    /// Remembers the executable, file-backed lines of `maps_text`.
    pub fn record(&mut self, maps_text: &[u8]) {
        for line in String::from_utf8_lossy(maps_text).lines() {
            let executable_file = Maps::parse(line.as_bytes())
                .entries
                .first()
                .is_some_and(|e| e.is_executable() && e.path.starts_with('/'));
            if executable_file && !self.lines.iter().any(|l| l == line) {
                self.lines.push(line.to_string());
            }
        }
    }

    /// `current` followed by the remembered lines it no longer contains.
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
        out
    }
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
}
