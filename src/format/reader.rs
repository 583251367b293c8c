//! Reads legacy profiles of any slot width and byte order: whole ([`Profile::parse`],
//! [`Profile::parse_lenient`]) or record by record ([`scan()`]).

use super::{ByteOrder, FastHash, Labels, Maps, ReadContext, SlotFormat};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Seek, SeekFrom};

/// One distinct call chain and the samples it received (identical chains are summed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Samples taken in this chain (each stands for one sampling period of CPU time).
    pub count: u64,
    /// Interrupted PC first, then return addresses, outermost caller last.
    pub pcs: Vec<u64>,
    /// Wall-clock profiles: the thread and state the samples were taken in (chains are summed
    /// only within one context).
    pub context: Option<ReadContext>,
    /// The label set the samples were taken under (chains are summed only within one set).
    pub labels: Option<Labels>,
}

/// A parsed profile: its records, with identical call chains merged, and its maps.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Slot width and byte order the file was written in.
    pub format: SlotFormat,
    /// Sampling period in microseconds: the CPU time (or, in a wall-clock profile, the
    /// elapsed time) one sample stands for.
    pub period_us: u64,
    /// Distinct call chains in order of first appearance, counts summed.
    pub samples: Vec<Sample>,
    /// How many records the file held before merging.
    pub records: usize,
    /// The mapped objects (and cpuprof's annotations) that follow the trailer; empty if the
    /// file has none.
    pub maps: Maps,
}

impl Profile {
    /// Sum of all sample counts. A parsed profile's total fits in a u64 (the reader refuses
    /// a file whose counts add up to more); one built by hand saturates rather than wraps.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().fold(0u64, |total, s| total.saturating_add(s.count))
    }

    /// Parses a complete profile, in any of the four slot formats.
    ///
    /// # Errors
    ///
    /// Any defect, from a header that is not a profile's to a missing trailer (a file cut
    /// short), is a [`ParseError`] naming its byte offset. [`Profile::parse_lenient`] keeps the
    /// records before a defect instead.
    ///
    /// # Example
    ///
    /// ```
    /// use cpuprof::format::{ParseErrorKind, Profile, ProfileWriter, SlotFormat};
    ///
    /// let mut writer = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10_000)?;
    /// writer.write_record(5, &[0x401010, 0x401200])?; // leaf first, then its caller
    /// writer.write_record(2, &[0x401300])?;
    /// let bytes = writer.finish(b"00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n")?;
    ///
    /// let profile = Profile::parse(&bytes)?;
    /// assert_eq!(profile.period_us, 10_000);
    /// assert_eq!(profile.total_samples(), 7);
    /// assert_eq!(profile.samples[0].pcs, [0x401010, 0x401200]);
    ///
    /// // The same file cut short after its first record (a 40-byte header, then 32 bytes):
    /// // an error that says what and where; the lenient reader keeps that record.
    /// let error = Profile::parse(&bytes[..80]).unwrap_err();
    /// assert_eq!(error.offset, 72);
    /// assert_eq!(error.kind, ParseErrorKind::MissingTrailer);
    /// let (partial, defect) = Profile::parse_lenient(&bytes[..80])?;
    /// assert_eq!((partial.total_samples(), defect), (5, Some(error)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn parse(bytes: &[u8]) -> Result<Profile, ParseError> {
        let (profile, defect) = Self::parse_lenient(bytes)?;
        match defect {
            Some(e) => Err(e),
            None => Ok(profile),
        }
    }

    /// Parses as much as is sound: a bad header is still an error, but a file cut short or
    /// damaged after the header (a process killed while profiling) yields the records before
    /// the damage, together with the error that stopped the reading.
    ///
    /// # Errors
    ///
    /// Only for a header that is not a valid profile header (the `Err` case); later defects
    /// come back beside the profile.
    pub fn parse_lenient(bytes: &[u8]) -> Result<(Profile, Option<ParseError>), ParseError> {
        let mut merged = Merger::default();
        let (read, defect) = scan(bytes, |record| merged.add(record, None, None))?;
        if read.maps.contexts.is_empty() && read.maps.labels.is_empty() {
            return Ok((merged.finish(read), defect));
        }
        // A wall-clock or labelled profile, whose contexts and labels follow the records: read
        // again, keeping the samples of different threads, states and label sets apart.
        let mut merged = Merger::default();
        let maps = &read.maps;
        let mut ordinal = 0;
        let _ = scan(bytes, |record| {
            merged.add(record, maps.contexts.of(ordinal), maps.labels.of(ordinal));
            ordinal += 1;
        });
        Ok((merged.finish(read), defect))
    }
    /// [`Profile::parse`] of a profile read through `source` (a file, say) by [`scan_from`],
    /// never held whole in memory: the profile's distinct chains are, the file's bytes are not.
    ///
    /// # Errors
    ///
    /// The outer `Err` is a failure to read `source`; the inner one is [`Profile::parse`]'s.
    pub fn parse_from<R: Read + Seek>(source: R) -> io::Result<Result<Profile, ParseError>> {
        Ok(match Self::parse_lenient_from(source)? {
            Ok((_, Some(e))) | Err(e) => Err(e),
            Ok((profile, None)) => Ok(profile),
        })
    }

    /// [`Profile::parse_lenient`] of a profile read through `source`, as [`Profile::parse_from`]
    /// reads it. A wall-clock profile, whose contexts follow the records, is read twice
    /// (`source` is rewound to where it was).
    ///
    /// # Errors
    ///
    /// The outer `Err` is a failure to read `source`; the inner one is
    /// [`Profile::parse_lenient`]'s.
    pub fn parse_lenient_from<R: Read + Seek>(
        mut source: R,
    ) -> io::Result<Result<(Profile, Option<ParseError>), ParseError>> {
        let start = source.stream_position()?;
        let mut merged = Merger::default();
        let (read, defect) = match scan_from(&mut source, |record| merged.add(record, None, None))? {
            Ok(read) => read,
            Err(e) => return Ok(Err(e)),
        };
        if read.maps.contexts.is_empty() && read.maps.labels.is_empty() {
            return Ok(Ok((merged.finish(read), defect)));
        }
        let mut merged = Merger::default();
        let maps = &read.maps;
        let mut ordinal = 0;
        source.seek(SeekFrom::Start(start))?;
        let _ = scan_from(&mut source, |record| {
            merged.add(record, maps.contexts.of(ordinal), maps.labels.of(ordinal));
            ordinal += 1;
        })?;
        Ok(Ok((merged.finish(read), defect)))
    }
}

/// What reading a profile's records found, besides the records themselves.
#[derive(Clone, Debug)]
pub struct Scan {
    /// Slot width and byte order the file was written in.
    pub format: SlotFormat,
    /// Sampling period in microseconds.
    pub period_us: u64,
    /// Records read (before the trailer, or before the defect that stopped the reading).
    pub records: usize,
    /// Sum of their counts; it fits in a u64 (a record that would take it past is a defect).
    pub total: u64,
    /// Empty if the file has no trailer.
    pub maps: Maps,
}

/// One record as it lies in the file, as [`scan()`] hands it over: nothing is copied or
/// allocated to visit it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// Byte offset of the record in the file.
    pub offset: usize,
    /// Samples (never 0).
    pub count: u64,
    format: SlotFormat,
    /// The program counters' slots (at least one).
    slots: &'a [u8],
}

impl<'a> Record<'a> {
    /// Number of program counters (at least 1).
    pub fn depth(&self) -> usize {
        self.slots.len() / self.format.size
    }

    /// The program counters: interrupted PC first, then return addresses, outermost caller
    /// last. Walks backwards too (`.rev()`), outermost first.
    pub fn pcs(&self) -> impl DoubleEndedIterator<Item = u64> + ExactSizeIterator + 'a {
        let format = self.format;
        self.slots.chunks_exact(format.size).map(move |slot| format.get(slot))
    }

    /// The same as [`Record::pcs`], into `out` (cleared first): decodes the slots with the
    /// width and byte order chosen once, for readers that look at every record.
    pub fn pcs_into(&self, out: &mut Vec<u64>) {
        out.clear();
        match (self.format.size, self.format.order) {
            (4, ByteOrder::Little) => out.extend(
                self.slots
                    .chunks_exact(4)
                    .map(|s| u32::from_le_bytes(s.try_into().unwrap()) as u64),
            ),
            (4, ByteOrder::Big) => out.extend(
                self.slots
                    .chunks_exact(4)
                    .map(|s| u32::from_be_bytes(s.try_into().unwrap()) as u64),
            ),
            (_, ByteOrder::Little) => out.extend(
                self.slots
                    .chunks_exact(8)
                    .map(|s| u64::from_le_bytes(s.try_into().unwrap())),
            ),
            (_, ByteOrder::Big) => out.extend(
                self.slots
                    .chunks_exact(8)
                    .map(|s| u64::from_be_bytes(s.try_into().unwrap())),
            ),
        }
    }
}

/// Reads the records of a profile in one pass, handing each to `visit` as it lies in the
/// file, without materialising the profile: readers that aggregate as they go (the `cpuprof`
/// reports) keep only their aggregate. Checks as [`Profile::parse_lenient`] does: a bad
/// header is an error; damage after it ends the reading, and is returned beside what was
/// read, after `visit` has seen every record before it.
///
/// # Errors
///
/// As [`Profile::parse_lenient`]: `Err` only for a bad header.
///
/// # Example
///
/// ```
/// use cpuprof::format::{scan, ProfileWriter, SlotFormat};
///
/// let mut writer = ProfileWriter::new(Vec::new(), SlotFormat::NATIVE, 1_000)?;
/// writer.write_record(4, &[0x401010, 0x401200])?;
/// writer.write_record(1, &[0x401300])?;
/// let bytes = writer.finish(b"")?;
///
/// // The samples taken in 0x401010 itself, without keeping any record.
/// let mut leaf_samples = 0;
/// let (read, defect) = scan(&bytes, |record| {
///     if record.pcs().next() == Some(0x401010) {
///         leaf_samples += record.count;
///     }
/// })?;
/// assert_eq!((leaf_samples, read.total, read.records), (4, 5, 2));
/// assert!(defect.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scan(bytes: &[u8], visit: impl FnMut(Record<'_>)) -> Result<(Scan, Option<ParseError>), ParseError> {
    match scan_input(&mut Slice(bytes), visit) {
        Ok(read) => Ok(read),
        Err(Failure::Parse(e)) => Err(e),
        Err(Failure::Io(_)) => unreachable!("reading a slice cannot fail"),
    }
}

/// [`scan()`] of a profile read through `source` (a file, say) rather than held in memory:
/// the header is checked from the first bytes before anything else is read, then the records
/// are read through a window of about a megabyte (a record longer than that is held whole
/// while it is visited), and the maps after the trailer are read last. Memory stays that of
/// the window and the maps, whatever the size of the file. `Seek` is used only to measure
/// what is left of the file when a record claims more than the window holds (a crafted depth
/// is judged without reading the rest of the file into memory).
///
/// # Errors
///
/// The outer `Err` is a failure to read `source`; the inner one is [`scan()`]'s (a bad
/// header).
pub fn scan_from<R: Read + Seek>(
    source: R,
    visit: impl FnMut(Record<'_>),
) -> io::Result<Result<(Scan, Option<ParseError>), ParseError>> {
    match scan_input(&mut Stream::new(source), visit) {
        Ok(read) => Ok(Ok(read)),
        Err(Failure::Parse(e)) => Ok(Err(e)),
        Err(Failure::Io(e)) => Err(e),
    }
}

/// Why [`scan_input`] stopped short of a result.
enum Failure {
    Parse(ParseError),
    Io(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

/// Where the records are read from: the whole file in memory, or a window onto a stream.
trait Input {
    /// The bytes from `offset` on: at least `n` of them unless the input ends sooner (then
    /// all that is left). `offset` never goes back before an offset asked for earlier.
    fn at(&mut self, offset: usize, n: usize) -> io::Result<&[u8]>;
    /// How many bytes the input holds from `offset` to its end.
    fn left(&mut self, offset: usize) -> io::Result<usize>;
    /// Everything from `offset` to the end.
    fn rest(&mut self, offset: usize) -> io::Result<&[u8]>;
}

struct Slice<'a>(&'a [u8]);

impl Input for Slice<'_> {
    fn at(&mut self, offset: usize, _: usize) -> io::Result<&[u8]> {
        Ok(&self.0[offset..])
    }
    fn left(&mut self, offset: usize) -> io::Result<usize> {
        Ok(self.0.len() - offset)
    }
    fn rest(&mut self, offset: usize) -> io::Result<&[u8]> {
        Ok(&self.0[offset..])
    }
}

/// A window onto a stream: `buf` holds the bytes from file offset `base` on.
struct Stream<R> {
    source: R,
    buf: Vec<u8>,
    base: usize,
    ended: bool,
}

/// How much [`Stream`] reads at a time, and how much it lets pile up before dropping what
/// has been read.
const WINDOW: usize = 1 << 20;

impl<R: Read + Seek> Stream<R> {
    fn new(source: R) -> Self {
        Stream {
            source,
            buf: Vec::new(),
            base: 0,
            ended: false,
        }
    }

    /// Drops the bytes before `offset` once enough have piled up.
    fn forget_before(&mut self, offset: usize) {
        let done = offset - self.base;
        if done >= WINDOW || (done > 0 && done == self.buf.len()) {
            self.buf.drain(..done);
            self.base = offset;
        }
    }

    /// Reads at least `want` more bytes unless the stream ends first.
    fn fill(&mut self, want: usize) -> io::Result<()> {
        let target = self.buf.len() + want;
        while self.buf.len() < target && !self.ended {
            let len = self.buf.len();
            self.buf.resize(len.max(target).max(len + WINDOW), 0);
            let read = loop {
                match self.source.read(&mut self.buf[len..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let n = match read {
                Ok(n) => n,
                Err(e) => {
                    self.buf.truncate(len);
                    return Err(e);
                }
            };
            self.buf.truncate(len + n);
            self.ended = n == 0;
        }
        Ok(())
    }
}

impl<R: Read + Seek> Input for Stream<R> {
    fn at(&mut self, offset: usize, n: usize) -> io::Result<&[u8]> {
        self.forget_before(offset);
        let have = self.buf.len() - (offset - self.base);
        if have < n {
            self.fill(n - have)?;
        }
        Ok(&self.buf[offset - self.base..])
    }

    fn left(&mut self, offset: usize) -> io::Result<usize> {
        let buffered = self.buf.len() - (offset - self.base);
        if self.ended {
            return Ok(buffered);
        }
        // Where the source is (just past the buffer) and where it ends.
        let position = self.source.stream_position()?;
        let end = self.source.seek(SeekFrom::End(0))?;
        self.source.seek(SeekFrom::Start(position))?;
        Ok(buffered + end.saturating_sub(position) as usize)
    }

    fn rest(&mut self, offset: usize) -> io::Result<&[u8]> {
        self.buf.drain(..offset - self.base);
        self.base = offset;
        self.source.read_to_end(&mut self.buf)?;
        self.ended = true;
        Ok(&self.buf)
    }
}

/// Records longer than this are read only after the file is known to hold them whole.
const TRUST_DEPTH_BYTES: u64 = 16 << 20;

fn scan_input(
    input: &mut impl Input,
    mut visit: impl FnMut(Record<'_>),
) -> Result<(Scan, Option<ParseError>), Failure> {
    let (format, header_len, period_us) = parse_header(input)?;
    let mut read = Scan {
        format,
        period_us,
        records: 0,
        total: 0,
        maps: Maps::default(),
    };
    let mut offset = header_len;
    let size = format.size;
    let defect = loop {
        let head = input.at(offset, 3 * size)?;
        if head.len() / size < 2 {
            break Some(ParseError::at(offset, ParseErrorKind::MissingTrailer));
        }
        let (count, depth) = (format.get(head), format.get(&head[size..]));
        if depth == 0 {
            break Some(ParseError::at(offset, ParseErrorKind::EmptyRecord));
        }
        // The record's length in bytes, if the file holds it whole.
        let wanted = depth.checked_add(2).and_then(|n| n.checked_mul(size as u64));
        let whole = match wanted {
            Some(bytes) if bytes <= TRUST_DEPTH_BYTES || bytes <= input.left(offset)? as u64 => {
                let bytes = bytes as usize;
                (input.at(offset, bytes)?.len() >= bytes).then_some(bytes)
            }
            _ => None,
        };
        let Some(record_len) = whole else {
            let available = input.left(offset)? / size;
            break Some(ParseError::at(
                offset,
                ParseErrorKind::TruncatedRecord {
                    depth,
                    slots_left: available as u64 - 2,
                },
            ));
        };
        let slots = &input.at(offset, record_len)?[..record_len];
        let first_pc = format.get(&slots[2 * size..]);
        if count == 0 {
            if depth == 1 && first_pc == 0 {
                read.maps = Maps::parse(input.rest(offset + 3 * size)?);
                return Ok((read, None));
            }
            break Some(ParseError::at(offset, ParseErrorKind::ZeroCount));
        }
        if first_pc == 0 {
            break Some(ParseError::at(offset + 2 * size, ParseErrorKind::ZeroPc));
        }
        // Every sum of a parsed profile's counts must fit in a u64.
        let Some(total) = read.total.checked_add(count) else {
            break Some(ParseError::at(offset, ParseErrorKind::CountOverflow { count }));
        };
        visit(Record {
            offset,
            count,
            format,
            slots: &slots[2 * size..],
        });
        read.total = total;
        read.records += 1;
        offset += record_len;
    };
    Ok((read, defect))
}

/// Detects slot width and byte order from the header and validates it, from the header's
/// bytes alone. Returns (format, header length in bytes, period in microseconds).
fn parse_header(input: &mut impl Input) -> Result<(SlotFormat, usize, u64), Failure> {
    // Enough for the first two slots of any format: all of the file if it is shorter.
    let bytes = input.at(0, 16)?;
    if bytes.len() < 8 {
        return Err(Failure::Parse(ParseError::at(
            bytes.len(),
            ParseErrorKind::TooShortForHeader { len: bytes.len() },
        )));
    }
    // Slot 0 is 0 and slot 1 is >= 3 in every format; the four encodings of "0, 3" differ in
    // where the non-zero byte falls, which identifies the format (see the format spec).
    let format = [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32]
        .into_iter()
        .find(|f| bytes.len() >= 2 * f.size && f.get(bytes) == 0 && (3..=1 << 20).contains(&f.get(&bytes[f.size..])))
        .ok_or_else(|| Failure::Parse(ParseError::at(0, ParseErrorKind::NotAProfile)))?;
    let size = format.size;
    let header_words = format.get(&bytes[size..]) as usize;
    let header_len = (2 + header_words) * size;
    let bytes = input.at(0, header_len)?;
    if bytes.len() < header_len {
        return Err(Failure::Parse(ParseError::at(
            bytes.len(),
            ParseErrorKind::TooShortForHeader { len: bytes.len() },
        )));
    }
    let version = format.get(&bytes[2 * size..]);
    if version != 0 {
        return Err(Failure::Parse(ParseError::at(
            2 * size,
            ParseErrorKind::UnsupportedVersion(version),
        )));
    }
    let period_us = format.get(&bytes[3 * size..]);
    if period_us == 0 {
        return Err(Failure::Parse(ParseError::at(3 * size, ParseErrorKind::ZeroPeriod)));
    }
    Ok((format, header_len, period_us))
}

/// Sums the records of identical chains. Chains are keyed by a fast hash (a profile of a
/// million records spent most of its reading time in SipHash), and a record allocates only
/// when its chain is new.
#[derive(Default)]
struct Merger {
    /// Each distinct chain, and where its count is in `counts`.
    index: HashMap<Vec<u64>, usize, FastHash>,
    counts: Vec<u64>,
    /// The record being looked up, decoded.
    pcs: Vec<u64>,
    /// Wall-clock and labelled profiles: each distinct (chain, context, labels), and where its
    /// count is.
    with_context: ContextIndex,
}

type ContextIndex = HashMap<(Vec<u64>, Option<ReadContext>, Option<Labels>), usize, FastHash>;

impl Merger {
    fn add(&mut self, record: Record<'_>, context: Option<&ReadContext>, labels: Option<&Labels>) {
        record.pcs_into(&mut self.pcs);
        if context.is_some() || labels.is_some() {
            let key = (std::mem::take(&mut self.pcs), context.cloned(), labels.cloned());
            let next = self.counts.len();
            match self.with_context.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => self.counts[*e.get()] += record.count,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(next);
                    self.counts.push(record.count);
                }
            }
            return;
        }
        match self.index.get(&self.pcs[..]) {
            // No overflow: a chain's count is at most the profile's total, which `scan` keeps
            // below 2^64.
            Some(&i) => self.counts[i] += record.count,
            None => {
                self.index.insert(self.pcs.clone(), self.counts.len());
                self.counts.push(record.count);
            }
        }
    }

    fn finish(self, scan: Scan) -> Profile {
        // The chains move out of the index rather than being kept twice while reading.
        let mut samples: Vec<Sample> = self
            .counts
            .iter()
            .map(|&count| Sample {
                count,
                pcs: Vec::new(),
                context: None,
                labels: None,
            })
            .collect();
        for (pcs, i) in self.index {
            samples[i].pcs = pcs;
        }
        for ((pcs, context, labels), i) in self.with_context {
            samples[i].pcs = pcs;
            samples[i].context = context;
            samples[i].labels = labels;
        }
        Profile {
            format: scan.format,
            period_us: scan.period_us,
            samples,
            records: scan.records,
            maps: scan.maps,
        }
    }
}

/// What is wrong with a profile, and where. Its `Display` says both in a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset in the file where the defect starts.
    pub offset: usize,
    /// What the defect is.
    pub kind: ParseErrorKind,
}

/// The defects [`ParseError`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The file ends before the header does (an empty file, say).
    TooShortForHeader {
        /// The file's length in bytes.
        len: usize,
    },
    /// The file does not start with a profile header (`0, 3` in any slot format).
    NotAProfile,
    /// The header's version slot is not 0, the only version defined.
    UnsupportedVersion(u64),
    /// The header's sampling period is 0.
    ZeroPeriod,
    /// A record has depth 0: no program counters.
    EmptyRecord,
    /// A record claims more program counters than the file has slots left (a file cut short).
    TruncatedRecord {
        /// The depth the record claims.
        depth: u64,
        /// Slots left in the file after its count and depth.
        slots_left: u64,
    },
    /// A record has count 0 but is not the trailer.
    ZeroCount,
    /// A record's first program counter is 0.
    ZeroPc,
    /// The file ends without the trailer `0, 1, 0`: the profiler did not finish the file (a
    /// process killed while profiling). Records before it are sound.
    MissingTrailer,
    /// The record's count takes the profile's total past 2^64 - 1 samples.
    CountOverflow {
        /// The record's count.
        count: u64,
    },
}

impl ParseError {
    fn at(offset: usize, kind: ParseErrorKind) -> Self {
        ParseError { offset, kind }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte offset {}: ", self.offset)?;
        match &self.kind {
            ParseErrorKind::TooShortForHeader { len } => {
                write!(f, "file is {len} bytes, too short for a profile header")
            }
            ParseErrorKind::NotAProfile => write!(
                f,
                "not a CPU profile: the header must start with slots 0, 3 (4- or 8-byte, either byte order)"
            ),
            ParseErrorKind::UnsupportedVersion(v) => {
                write!(f, "unsupported format version {v} (only 0 is defined)")
            }
            ParseErrorKind::ZeroPeriod => write!(f, "sampling period is 0"),
            ParseErrorKind::EmptyRecord => write!(f, "record has no program counters"),
            ParseErrorKind::TruncatedRecord { depth, slots_left } => write!(
                f,
                "record claims {depth} program counters but only {slots_left} slots remain (file truncated?)"
            ),
            ParseErrorKind::ZeroCount => write!(f, "record has sample count 0 but is not the trailer"),
            ParseErrorKind::ZeroPc => write!(f, "record's first program counter is 0"),
            ParseErrorKind::CountOverflow { count } => write!(
                f,
                "record's sample count {count} takes the profile's total past 2^64 - 1 (crafted or corrupt counts)"
            ),
            ParseErrorKind::MissingTrailer => {
                write!(
                    f,
                    "file ends without the trailer 0, 1, 0 (profiler did not stop cleanly?)"
                )
            }
        }
    }
}

impl std::error::Error for ParseError {}

/// Byte order name for messages.
impl fmt::Display for SlotFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let order = match self.order {
            ByteOrder::Little => "little-endian",
            ByteOrder::Big => "big-endian",
        };
        write!(f, "{}-bit {}", self.size * 8, order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ProfileWriter;

    const MAPS: &[u8] = b"00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n";

    fn sample_profile(format: SlotFormat) -> Vec<u8> {
        let mut w = ProfileWriter::new(Vec::new(), format, 10000).unwrap();
        w.write_record(5, &[0xa0000, 0xc0000, 0xe0000]).unwrap();
        w.write_record(2, &[0xb0000]).unwrap();
        w.write_record(1, &[0xa0000, 0xc0000, 0xe0000]).unwrap();
        w.finish(MAPS).unwrap()
    }

    #[test]
    fn labelled_records_are_summed_within_their_set_only() {
        use crate::format::sample_labels::{labels_line, labelset_line};
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 1000).unwrap();
        let chain = [0xa0000, 0xc0000];
        for count in [7, 3, 2, 1] {
            w.write_record(count, &chain).unwrap();
        }
        let mut maps = MAPS.to_vec();
        maps.extend_from_slice(labelset_line(1, &[("endpoint", "/a")]).as_bytes());
        maps.extend_from_slice(labelset_line(2, &[("endpoint", "/b"), ("tenant", "t 1")]).as_bytes());
        for (ordinal, set) in [(0, 1), (1, 2), (2, 1)] {
            maps.extend_from_slice(labels_line(ordinal, set).as_bytes());
        }
        let bytes = w.finish(&maps).unwrap();
        let p = Profile::parse(&bytes).unwrap();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        let set_a: Labels = vec![pair("endpoint", "/a")].into();
        let set_b: Labels = vec![pair("endpoint", "/b"), pair("tenant", "t 1")].into();
        let by_set: Vec<(u64, Option<&Labels>)> = p.samples.iter().map(|s| (s.count, s.labels.as_ref())).collect();
        assert_eq!(by_set, vec![(9, Some(&set_a)), (3, Some(&set_b)), (1, None)]);
        let (read, _) = Profile::parse_lenient_from(std::io::Cursor::new(&bytes))
            .unwrap()
            .unwrap();
        assert_eq!(read.samples, p.samples, "read whole or streamed alike");
        // pprof: the program's labels as text labels.
        let pprof = crate::format::pprof::Pprof::from_profile(&p, |_| Vec::new(), |_| String::new());
        let labels: Vec<Vec<(String, crate::format::pprof::LabelValue)>> =
            pprof.samples.iter().map(|s| s.labels.clone()).collect();
        assert_eq!(
            labels[1],
            vec![
                (
                    "endpoint".to_string(),
                    crate::format::pprof::LabelValue::Text("/b".into())
                ),
                (
                    "tenant".to_string(),
                    crate::format::pprof::LabelValue::Text("t 1".into())
                ),
            ]
        );
        assert!(labels[2].is_empty());
    }

    #[test]
    fn reads_every_slot_format_and_sums_identical_stacks() {
        for format in [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32] {
            let p = Profile::parse(&sample_profile(format)).unwrap();
            assert_eq!(p.format, format);
            assert_eq!(p.period_us, 10000);
            assert_eq!(p.records, 3);
            assert_eq!(
                p.samples,
                vec![
                    Sample {
                        count: 6,
                        pcs: vec![0xa0000, 0xc0000, 0xe0000],
                        context: None,
                        labels: None,
                    },
                    Sample {
                        count: 2,
                        pcs: vec![0xb0000],
                        context: None,
                        labels: None,
                    },
                ]
            );
            assert_eq!(p.maps.entries.len(), 1);
            assert_eq!(p.maps.entries[0].path, "/usr/bin/dbus-daemon");
        }
    }

    #[test]
    fn scan_visits_every_record_in_file_order_as_written() {
        for format in [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32] {
            let bytes = sample_profile(format);
            let mut seen = Vec::new();
            let (read, defect) = scan(&bytes, |record| {
                let mut pcs = vec![7];
                record.pcs_into(&mut pcs);
                assert_eq!(pcs, record.pcs().collect::<Vec<_>>());
                assert_eq!(record.depth(), pcs.len());
                seen.push((record.offset / format.size, record.count, pcs));
            })
            .unwrap();
            assert_eq!(defect, None);
            // Not merged: the third record repeats the first chain.
            assert_eq!(
                seen,
                vec![
                    (5, 5, vec![0xa0000, 0xc0000, 0xe0000]),
                    (10, 2, vec![0xb0000]),
                    (13, 1, vec![0xa0000, 0xc0000, 0xe0000]),
                ],
                "{format}"
            );
            assert_eq!(
                (read.format, read.period_us, read.records, read.total),
                (format, 10000, 3, 8)
            );
            assert_eq!(read.maps.entries.len(), 1);
        }
        // A cut: the records before it are visited, then the defect is returned.
        let bytes = sample_profile(SlotFormat::LE64);
        let mut visited = 0;
        let (read, defect) = scan(&bytes[..40 + 40 + 10], |_| visited += 1).unwrap();
        assert_eq!((visited, read.records, read.total), (1, 1, 5));
        assert_eq!(defect, Some(ParseError::at(80, ParseErrorKind::MissingTrailer)));
        assert!(read.maps.entries.is_empty());
    }

    /// The records a scan visited (offset, count, program counters) and its outcome.
    type Seen = (Vec<(usize, u64, Vec<u64>)>, String);

    /// What `scan` and `scan_from` see of `bytes`.
    fn both_ways(bytes: &[u8]) -> [Seen; 2] {
        let describe = |read: Result<(Scan, Option<ParseError>), ParseError>| match read {
            Ok((scan, defect)) => {
                format!(
                    "{} {} {} {} {:?}",
                    scan.format,
                    scan.period_us,
                    scan.records,
                    scan.total,
                    defect.map(|d| d.to_string())
                ) + &format!(" maps {}", scan.maps.entries.len())
            }
            Err(e) => e.to_string(),
        };
        let mut whole = Vec::new();
        let read = scan(bytes, |r| whole.push((r.offset, r.count, r.pcs().collect())));
        let whole = (whole, describe(read));
        let mut streamed = Vec::new();
        let read = scan_from(std::io::Cursor::new(bytes), |r| {
            streamed.push((r.offset, r.count, r.pcs().collect()))
        })
        .unwrap();
        [whole, (streamed, describe(read))]
    }

    #[test]
    fn reading_through_a_stream_sees_what_the_slice_shows_at_every_cut() {
        for format in [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32] {
            let full = sample_profile(format);
            for cut in 0..=full.len() {
                let [whole, streamed] = both_ways(&full[..cut]);
                assert_eq!(whole, streamed, "{format} cut at {cut}");
            }
            let parsed = Profile::parse_lenient(&full).unwrap().0;
            let streamed = Profile::parse_from(std::io::Cursor::new(&full)).unwrap().unwrap();
            assert_eq!(parsed.samples, streamed.samples);
            assert_eq!(parsed.maps.entries.len(), streamed.maps.entries.len());
        }
    }

    #[test]
    fn a_stream_longer_than_the_window_reads_alike() {
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10000).unwrap();
        for i in 0..100_000u64 {
            let depth = 1 + (i % 37) as usize;
            let pcs: Vec<u64> = (0..depth as u64).map(|j| 0x1000 + i * 64 + j).collect();
            w.write_record(1 + i % 5, &pcs).unwrap();
        }
        // One record longer than the window.
        let deep: Vec<u64> = (1..=300_000u64).collect();
        w.write_record(2, &deep).unwrap();
        let bytes = w.finish(MAPS).unwrap();
        assert!(bytes.len() > 3 * WINDOW);
        let [whole, streamed] = both_ways(&bytes);
        assert_eq!(whole, streamed);
        let cut = &bytes[..bytes.len() - MAPS.len() - 100];
        let [whole, streamed] = both_ways(cut);
        assert_eq!(whole, streamed);
    }

    #[test]
    fn a_crafted_depth_is_judged_without_reading_the_rest() {
        let mut bytes = sample_profile(SlotFormat::LE64)[..40].to_vec();
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        bytes.extend_from_slice(&[7; 4096]);
        let [whole, streamed] = both_ways(&bytes);
        assert_eq!(whole, streamed);
        assert!(whole.1.contains("only 512 slots remain"), "{}", whole.1);
    }

    #[test]
    fn truncation_anywhere_is_an_error_with_an_offset_and_keeps_whole_records() {
        let full = sample_profile(SlotFormat::LE64);
        let trailer_end = full.len() - MAPS.len();
        for cut in 0..trailer_end {
            let err = Profile::parse(&full[..cut]).unwrap_err();
            assert!(err.offset <= cut, "cut {cut}: {err}");
            if let Ok((partial, Some(_))) = Profile::parse_lenient(&full[..cut]) {
                // Every record that fits entirely before the cut is kept.
                let whole = [40 + 40, 40 + 40 + 24, 40 + 40 + 24 + 40]
                    .iter()
                    .filter(|&&end| end <= cut)
                    .count();
                assert_eq!(partial.records, whole, "cut {cut}");
            }
        }
    }

    #[test]
    fn errors_say_what_and_where() {
        let mut bad = sample_profile(SlotFormat::LE64);
        bad[41] = 0xff; // count of the first record stays, depth becomes huge
        bad[48] = 0xff;
        let err = Profile::parse(&bad).unwrap_err();
        assert_eq!(err.offset, 40);
        assert!(err.to_string().contains("at byte offset 40"), "{err}");

        assert_eq!(
            Profile::parse(b"hello world, not a profile").unwrap_err().kind,
            ParseErrorKind::NotAProfile
        );
        assert!(matches!(
            Profile::parse(b"").unwrap_err().kind,
            ParseErrorKind::TooShortForHeader { .. }
        ));

        let mut zero_period = sample_profile(SlotFormat::LE64);
        zero_period[24] = 0;
        zero_period[25] = 0;
        assert_eq!(
            Profile::parse(&zero_period).unwrap_err(),
            ParseError::at(24, ParseErrorKind::ZeroPeriod)
        );
    }

    #[test]
    fn counts_past_two_to_the_64_are_an_error_at_their_record() {
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10000).unwrap();
        w.write_record(u64::MAX - 10, &[0xa0000]).unwrap();
        w.write_record(10, &[0xb0000]).unwrap();
        w.write_record(1, &[0xa0000]).unwrap();
        let bytes = w.finish(MAPS).unwrap();
        let err = Profile::parse(&bytes).unwrap_err();
        assert_eq!(
            err,
            ParseError::at(40 + 24 + 24, ParseErrorKind::CountOverflow { count: 1 })
        );
        assert!(err.to_string().contains("past 2^64"), "{err}");
        let (partial, _) = Profile::parse_lenient(&bytes).unwrap();
        assert_eq!(partial.total_samples(), u64::MAX);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: mutate a valid profile byte by byte.
        let base = sample_profile(SlotFormat::LE32);
        let mut state = 0x2545F4914F6CDD1Du64;
        for _ in 0..20000 {
            let mut bytes = base.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state as usize) % bytes.len();
                bytes[i] = (state >> 32) as u8;
            }
            let len = (state >> 40) as usize % (bytes.len() + 1);
            let _ = Profile::parse_lenient(&bytes[..len]);
        }
    }
}
