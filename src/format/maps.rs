//! The text list of mapped objects that ends a profile (the process's `/proc/self/maps`), and
//! the annotations cpuprof adds after it: which object an address was in, at which file
//! offset, and with which build-id.

use super::build_id;
use super::event::EventLine;
use super::process::ProcessLine;
use super::sample_context::SampleContexts;
use super::sample_labels::SampleLabels;
use super::signal_weights::SignalWeights;
use super::wall_looks::WallLooks;
use std::collections::HashMap;

/// One mapping line: `start-end perms offset dev inode path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// First address of the mapping.
    pub start: u64,
    /// Address just past the mapping (exclusive).
    pub end: u64,
    /// Four characters such as `r-xp`.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    /// Inode of the mapped file when the profile was taken (0 when anonymous or not given);
    /// readers compare it with the file now at `path` to notice a rebuilt binary.
    pub inode: u64,
    /// Path or pseudo-name (`[vdso]`, `[stack]`); empty for anonymous mappings.
    pub path: String,
    /// GNU build-id (hex) of the mapped object as the profiler read it from the process,
    /// from a `# build-id` line (see [`super::build_id`]); `None` when not recorded.
    pub build_id: Option<String>,
}

impl MapEntry {
    /// Whether the mapping was executable (`x` in its permissions): only those hold code that
    /// samples can land in.
    pub fn is_executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// Whether `addr` lies in `start..end`.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// All mapping lines of a profile, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Maps {
    /// The mapping lines, in file order.
    pub entries: Vec<MapEntry>,
    /// The signals behind the samples, from a `# signal-weights` line; `None` when not recorded.
    pub signal_weights: Option<SignalWeights>,
    /// The process that wrote the profile, from a `# process` line; `None` when not recorded
    /// (gperftools' profiles, cpuprof's before the line, `merge` of different processes).
    pub process: Option<ProcessLine>,
    /// Wall-clock profiles: the sampler's looks at threads and those missing, from a
    /// `# wall-looks` line; `None` when not recorded.
    pub wall_looks: Option<WallLooks>,
    /// Wall-clock profiles: each record's thread and state, and the threads' names.
    pub contexts: SampleContexts,
    /// The label sets of labelled records (`super::sample_labels`).
    pub labels: SampleLabels,
    /// Event profiles: the event the samples count and the events per sample, from an
    /// `# event` line; `None` for CPU-time profiles.
    pub event: Option<EventLine>,
}

impl Maps {
    /// Parses the text section. Unrecognised lines are skipped, as the format requires;
    /// `$build` in paths is replaced by the path of the last `build=` line; a `# build-id`
    /// line gives its build-id to the mapping with its address range; a `# signal-weights`
    /// line gives the profile's signal weights; a `# process` line the process that wrote it;
    /// a `# wall-looks` line the looks a wall-clock profile is missing; `# context` and
    /// `# thread` lines give the records' contexts, `# labelset` and `# labels` lines their
    /// labels.
    ///
    /// Never fails: text that is not UTF-8 is read lossily, and anything unrecognisable is
    /// skipped.
    ///
    /// # Example
    ///
    /// ```
    /// use cpuprof::format::Maps;
    ///
    /// let text = b"00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/app\n\
    ///     00651000-00652000 rw-p 00051000 08:02 173521 /usr/bin/app\n\
    ///     7ffc1000-7ffc2000 rw-p 00000000 00:00 0 [stack]\n\
    ///     ## build-id 400000-452000 4f536ac1cd2e8806\n";
    /// let maps = Maps::parse(text);
    /// assert_eq!(maps.entries.len(), 3);
    ///
    /// let code = maps.find(0x401234).unwrap();
    /// assert!(code.is_executable());
    /// assert_eq!((code.path.as_str(), code.inode), ("/usr/bin/app", 173521));
    /// assert_eq!(code.build_id.as_deref(), Some("4f536ac1cd2e8806"));
    /// assert!(maps.find(0x10).is_none());
    /// ```
    pub fn parse(text: &[u8]) -> Maps {
        let text = String::from_utf8_lossy(text);
        let mut build: Option<String> = None;
        let mut entries = Vec::new();
        let mut build_ids = HashMap::new();
        let mut signal_weights = None;
        let mut process = None;
        let mut wall_looks = None;
        let mut contexts = SampleContexts::default();
        let mut labels = SampleLabels::default();
        let mut event = None;
        for line in text.lines() {
            if let Some(path) = line.trim_start().strip_prefix("build=") {
                build = Some(path.trim().to_string());
                continue;
            }
            if let Some((start, end, id)) = build_id::parse_line(line) {
                build_ids.entry((start, end)).or_insert(id);
                continue;
            }
            if let Some(weights) = SignalWeights::parse_line(line) {
                signal_weights = signal_weights.or(Some(weights));
                continue;
            }
            if let Some(line) = ProcessLine::parse_line(line) {
                process = process.or(Some(line));
                continue;
            }
            if let Some(looks) = WallLooks::parse_line(line) {
                wall_looks = wall_looks.or(Some(looks));
                continue;
            }
            if let Some(line) = EventLine::parse_line(line) {
                event = event.or(Some(line));
                continue;
            }
            if contexts.parse_line(line) || labels.parse_line(line) {
                continue;
            }
            if let Some(mut entry) = parse_line(line) {
                if let Some(b) = &build {
                    entry.path = substitute_build(&entry.path, b);
                }
                entries.push(entry);
            }
        }
        if !build_ids.is_empty() {
            for e in entries.iter_mut().filter(|e| e.is_executable()) {
                e.build_id = build_ids.get(&(e.start, e.end)).cloned();
            }
        }
        contexts.finish();
        labels.finish();
        Maps {
            entries,
            signal_weights,
            process,
            wall_looks,
            contexts,
            labels,
            event,
        }
    }

    /// The mapping that contains `addr`, preferring executable ones; `None` if no mapping
    /// does.
    pub fn find(&self, addr: u64) -> Option<&MapEntry> {
        self.entries
            .iter()
            .filter(|e| e.contains(addr))
            .max_by_key(|e| e.is_executable())
    }
}

fn parse_line(line: &str) -> Option<MapEntry> {
    let mut fields = line.splitn(6, [' ', '\t']).filter(|f| !f.is_empty());
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 || end < start {
        return None;
    }
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _dev = fields.next()?;
    let inode = fields.next().and_then(|i| i.parse().ok()).unwrap_or(0);
    // The path is everything after the inode, leading blanks removed (paths may hold spaces).
    let rest = line[line.find(range)? + range.len()..].trim_start();
    let after_inode = rest.splitn(5, [' ', '\t']).nth(4).unwrap_or("");
    Some(MapEntry {
        start,
        end,
        perms: perms.to_string(),
        offset,
        inode,
        path: after_inode.trim().to_string(),
        build_id: None,
    })
}

/// Longest path a substitution may produce: Linux's PATH_MAX. A crafted file could otherwise
/// repeat `$build` thousands of times after a long `build=` line and turn a few hundred KiB
/// into gigabytes of path text; a longer path could not be opened anyway.
const MAX_PATH: usize = 4096;

/// Replaces `$build` followed by a non-word character (or the end) with `build`; the path is
/// left as it is if the result would be longer than [`MAX_PATH`].
fn substitute_build(path: &str, build: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(i) = rest.find("$build") {
        let after = &rest[i + 6..];
        let is_word = after.chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if is_word { "$build" } else { build });
        if out.len() > MAX_PATH {
            return path.to_string();
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_and_gperftools_lines() {
        let text = b"55d4a2c00000-55d4a2c02000 r-xp 00001000 fd:01 1234                       /usr/bin/my prog\n\
            7ffc1000-7ffc2000 rw-p 00000000 00:00 0 [stack]\n\
            7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n\
            garbage line\n";
        let maps = Maps::parse(text);
        assert_eq!(maps.entries.len(), 3);
        let e = &maps.entries[0];
        assert_eq!((e.start, e.end, e.offset), (0x55d4a2c00000, 0x55d4a2c02000, 0x1000));
        assert_eq!(e.path, "/usr/bin/my prog");
        assert_eq!(e.inode, 1234);
        assert!(e.is_executable());
        assert_eq!(maps.entries[1].path, "[stack]");
        assert_eq!(maps.entries[2].path, "");
        assert_eq!(maps.find(0x55d4a2c00010).unwrap().path, "/usr/bin/my prog");
        assert!(maps.find(0x10).is_none());
    }

    #[test]
    fn build_id_lines_name_executable_mappings_by_range() {
        let text = b"1000-2000 r--p 00000000 08:01 5 /bin/app\n2000-3000 r-xp 00001000 08:01 5 /bin/app\n\
            4000-5000 r-xp 00000000 08:01 6 /lib/x.so\n\
            # build-id 2000-3000 AbCd01\n# build-id 1000-2000 ffff\n# build-id 4000-5001 eeee\n";
        let maps = Maps::parse(text);
        assert_eq!(maps.entries.len(), 3, "build-id lines are not mappings");
        assert_eq!(maps.entries[1].build_id.as_deref(), Some("abcd01"));
        assert_eq!(maps.entries[0].build_id, None, "only executable mappings carry one");
        assert_eq!(maps.entries[2].build_id, None, "the range must match exactly");
    }

    #[test]
    fn build_specifier_replaces_build_variable() {
        let text = b"  build=/opt/app\n40000000-40015000 r-xp 00000000 03:01 1 $build/bin/app\n\
            40015000-40016000 r-xp 00000000 03:01 1 $builder/x\n";
        let maps = Maps::parse(text);
        assert_eq!(maps.entries[0].path, "/opt/app/bin/app");
        assert_eq!(maps.entries[1].path, "$builder/x");
    }

    #[test]
    fn build_substitution_cannot_blow_up() {
        let mut text = format!(
            "build=/{}\n40000000-40015000 r-xp 00000000 03:01 1 ",
            "a".repeat(100_000)
        );
        text.push_str(&"$build/".repeat(10_000));
        let maps = Maps::parse(text.as_bytes());
        assert_eq!(maps.entries[0].path, "$build/".repeat(10_000));
    }
}
