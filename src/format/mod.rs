//! Reading and writing profiles: gperftools' CPU profile format ("legacy" or "raw" profile),
//! as cpuprof, gperftools' libprofiler and google-pprof write and read it, and its conversion
//! to pprof's protobuf.
//!
//! What you get:
//! * [`Profile::parse`] (and [`Profile::parse_lenient`] for files cut short) reads a whole
//!   profile: its sampling period, its distinct call chains with their sample counts, and its
//!   [`Maps`]; [`scan()`] visits the records one by one without keeping them, for large files.
//! * [`ProfileWriter`] writes one, record by record, to any [`std::io::Write`].
//! * [`Maps`] parses the mapping lines at the end of a profile (the process's
//!   `/proc/self/maps`), with the lines cpuprof adds after them: [`build_id`]s,
//!   [`SignalWeights`], the [`ProcessLine`] of the process that wrote the profile, the
//!   threads and states of wall-clock samples ([`sample_context`]), and the looks a wall-clock
//!   profile is missing ([`WallLooks`]).
//! * [`pprof::Pprof`] turns a parsed profile into pprof's `profile.proto`, for `go tool pprof`,
//!   Pyroscope, Parca or speedscope.
//! * [`database`] names the files of a profile database (one directory per epoch).
//!
//! The format: a profile is a sequence of *slots* (4 or 8 bytes, either byte order; see
//! [`SlotFormat`]): a five-slot header `0, 3, 0, period_us, 0`, records
//! `count, depth, pc...` (interrupted PC first), the trailer `0, 1, 0`, and then the text of
//! `/proc/self/maps`. `docs/FORMAT.md` in the repository describes the lines cpuprof adds.
//!
//! This module is pure code: no signals, no global state, no files opened. Reading a profile
//! is defensive: any input, however damaged or crafted, gives a profile or a [`ParseError`],
//! never a panic.
//!
//! ```
//! use cpuprof::format::{Profile, ProfileWriter, SlotFormat};
//!
//! // A profile sampled every 10 ms, with two records of the same chain.
//! let mut writer = ProfileWriter::new(Vec::new(), SlotFormat::NATIVE, 10_000)?;
//! writer.write_record(3, &[0x401010, 0x401200])?;
//! writer.write_record(2, &[0x401010, 0x401200])?;
//! let bytes = writer.finish(b"00400000-00402000 r-xp 00000000 08:01 42 /usr/bin/app\n")?;
//!
//! let profile = Profile::parse(&bytes)?;
//! assert_eq!(profile.samples.len(), 1);
//! assert_eq!(profile.total_samples(), 5);
//! assert_eq!(profile.maps.find(0x401010).unwrap().path, "/usr/bin/app");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod build_id;
pub mod contention;
pub mod database;
pub mod event;
pub mod fast_hash;
pub mod heap;
pub mod interner;
pub mod maps;
pub mod pprof;
pub mod process;
pub mod reader;
pub mod sample_context;
pub mod sample_labels;
pub mod signal_weights;
pub mod wall_looks;
pub mod writer;

pub use event::EventLine;
pub use fast_hash::FastHash;
pub use interner::Interner;
pub use maps::{MapEntry, Maps};
pub use process::ProcessLine;
pub use reader::{scan, scan_from, ParseError, ParseErrorKind, Profile, Record, Sample, Scan};
pub use sample_context::{ReadContext, SampleContext, SampleContexts, StateKind, ThreadState};
pub use sample_labels::{Labels, SampleLabels};
pub use signal_weights::SignalWeights;
pub use wall_looks::WallLooks;
pub use writer::ProfileWriter;

/// Number of slots in the header this crate writes (`0, 3, 0, period_us, 0`); a reader
/// accepts longer headers.
pub const HEADER_SLOTS: usize = 5;
/// The slots that end the records: a record with count 0, one PC, and that PC 0. The maps text
/// follows it.
pub const TRAILER: [u64; 3] = [0, 1, 0];

/// Byte order of the slots in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    /// Least significant byte first (x86-64, aarch64 as Linux runs it).
    Little,
    /// Most significant byte first.
    Big,
}

/// Width and byte order of a profile's slots: a profile is written in the word size and byte
/// order of the profiled process, and [`Profile::parse`] detects which one a file uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotFormat {
    /// Bytes per slot: 4 or 8.
    pub size: usize,
    /// Byte order of each slot.
    pub order: ByteOrder,
}

impl SlotFormat {
    /// 8-byte little-endian slots: 64-bit x86 and Arm.
    pub const LE64: SlotFormat = SlotFormat {
        size: 8,
        order: ByteOrder::Little,
    };
    /// 8-byte big-endian slots.
    pub const BE64: SlotFormat = SlotFormat {
        size: 8,
        order: ByteOrder::Big,
    };
    /// 4-byte little-endian slots: 32-bit x86 and Arm.
    pub const LE32: SlotFormat = SlotFormat {
        size: 4,
        order: ByteOrder::Little,
    };
    /// 4-byte big-endian slots.
    pub const BE32: SlotFormat = SlotFormat {
        size: 4,
        order: ByteOrder::Big,
    };

    /// The format a profiler running in this process writes: pointer width, native order.
    pub const NATIVE: SlotFormat = SlotFormat {
        size: std::mem::size_of::<usize>(),
        order: if cfg!(target_endian = "little") {
            ByteOrder::Little
        } else {
            ByteOrder::Big
        },
    };

    /// Largest value a slot can hold (`u32::MAX` for 4-byte slots).
    pub fn max_value(self) -> u64 {
        if self.size == 4 {
            u32::MAX as u64
        } else {
            u64::MAX
        }
    }

    /// Appends `value` as one slot. Values wider than the slot are truncated, so callers that
    /// write 4-byte profiles must keep values in range (see [`SlotFormat::max_value`]).
    pub fn put(self, value: u64, out: &mut Vec<u8>) {
        match (self.size, self.order) {
            (4, ByteOrder::Little) => out.extend_from_slice(&(value as u32).to_le_bytes()),
            (4, ByteOrder::Big) => out.extend_from_slice(&(value as u32).to_be_bytes()),
            (_, ByteOrder::Little) => out.extend_from_slice(&value.to_le_bytes()),
            (_, ByteOrder::Big) => out.extend_from_slice(&value.to_be_bytes()),
        }
    }

    /// Writes `value` as one slot at the start of `out` (truncated as by [`put`](Self::put)).
    /// Async-signal-safe.
    ///
    /// # Panics
    ///
    /// If `out` is shorter than `self.size`.
    pub fn put_into(self, value: u64, out: &mut [u8]) {
        match (self.size, self.order) {
            (4, ByteOrder::Little) => out[..4].copy_from_slice(&(value as u32).to_le_bytes()),
            (4, ByteOrder::Big) => out[..4].copy_from_slice(&(value as u32).to_be_bytes()),
            (_, ByteOrder::Little) => out[..8].copy_from_slice(&value.to_le_bytes()),
            (_, ByteOrder::Big) => out[..8].copy_from_slice(&value.to_be_bytes()),
        }
    }

    /// Reads the slot at the start of `bytes`.
    ///
    /// # Panics
    ///
    /// If `bytes` is shorter than `self.size`.
    pub fn get(self, bytes: &[u8]) -> u64 {
        match (self.size, self.order) {
            (4, ByteOrder::Little) => u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64,
            (4, ByteOrder::Big) => u32::from_be_bytes(bytes[..4].try_into().unwrap()) as u64,
            (_, ByteOrder::Little) => u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            (_, ByteOrder::Big) => u64::from_be_bytes(bytes[..8].try_into().unwrap()),
        }
    }
}

/// Sampling period in microseconds for a frequency in Hz, as gperftools computes it (rounded
/// down; 0 Hz counts as 1 Hz): the `period_us` a profile records.
///
/// ```
/// assert_eq!(cpuprof::format::period_us_for_frequency(100), 10_000);
/// assert_eq!(cpuprof::format::period_us_for_frequency(3), 333_333);
/// ```
pub fn period_us_for_frequency(hz: u32) -> u64 {
    1_000_000 / u64::from(hz.max(1))
}
