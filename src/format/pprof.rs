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

use super::{Interner, Labels, Maps, Profile, ReadContext, SampleContexts, StateKind};
use std::collections::HashMap;
use std::io::{self, Write};

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
    /// second value. Unused when [`Sample::values`] is given.
    pub count: u64,
    /// The sample's values, one per [`Pprof::values`] type, for profiles other than CPU and
    /// wall-clock ones (heap); empty for those.
    pub values: Vec<u64>,
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
    /// The second sample type and the period's: `cpu` (the default when empty) or `wall`, or
    /// an event profile's event (`page-faults`); for a profile with its own
    /// [`Pprof::values`], the period's type (`space` for heap profiles).
    pub kind: String,
    /// The unit of the second sample type and the period: `nanoseconds` when empty, `count`
    /// for an event profile.
    pub unit: &'static str,
    /// Sampling period in nanoseconds; in events for an event profile; for a profile with its
    /// own [`Pprof::values`], in the unit of its last value type (bytes for heap profiles).
    pub period_ns: u64,
    /// The sample types (type, unit) of a profile that is neither CPU nor wall-clock, whose
    /// samples carry [`Sample::values`]; the last is the readers' default. Empty for CPU and
    /// wall-clock profiles (`samples/count` and `cpu|wall/nanoseconds`).
    pub values: Vec<(&'static str, &'static str)>,
    /// The type readers show unless told otherwise (`default_sample_type`); empty: the last.
    pub default_value: &'static str,
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
        let (kind, unit, period) = second_type(&profile.maps, wall, profile.period_us);
        let mut pprof = Pprof {
            kind: kind.to_string(),
            unit,
            period_ns: period,
            ..Pprof::default()
        };
        pprof.comments.extend(process_comment(&profile.maps));
        pprof.comments.extend(event_comment(&profile.maps));
        let mut index = LocationIndex::new(&mut pprof, &profile.maps, &mut build_id);
        for s in &profile.samples {
            let locations = index.chain(&mut pprof, &s.pcs, true, &mut frames);
            let labels = labels(s.context.as_ref(), s.labels.as_ref(), &profile.maps.contexts, wall);
            pprof.samples.push(Sample {
                locations,
                count: s.count,
                values: Vec::new(),
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
        let kind = if self.kind.is_empty() { "cpu" } else { &self.kind };
        let kind_unit = if self.values.is_empty() {
            let unit = if self.unit.is_empty() { "nanoseconds" } else { self.unit };
            head_of_message(&mut out, &mut strings, &[("samples", "count"), (kind, unit)]);
            (strings.id(kind), strings.id(unit))
        } else {
            head_of_message(&mut out, &mut strings, &self.values);
            let unit = match self.unit {
                "" => self.values.last().map_or("count", |&(_, unit)| unit),
                unit => unit,
            };
            (strings.id(kind), strings.id(unit))
        };
        let mut ids = Vec::new();
        let mut values = Vec::new();
        for s in &self.samples {
            ids.clear();
            ids.extend(s.locations.iter().map(|&l| l as u64 + 1));
            values.clear();
            if self.values.is_empty() {
                values.extend([s.count, s.count.saturating_mul(self.period_ns)]);
            } else {
                values.extend(s.values.iter().copied());
            }
            sample_message(&mut out, &mut strings, &ids, &values, &s.labels);
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
        mappings_message(&mut out, &mut strings, &self.mappings, &flags);
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
            let mapping = location.mapping.map_or(0, |x| x as u64 + 1);
            location_message(&mut out, i, mapping, location.address, &lines);
        }
        let default_value = if self.default_value.is_empty() {
            0
        } else {
            strings.id(self.default_value)
        };
        tail_of_message(
            &mut out,
            &mut strings,
            &function_list,
            &self.comments,
            (self.time_ns, self.duration_ns),
            (kind_unit, default_value),
            self.period_ns,
        );
        out
    }
}

/// A pprof message written as it is made, for profiles too large to hold as a [`Pprof`]: the
/// same bytes as [`Pprof::from_profile`] then [`Pprof::encode`] of a profile whose distinct
/// samples are handed over one by one, in the profile's order, by [`PprofWriter::sample`].
/// Each sample is written at once; what is kept is one entry per distinct address (its
/// mapping and frames, the frames' names once each), and the string table.
pub struct PprofWriter<'m, W: Write> {
    out: W,
    maps: &'m Maps,
    wall: bool,
    period_ns: u64,
    comments: Vec<String>,
    strings: StringTable,
    /// The string ids of the two value types' second kind and unit.
    kind_unit: (u64, u64),
    mappings: Vec<Mapping>,
    mapping_of_entry: HashMap<usize, usize>,
    /// Each location: its address, its mapping (plus one; 0 for none) and where its frames
    /// end in `frames`.
    locations: Vec<(u64, u32, usize)>,
    /// Open-addressing index of `locations` by address, at most half full (`u32::MAX` empty).
    location_slots: Vec<u32>,
    /// Every location's frames, one after another: function and file (ids in `names`) and line.
    frames: Vec<(u32, u32, u64)>,
    /// Frame names, each kept once.
    names: Interner,
    /// Scratch space for one message.
    message: Vec<u8>,
    ids: Vec<u64>,
}

impl<'m, W: Write> PprofWriter<'m, W> {
    /// Starts the message for a profile of period `period_us` with `maps` (whose mappings and
    /// `# process` line it takes, as [`Pprof::from_profile`] does, `build_id` naming the
    /// build-ids not recorded). `wall`: whether it is a wall-clock profile whose samples carry
    /// contexts (`!maps.contexts.cpu_profile` and some sample has a context).
    ///
    /// # Errors
    ///
    /// Those of writing to `out`.
    pub fn new(
        mut out: W,
        maps: &'m Maps,
        period_us: u64,
        wall: bool,
        mut build_id: impl FnMut(&str) -> String,
    ) -> io::Result<Self> {
        let (mappings, mapping_of_entry) = mappings_of(maps, &mut build_id);
        let mut strings = StringTable::default();
        let mut message = Vec::new();
        let (kind, unit, period) = second_type(maps, wall, period_us);
        head_of_message(&mut message, &mut strings, &[("samples", "count"), (kind, unit)]);
        let kind_unit = (strings.id(kind), strings.id(unit));
        out.write_all(&message)?;
        Ok(PprofWriter {
            out,
            maps,
            wall,
            period_ns: period,
            comments: process_comment(maps).into_iter().chain(event_comment(maps)).collect(),
            strings,
            kind_unit,
            mappings,
            mapping_of_entry,
            locations: Vec::new(),
            location_slots: Vec::new(),
            frames: Vec::new(),
            names: Interner::default(),
            message: Vec::new(),
            ids: Vec::new(),
        })
    }

    /// The location of `addr`, added (named by `frames`) if new.
    fn location(&mut self, addr: u64, frames: &mut impl FnMut(u64) -> Vec<Frame>) -> usize {
        if 2 * (self.locations.len() + 1) > self.location_slots.len() {
            let len = (2 * self.location_slots.len()).max(1024);
            self.location_slots = vec![u32::MAX; len];
            for i in 0..self.locations.len() {
                let at = self.slot(self.locations[i].0);
                self.location_slots[at] = i as u32;
            }
        }
        let at = self.slot(addr);
        if self.location_slots[at] != u32::MAX {
            return self.location_slots[at] as usize;
        }
        let mapping = mapping_at(self.maps, &self.mapping_of_entry, addr);
        for f in frames(addr) {
            let (function, file) = (self.names.id(&f.function), self.names.id(&f.file));
            self.frames.push((function, file, f.line));
        }
        let i = self.locations.len();
        self.location_slots[at] = i as u32;
        self.locations
            .push((addr, mapping.map_or(0, |m| m as u32 + 1), self.frames.len()));
        i
    }

    fn slot(&self, addr: u64) -> usize {
        let mask = self.location_slots.len() - 1;
        // Fibonacci hashing: addresses are mostly aligned and close together.
        let mut at = (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask;
        loop {
            match self.location_slots[at] {
                u32::MAX => return at,
                i if self.locations[i as usize].0 == addr => return at,
                _ => at = (at + 1) & mask,
            }
        }
    }

    /// Writes the next distinct sample: its chain (`pcs`, interrupted PC first), its count and
    /// its context, new addresses named by `frames` (called once per distinct address).
    ///
    /// # Errors
    ///
    /// Those of writing to `out`.
    pub fn sample(
        &mut self,
        pcs: &[u64],
        count: u64,
        context: Option<&ReadContext>,
        sample_labels: Option<&Labels>,
        mut frames: impl FnMut(u64) -> Vec<Frame>,
    ) -> io::Result<()> {
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for (i, &pc) in pcs.iter().enumerate() {
            let addr = if i == 0 { pc } else { pc.saturating_sub(1) };
            ids.push(self.location(addr, &mut frames) as u64 + 1);
        }
        let labels = labels(context, sample_labels, &self.maps.contexts, self.wall);
        self.message.clear();
        sample_message(
            &mut self.message,
            &mut self.strings,
            &ids,
            &[count, count.saturating_mul(self.period_ns)],
            &labels,
        );
        self.ids = ids;
        self.out.write_all(&self.message)
    }

    /// Writes the rest of the message (mappings, locations, functions, strings, period) and
    /// returns `out`.
    ///
    /// # Errors
    ///
    /// Those of writing to `out`.
    pub fn finish(mut self) -> io::Result<W> {
        let mut flags = vec![[false; 4]; self.mappings.len()];
        let empty = self.names.id("");
        let mut start = 0;
        for &(_, mapping, end) in &self.locations {
            let frames = &self.frames[start..end];
            start = end;
            let Some(f) = mapping.checked_sub(1).and_then(|i| flags.get_mut(i as usize)) else {
                continue;
            };
            f[0] |= !frames.is_empty();
            f[1] |= frames.iter().any(|f| f.1 != empty);
            f[2] |= frames.iter().any(|f| f.2 != 0);
            f[3] |= frames.len() > 1;
        }
        let mut out = Vec::new();
        mappings_message(&mut out, &mut self.strings, &self.mappings, &flags);
        self.out.write_all(&out)?;
        // Functions by (name, file) ids, numbered as they are first met.
        let mut functions: HashMap<(u32, u32), u64> = HashMap::new();
        let mut function_list = Vec::new();
        let mut start = 0;
        let mut lines = Vec::new();
        for (i, &(address, mapping, end)) in self.locations.iter().enumerate() {
            lines.clear();
            for &(function, file, line) in &self.frames[start..end] {
                let next = functions.len() as u64 + 1;
                let id = *functions.entry((function, file)).or_insert_with(|| {
                    let name = self.strings.id(&self.names.strings()[function as usize]);
                    let file = self.strings.id(&self.names.strings()[file as usize]);
                    function_list.push((next, name, file));
                    next
                });
                lines.push((id, line));
            }
            start = end;
            out.clear();
            location_message(&mut out, i, u64::from(mapping), address, &lines);
            self.out.write_all(&out)?;
        }
        out.clear();
        tail_of_message(
            &mut out,
            &mut self.strings,
            &function_list,
            &self.comments,
            (0, 0),
            (self.kind_unit, 0),
            self.period_ns,
        );
        self.out.write_all(&out)?;
        Ok(self.out)
    }
}

/// The index in the message's mappings of the executable mapping of `maps` holding `addr`
/// (`mapping_of_entry`: from [`mappings_of`]).
fn mapping_at(maps: &Maps, mapping_of_entry: &HashMap<usize, usize>, addr: u64) -> Option<usize> {
    maps.entries
        .iter()
        .position(|e| e.contains(addr) && e.is_executable())
        .and_then(|i| mapping_of_entry.get(&i).copied())
}

/// The locations of a message being made: one per distinct address, with its mapping (among
/// the executable mappings of `maps`) and its frames.
struct LocationIndex<'m> {
    maps: &'m Maps,
    mapping_of_entry: HashMap<usize, usize>,
    location_of: HashMap<u64, usize>,
}

impl<'m> LocationIndex<'m> {
    /// Gives `pprof` the mappings of `maps` (`build_id` naming those without one recorded).
    fn new(pprof: &mut Pprof, maps: &'m Maps, build_id: &mut impl FnMut(&str) -> String) -> Self {
        let mapping_of_entry;
        (pprof.mappings, mapping_of_entry) = mappings_of(maps, build_id);
        LocationIndex {
            maps,
            mapping_of_entry,
            location_of: HashMap::new(),
        }
    }

    /// The locations of `chain` (innermost first), added to `pprof` when new: return addresses
    /// moved onto their call (minus one), all but the first when `first_is_call`.
    fn chain(
        &mut self,
        pprof: &mut Pprof,
        chain: &[u64],
        first_is_call: bool,
        frames: &mut impl FnMut(u64) -> Vec<Frame>,
    ) -> Vec<usize> {
        chain
            .iter()
            .enumerate()
            .map(|(i, &pc)| {
                let addr = if i == 0 && first_is_call {
                    pc
                } else {
                    pc.saturating_sub(1)
                };
                *self.location_of.entry(addr).or_insert_with(|| {
                    let mapping = mapping_at(self.maps, &self.mapping_of_entry, addr);
                    pprof.locations.push(Location {
                        address: addr,
                        mapping,
                        frames: frames(addr),
                    });
                    pprof.locations.len() - 1
                })
            })
            .collect()
    }
}

/// Adds to `pprof` the mappings of `maps` and each of `chains` (innermost first, with its
/// values in `pprof.values` order) as a sample, one location per distinct address; return
/// addresses are moved onto their call (minus one), all of them, or all but the first when
/// `first_is_call` (a heap profile's first address is where the allocating call is).
pub(super) fn add_chains<'a>(
    pprof: &mut Pprof,
    maps: &Maps,
    chains: impl Iterator<Item = (&'a [u64], Vec<u64>)>,
    first_is_call: bool,
    frames: &mut impl FnMut(u64) -> Vec<Frame>,
    build_id: &mut impl FnMut(&str) -> String,
) {
    let mut index = LocationIndex::new(pprof, maps, build_id);
    for (stack, values) in chains {
        let locations = index.chain(pprof, stack, first_is_call, frames);
        pprof.samples.push(Sample {
            locations,
            count: 0,
            values,
            labels: Vec::new(),
        });
    }
}

/// The second sample type of a legacy profile with `maps` and header period `period_us`, its
/// unit, and what one sample stands for in it: CPU or wall time in nanoseconds, or an event
/// profile's events (`super::event`).
fn second_type(maps: &Maps, wall: bool, period_us: u64) -> (&str, &'static str, u64) {
    match &maps.event {
        Some(event) => (&event.name, "count", event.period),
        None => (if wall { "wall" } else { "cpu" }, "nanoseconds", period_us * 1000),
    }
}

/// An event profile's event, as a comment (`go tool pprof -comments`).
fn event_comment(maps: &Maps) -> Option<String> {
    maps.event
        .as_ref()
        .map(|e| format!("event {}: a sample every {} events", e.name, e.period))
}

/// The executable mappings of `maps`, with the build-id recorded for each or else the one
/// `build_id` gives for its path; and which entry of `maps` became which mapping.
pub(super) fn mappings_of(
    maps: &Maps,
    build_id: &mut impl FnMut(&str) -> String,
) -> (Vec<Mapping>, HashMap<usize, usize>) {
    let mut mappings = Vec::new();
    let mut mapping_of_entry: HashMap<usize, usize> = HashMap::new();
    for (i, entry) in maps.entries.iter().enumerate() {
        if entry.is_executable() {
            mapping_of_entry.insert(i, mappings.len());
            mappings.push(Mapping {
                start: entry.start,
                limit: entry.end,
                file_offset: entry.offset,
                file: entry.path.clone(),
                build_id: entry.build_id.clone().unwrap_or_else(|| build_id(&entry.path)),
            });
        }
    }
    (mappings, mapping_of_entry)
}

/// The comment a profile's `# process` line becomes.
fn process_comment(maps: &Maps) -> Option<String> {
    let p = maps.process.as_ref()?;
    let origin = if p.forked { "forked" } else { "started" };
    Some(format!(
        "process {} (parent {}, {origin}): {}",
        p.pid,
        p.ppid,
        p.command_line()
    ))
}

/// A sample's labels: its thread (name and id), and in a wall-clock profile its state and
/// system call.
/// A sample's pprof labels: its thread's and state's (`context`), then the program's own
/// (`sample_labels`, as text).
fn labels(
    context: Option<&ReadContext>,
    sample_labels: Option<&Labels>,
    contexts: &SampleContexts,
    wall: bool,
) -> Vec<(String, LabelValue)> {
    let mut labels = context.map_or_else(Vec::new, |c| context_labels(c, contexts, wall));
    for (key, value) in sample_labels.into_iter().flat_map(|l| l.iter()) {
        labels.push((key.clone(), LabelValue::Text(value.clone())));
    }
    labels
}

fn context_labels(context: &ReadContext, contexts: &SampleContexts, wall: bool) -> Vec<(String, LabelValue)> {
    let (state, syscall) = match context.kind() {
        StateKind::OnCpu => ("on-cpu", None),
        StateKind::Runnable => ("runnable", None),
        StateKind::Blocked => ("blocked", context.syscall()),
    };
    let mut labels = vec![
        (
            "thread".to_string(),
            LabelValue::Text(contexts.thread_label(context.tid)),
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

/// The two sample types; returns the string ids of the second's kind and unit.
/// The sample types, (type, unit) each.
fn head_of_message(out: &mut Vec<u8>, strings: &mut StringTable, types: &[(&str, &str)]) {
    for &(kind, unit) in types {
        let (kind, unit) = (strings.id(kind), strings.id(unit));
        message(out, 1, |m| {
            uint(m, 1, kind);
            uint(m, 2, unit);
        });
    }
}

fn sample_message(
    out: &mut Vec<u8>,
    strings: &mut StringTable,
    locations: &[u64],
    values: &[u64],
    labels: &[(String, LabelValue)],
) {
    message(out, 2, |m| {
        packed(m, 1, locations.iter().copied());
        packed(m, 2, values.iter().copied());
        for (name, value) in labels {
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

fn mappings_message(out: &mut Vec<u8>, strings: &mut StringTable, mappings: &[Mapping], flags: &[[bool; 4]]) {
    for (i, mapping) in mappings.iter().enumerate() {
        let (file, build_id) = (strings.id(&mapping.file), strings.id(&mapping.build_id));
        let [has_functions, has_files, has_lines, has_inlines] = flags[i];
        message(out, 3, |m| {
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
}

fn location_message(out: &mut Vec<u8>, i: usize, mapping: u64, address: u64, lines: &[(u64, u64)]) {
    message(out, 4, |m| {
        uint(m, 1, i as u64 + 1);
        uint(m, 2, mapping);
        uint(m, 3, address);
        for (function, line) in lines {
            message(m, 4, |l| {
                uint(l, 1, *function);
                uint(l, 2, *line);
            });
        }
    });
}

/// Functions, the string table, time and duration, the period, the comments and the default
/// sample type (a string id, 0 for none).
fn tail_of_message(
    out: &mut Vec<u8>,
    strings: &mut StringTable,
    function_list: &[(u64, u64, u64)],
    comments: &[String],
    (time_ns, duration_ns): (u64, u64),
    ((cpu, nanoseconds), default_value): ((u64, u64), u64),
    period_ns: u64,
) {
    for &(id, name, file) in function_list {
        message(out, 5, |m| {
            uint(m, 1, id);
            uint(m, 2, name);
            uint(m, 3, name);
            uint(m, 4, file);
        });
    }
    let comments: Vec<u64> = comments.iter().map(|c| strings.id(c)).collect();
    for s in strings.0.strings() {
        key(out, 6, 2);
        varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    uint(out, 9, time_ns);
    uint(out, 10, duration_ns);
    message(out, 11, |m| {
        uint(m, 1, cpu);
        uint(m, 2, nanoseconds);
    });
    uint(out, 12, period_ns);
    for comment in comments {
        key(out, 13, 0);
        varint(out, comment);
    }
    uint(out, 14, default_value);
}

/// pprof's string table: index 0 is the empty string.
struct StringTable(Interner);

impl Default for StringTable {
    fn default() -> Self {
        let mut table = Interner::default();
        table.id("");
        StringTable(table)
    }
}

impl StringTable {
    fn id(&mut self, s: &str) -> u64 {
        u64::from(self.0.id(s))
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
    fn the_writer_writes_what_encode_does() {
        let mut w = crate::format::ProfileWriter::new(Vec::new(), crate::format::SlotFormat::LE64, 10_000).unwrap();
        w.write_record(3, &[0x1010, 0x3010, 0x1100]).unwrap();
        w.write_record(1, &[0x1020, 0x5000]).unwrap();
        w.write_record(2, &[0x1010, 0x3010, 0x1100]).unwrap();
        w.write_record(4, &[0x3020, 0x1100]).unwrap();
        let maps = b"1000-2000 r-xp 00000000 08:01 5 /bin/app\n3000-4000 r-xp 00000000 08:01 6 /lib/x.so\n\
            # build-id 1000-2000 aabbcc\n# process 42 7 started /bin/app\n";
        let profile = Profile::parse(&w.finish(maps).unwrap()).unwrap();
        let frames = |addr: u64| -> Vec<Frame> {
            match addr {
                0x5000..=0x5fff => Vec::new(),
                a if a % 2 == 0 => vec![Frame {
                    function: format!("f{}", a % 3),
                    file: if a < 0x2000 { "a.c".into() } else { String::new() },
                    line: a % 5,
                }],
                a => vec![
                    Frame {
                        function: "inlined".into(),
                        file: "b.c".into(),
                        line: 9,
                    },
                    Frame {
                        function: format!("g{}", a % 2),
                        ..Frame::default()
                    },
                ],
            }
        };
        let whole = Pprof::from_profile(&profile, frames, |_| "id".to_string()).encode();
        let mut writer = PprofWriter::new(Vec::new(), &profile.maps, profile.period_us, false, |_| {
            "id".to_string()
        })
        .unwrap();
        for s in &profile.samples {
            writer.sample(&s.pcs, s.count, None, None, frames).unwrap();
        }
        assert_eq!(writer.finish().unwrap(), whole);
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
                values: Vec::new(),
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
