//! Encoding of pprof's protobuf profile (`profile.proto` of github.com/google/pprof), the
//! format of `go tool pprof`, Pyroscope, Parca and speedscope, for CPU profiles: sample types
//! `samples/count` and `cpu/nanoseconds` (`wall/nanoseconds` for wall-clock profiles).
//! Uncompressed; callers gzip it.
//!
//! [`Pprof::from_profile`] builds the message from a parsed [`Profile`], naming addresses with
//! whatever symboliser the caller has; the fields are public, so a caller can also fill in or
//! adjust a [`Pprof`] itself before [`Pprof::encode`] serialises it.
//!
//! Hand-written rather than generated: the encoder is a few varint and length-delimited
//! writes, and it keeps protobuf code generation (and its build dependencies) out of the
//! library that is preloaded into other programs.

use super::{Profile, StateKind};
use std::collections::HashMap;

/// A mapped object (`Mapping`).
#[derive(Clone, Debug, Default)]
pub struct Mapping {
    /// First address of the mapping in the profiled process.
    pub start: u64,
    /// Address just past the mapping (exclusive).
    pub limit: u64,
    /// Offset in `file` that `start` maps.
    pub file_offset: u64,
    /// Path of the mapped object, or a pseudo-name such as `[vdso]`.
    pub file: String,
    /// GNU build-id of the object, lower-case hex; empty if unknown.
    pub build_id: String,
}

/// One frame at a location, innermost inlined frame first in [`Location::frames`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name as the symbol table holds it (readers demangle C++ and Rust names).
    pub function: String,
    /// Source file; empty if unknown.
    pub file: String,
    /// Line in `file`; 0 if unknown.
    pub line: u64,
}

/// An address (`Location`), with its mapping and its frames; no frames leaves symbolisation
/// to the reader.
#[derive(Clone, Debug, Default)]
pub struct Location {
    /// Address in the profiled process.
    pub address: u64,
    /// Index into [`Pprof::mappings`] of the object holding the address, if known.
    pub mapping: Option<usize>,
    /// The functions at the address, innermost inlined frame first.
    pub frames: Vec<Frame>,
}

/// A call chain seen `count` times, with its labels (pprof's `Label`: a string or a number
/// per key).
#[derive(Clone, Debug)]
pub struct Sample {
    /// Indices into [`Pprof::locations`], leaf first.
    pub locations: Vec<usize>,
    /// Samples taken in this chain; the encoder also writes `count` times the period as the
    /// second value.
    pub count: u64,
    /// (key, value) pairs, such as `thread` and `state` for wall-clock samples.
    pub labels: Vec<(String, LabelValue)>,
}

/// The value of a sample's label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelValue {
    /// A string label (`Label.str`).
    Text(String),
    /// A numeric label (`Label.num`).
    Number(i64),
}

/// A CPU or wall-clock profile to encode, in pprof's terms.
///
/// ```
/// use cpuprof::format::pprof::{Frame, Pprof};
/// use cpuprof::format::{Profile, ProfileWriter, SlotFormat};
///
/// let mut writer = ProfileWriter::new(Vec::new(), SlotFormat::NATIVE, 10_000)?;
/// writer.write_record(3, &[0x401010, 0x401205])?; // leaf, then a return address in main
/// let bytes = writer.finish(b"00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n")?;
/// let profile = Profile::parse(&bytes)?;
///
/// let pprof = Pprof::from_profile(
///     &profile,
///     // Names each address, here from a made-up symbol table; no frames leaves it to the reader.
///     |addr| {
///         let function = if addr < 0x401200 { "leaf" } else { "main" };
///         vec![Frame { function: function.to_string(), ..Frame::default() }]
///     },
///     // The build-id of an object the profile recorded none for; empty if unknown.
///     |_path| String::new(),
/// );
/// assert_eq!(pprof.period_ns, 10_000_000);
/// assert_eq!(pprof.mappings[0].file, "/usr/bin/app");
/// assert_eq!(pprof.samples[0].count, 3);
/// // The return address is moved onto its call instruction, as pprof's own reader does.
/// let addresses: Vec<u64> = pprof.locations.iter().map(|l| l.address).collect();
/// assert_eq!(addresses, [0x401010, 0x401204]);
///
/// let message: Vec<u8> = pprof.encode(); // gzip it to write the usual `.pb.gz` file
/// assert_eq!(message[0], 0x0a); // field 1 (sample_type), length-delimited, comes first
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Pprof {
    /// The second sample type and the period's: `cpu` (the default when empty) or `wall`.
    pub kind: &'static str,
    /// Sampling period in nanoseconds.
    pub period_ns: u64,
    /// Start of the profile, nanoseconds since the epoch (0: unknown).
    pub time_ns: u64,
    /// How long the profile ran, in nanoseconds (0: unknown).
    pub duration_ns: u64,
    /// The executable mappings.
    pub mappings: Vec<Mapping>,
    /// Each distinct address of the samples.
    pub locations: Vec<Location>,
    /// The call chains and their counts.
    pub samples: Vec<Sample>,
    /// Free-form notes on the profile (`Profile.comment`; `go tool pprof -comments` prints
    /// them).
    pub comments: Vec<String>,
}

impl Pprof {
    /// A legacy profile in pprof's terms: one mapping per executable mapping (with the
    /// build-id the profile recorded for it, or else the one `build_id` gives for its path,
    /// empty if unknown), one location per distinct address, named by
    /// `frames` (innermost inlined frame first; empty to leave it to the reader). Return
    /// addresses are moved onto their call instruction (minus one), as pprof's own reader of
    /// raw profiles does, so both attribute them alike.
    ///
    /// `frames` is called once per distinct address, `build_id` once per executable mapping
    /// without a recorded build-id. `time_ns` and `duration_ns` are left 0 for the caller to
    /// fill in if it knows them. A profile's `# process` line becomes a comment
    /// (`process PID (parent PPID, started|forked): COMMAND LINE`). A wall-clock profile's
    /// samples get the labels `thread`,
    /// `thread_id`, `state` (`on-cpu`, `runnable`, `blocked`) and, when known, `syscall`.
    ///
    /// See [`Pprof`] for an example.
    pub fn from_profile(
        profile: &Profile,
        mut frames: impl FnMut(u64) -> Vec<Frame>,
        mut build_id: impl FnMut(&str) -> String,
    ) -> Pprof {
        let wall = !profile.maps.contexts.cpu_profile && profile.samples.iter().any(|s| s.context.is_some());
        let mut pprof = Pprof {
            kind: if wall { "wall" } else { "cpu" },
            period_ns: profile.period_us * 1000,
            ..Pprof::default()
        };
        if let Some(p) = &profile.maps.process {
            let origin = if p.forked { "forked" } else { "started" };
            pprof.comments.push(format!(
                "process {} (parent {}, {origin}): {}",
                p.pid,
                p.ppid,
                p.command_line()
            ));
        }
        let mut mapping_of_entry: HashMap<usize, usize> = HashMap::new();
        for (i, entry) in profile.maps.entries.iter().enumerate() {
            if entry.is_executable() {
                mapping_of_entry.insert(i, pprof.mappings.len());
                pprof.mappings.push(Mapping {
                    start: entry.start,
                    limit: entry.end,
                    file_offset: entry.offset,
                    file: entry.path.clone(),
                    build_id: entry.build_id.clone().unwrap_or_else(|| build_id(&entry.path)),
                });
            }
        }
        let mut location_of_addr: HashMap<u64, usize> = HashMap::new();
        for s in &profile.samples {
            let locations = s
                .pcs
                .iter()
                .enumerate()
                .map(|(i, &pc)| {
                    let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
                    *location_of_addr.entry(addr).or_insert_with(|| {
                        let mapping = profile
                            .maps
                            .entries
                            .iter()
                            .position(|e| e.contains(addr) && e.is_executable())
                            .and_then(|i| mapping_of_entry.get(&i).copied());
                        pprof.locations.push(Location {
                            address: addr,
                            mapping,
                            frames: frames(addr),
                        });
                        pprof.locations.len() - 1
                    })
                })
                .collect();
            let labels = match &s.context {
                Some(context) => {
                    let (state, syscall) = match context.kind() {
                        StateKind::OnCpu => ("on-cpu", None),
                        StateKind::Runnable => ("runnable", None),
                        StateKind::Blocked => ("blocked", context.syscall()),
                    };
                    let mut labels = vec![
                        (
                            "thread".to_string(),
                            LabelValue::Text(profile.maps.contexts.thread_label(context.tid)),
                        ),
                        ("thread_id".to_string(), LabelValue::Number(i64::from(context.tid))),
                    ];
                    // A CPU profile's samples are all on the CPU: its labels name threads only.
                    if wall {
                        labels.push(("state".to_string(), LabelValue::Text(state.to_string())));
                    }
                    if let Some(call) = syscall {
                        labels.push(("syscall".to_string(), LabelValue::Text(call.to_string())));
                    }
                    labels
                }
                None => Vec::new(),
            };
            pprof.samples.push(Sample {
                locations,
                count: s.count,
                labels,
            });
        }
        pprof
    }

    /// Serialises the profile as pprof's `Profile` message (uncompressed protobuf). Each
    /// sample has two values: its count, and its count times the period in nanoseconds.
    pub fn encode(&self) -> Vec<u8> {
        let mut strings = StringTable::default();
        let mut out = Vec::new();
        let (samples, count, cpu, nanoseconds) = (
            strings.id("samples"),
            strings.id("count"),
            strings.id(if self.kind.is_empty() { "cpu" } else { self.kind }),
            strings.id("nanoseconds"),
        );
        for (kind, unit) in [(samples, count), (cpu, nanoseconds)] {
            message(&mut out, 1, |m| {
                uint(m, 1, kind);
                uint(m, 2, unit);
            });
        }
        for s in &self.samples {
            message(&mut out, 2, |m| {
                packed(m, 1, s.locations.iter().map(|&l| l as u64 + 1));
                packed(m, 2, [s.count, s.count.saturating_mul(self.period_ns)].into_iter());
                for (name, value) in &s.labels {
                    let name = strings.id(name);
                    message(m, 3, |l| {
                        uint(l, 1, name);
                        match value {
                            LabelValue::Text(text) => uint(l, 2, strings.id(text)),
                            // Protobuf's int64 varint: two's complement as a u64.
                            LabelValue::Number(n) => uint(l, 3, *n as u64),
                        }
                    });
                }
            });
        }
        // What each mapping's locations hold (functions, files, lines, inlined frames), in
        // one pass over the locations: a pass per mapping took seconds for a crafted profile
        // with thousands of mappings.
        let mut flags = vec![[false; 4]; self.mappings.len()];
        for location in &self.locations {
            let Some(f) = location.mapping.and_then(|i| flags.get_mut(i)) else {
                continue;
            };
            f[0] |= !location.frames.is_empty();
            f[1] |= location.frames.iter().any(|f| !f.file.is_empty());
            f[2] |= location.frames.iter().any(|f| f.line != 0);
            f[3] |= location.frames.len() > 1;
        }
        for (i, mapping) in self.mappings.iter().enumerate() {
            let (file, build_id) = (strings.id(&mapping.file), strings.id(&mapping.build_id));
            let [has_functions, has_files, has_lines, has_inlines] = flags[i];
            message(&mut out, 3, |m| {
                uint(m, 1, i as u64 + 1);
                uint(m, 2, mapping.start);
                uint(m, 3, mapping.limit);
                uint(m, 4, mapping.file_offset);
                uint(m, 5, file);
                uint(m, 6, build_id);
                for (field, flag) in [(7, has_functions), (8, has_files), (9, has_lines), (10, has_inlines)] {
                    uint(m, field, flag as u64);
                }
            });
        }
        let mut functions: HashMap<(String, String), u64> = HashMap::new();
        let mut function_list = Vec::new();
        for (i, location) in self.locations.iter().enumerate() {
            let lines: Vec<(u64, u64)> = location
                .frames
                .iter()
                .map(|f| {
                    let next = functions.len() as u64 + 1;
                    let id = *functions
                        .entry((f.function.clone(), f.file.clone()))
                        .or_insert_with(|| {
                            function_list.push((next, strings.id(&f.function), strings.id(&f.file)));
                            next
                        });
                    (id, f.line)
                })
                .collect();
            message(&mut out, 4, |m| {
                uint(m, 1, i as u64 + 1);
                uint(m, 2, location.mapping.map_or(0, |x| x as u64 + 1));
                uint(m, 3, location.address);
                for (function, line) in &lines {
                    message(m, 4, |l| {
                        uint(l, 1, *function);
                        uint(l, 2, *line);
                    });
                }
            });
        }
        for (id, name, file) in function_list {
            message(&mut out, 5, |m| {
                uint(m, 1, id);
                uint(m, 2, name);
                uint(m, 3, name);
                uint(m, 4, file);
            });
        }
        let comments: Vec<u64> = self.comments.iter().map(|c| strings.id(c)).collect();
        for s in &strings.list {
            key(&mut out, 6, 2);
            varint(&mut out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        uint(&mut out, 9, self.time_ns);
        uint(&mut out, 10, self.duration_ns);
        message(&mut out, 11, |m| {
            uint(m, 1, cpu);
            uint(m, 2, nanoseconds);
        });
        uint(&mut out, 12, self.period_ns);
        for comment in comments {
            key(&mut out, 13, 0);
            varint(&mut out, comment);
        }
        out
    }
}

/// pprof's string table: index 0 is the empty string.
struct StringTable {
    list: Vec<String>,
    index: HashMap<String, u64>,
}

impl Default for StringTable {
    fn default() -> Self {
        StringTable {
            list: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }
}

impl StringTable {
    fn id(&mut self, s: &str) -> u64 {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = self.list.len() as u64;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), id);
        id
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

/// A varint field, omitted when zero (the proto3 default).
fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        key(out, field, 0);
        varint(out, v);
    }
}

fn packed(out: &mut Vec<u8>, field: u32, values: impl Iterator<Item = u64>) {
    let mut body = Vec::new();
    values.for_each(|v| varint(&mut body, v));
    key(out, field, 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

fn message(out: &mut Vec<u8>, field: u32, fill: impl FnOnce(&mut Vec<u8>)) {
    let mut body = Vec::new();
    fill(&mut body);
    key(out, field, 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads (field, wire type, value or bytes) triples of one message level.
    fn fields(mut b: &[u8]) -> Vec<(u64, Result<u64, Vec<u8>>)> {
        fn read_varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let k = read_varint(&mut b);
            match k & 7 {
                0 => out.push((k >> 3, Ok(read_varint(&mut b)))),
                2 => {
                    let n = read_varint(&mut b) as usize;
                    out.push((k >> 3, Err(b[..n].to_vec())));
                    b = &b[n..];
                }
                t => panic!("wire type {t}"),
            }
        }
        out
    }

    #[test]
    fn recorded_build_ids_are_preferred_to_the_files() {
        let mut w = crate::format::ProfileWriter::new(Vec::new(), crate::format::SlotFormat::LE64, 10_000).unwrap();
        w.write_record(1, &[0x1010, 0x3010]).unwrap();
        let maps = b"1000-2000 r-xp 00000000 08:01 5 /bin/app\n3000-4000 r-xp 00000000 08:01 6 /lib/x.so\n\
            # build-id 1000-2000 aabbcc\n";
        let profile = Profile::parse(&w.finish(maps).unwrap()).unwrap();
        let mut asked = Vec::new();
        let pprof = Pprof::from_profile(
            &profile,
            |_| Vec::new(),
            |path| {
                asked.push(path.to_string());
                "from-file".to_string()
            },
        );
        let ids: Vec<&str> = pprof.mappings.iter().map(|m| m.build_id.as_str()).collect();
        assert_eq!(ids, ["aabbcc", "from-file"]);
        assert_eq!(asked, ["/lib/x.so"], "the file is read only where nothing was recorded");
    }

    #[test]
    fn the_process_line_is_a_comment() {
        let mut w = crate::format::ProfileWriter::new(Vec::new(), crate::format::SlotFormat::LE64, 10_000).unwrap();
        w.write_record(1, &[0x1010]).unwrap();
        let maps = b"1000-2000 r-xp 00000000 08:01 5 /bin/app\n# process 42 7 forked /bin/app --x%3Dy a%20b\n";
        let profile = Profile::parse(&w.finish(maps).unwrap()).unwrap();
        let pprof = Pprof::from_profile(&profile, |_| Vec::new(), |_| String::new());
        let comment = r#"process 42 (parent 7, forked): /bin/app --x=y "a b""#;
        assert_eq!(pprof.comments, [comment]);
        let top = fields(&pprof.encode());
        let strings: Vec<Vec<u8>> = top
            .iter()
            .filter(|(f, _)| *f == 6)
            .map(|(_, v)| v.clone().unwrap_err())
            .collect();
        let ids: Vec<u64> = top
            .iter()
            .filter(|(f, _)| *f == 13)
            .map(|(_, v)| *v.as_ref().unwrap())
            .collect();
        assert_eq!(ids.len(), 1);
        assert_eq!(strings[ids[0] as usize], comment.as_bytes());
    }

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }

    #[test]
    fn encodes_samples_locations_functions_and_strings() {
        let frame = |f: &str| Frame {
            function: f.into(),
            file: "a.c".into(),
            line: 7,
        };
        let p = Pprof {
            period_ns: 10_000_000,
            mappings: vec![Mapping {
                start: 0x1000,
                limit: 0x2000,
                file: "/bin/a".into(),
                ..Default::default()
            }],
            locations: vec![
                Location {
                    address: 0x1010,
                    mapping: Some(0),
                    frames: vec![frame("inlined"), frame("leaf")],
                },
                Location {
                    address: 0x1100,
                    mapping: Some(0),
                    frames: vec![frame("main")],
                },
            ],
            samples: vec![Sample {
                locations: vec![0, 1],
                count: 3,
                labels: Vec::new(),
            }],
            ..Default::default()
        };
        let top = fields(&p.encode());
        let strings: Vec<String> = top
            .iter()
            .filter(|(f, _)| *f == 6)
            .map(|(_, v)| String::from_utf8(v.clone().unwrap_err()).unwrap())
            .collect();
        assert_eq!(strings[0], "");
        for s in [
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "/bin/a",
            "inlined",
            "leaf",
            "main",
            "a.c",
        ] {
            assert!(strings.contains(&s.to_string()), "{s}");
        }
        let sample = top.iter().find(|(f, _)| *f == 2).unwrap().1.clone().unwrap_err();
        let sample = fields(&sample);
        assert_eq!(sample[0], (1, Err(vec![1, 2])));
        assert_eq!(sample[1].1.clone().unwrap_err(), {
            let mut v = vec![3];
            varint(&mut v, 30_000_000);
            v
        });
        let locations: Vec<_> = top.iter().filter(|(f, _)| *f == 4).collect();
        assert_eq!(locations.len(), 2);
        let first = fields(locations[0].1.as_ref().unwrap_err());
        assert_eq!(first.iter().filter(|(f, _)| *f == 4).count(), 2, "two inlined lines");
        assert_eq!(top.iter().filter(|(f, _)| *f == 5).count(), 3, "three functions");
        assert!(top.contains(&(12, Ok(10_000_000))));
    }
}
