//! The gperftools CPU profile format ("legacy" or "raw" profile).
//!
//! A profile is a sequence of *slots* (4 or 8 bytes, either byte order): a five-slot header
//! `0, 3, 0, period_us, 0`, records `count, depth, pc...` (interrupted PC first), the trailer
//! `0, 1, 0`, and then the text of `/proc/self/maps`. See `shared/spec/cpu-profile-format.md`.
//!
//! This module is pure code: no signals, no global state.

pub mod build_id;
pub mod database;
pub mod fast_hash;
pub mod maps;
pub mod pprof;
pub mod reader;
pub mod sample_context;
pub mod signal_weights;
pub mod writer;

pub use fast_hash::FastHash;
pub use maps::{MapEntry, Maps};
pub use reader::{scan, ParseError, ParseErrorKind, Profile, Record, Sample, Scan};
pub use sample_context::{ReadContext, SampleContext, SampleContexts, StateKind, ThreadState};
pub use signal_weights::SignalWeights;
pub use writer::ProfileWriter;

/// Number of slots in the header this crate writes.
pub const HEADER_SLOTS: usize = 5;
/// The trailer is a record with count 0, one PC, and that PC 0.
pub const TRAILER: [u64; 3] = [0, 1, 0];

/// Byte order of the slots in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    Little,
    Big,
}

/// Width and byte order of a profile's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotFormat {
    /// 4 or 8.
    pub size: usize,
    pub order: ByteOrder,
}

impl SlotFormat {
    pub const LE64: SlotFormat = SlotFormat {
        size: 8,
        order: ByteOrder::Little,
    };
    pub const BE64: SlotFormat = SlotFormat {
        size: 8,
        order: ByteOrder::Big,
    };
    pub const LE32: SlotFormat = SlotFormat {
        size: 4,
        order: ByteOrder::Little,
    };
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

    /// Largest value a slot can hold.
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

    /// Reads the slot at the start of `bytes`, which must hold at least `self.size` bytes.
    pub fn get(self, bytes: &[u8]) -> u64 {
        match (self.size, self.order) {
            (4, ByteOrder::Little) => u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64,
            (4, ByteOrder::Big) => u32::from_be_bytes(bytes[..4].try_into().unwrap()) as u64,
            (_, ByteOrder::Little) => u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            (_, ByteOrder::Big) => u64::from_be_bytes(bytes[..8].try_into().unwrap()),
        }
    }
}

/// Sampling period in microseconds for a frequency in Hz, as gperftools computes it.
pub fn period_us_for_frequency(hz: u32) -> u64 {
    1_000_000 / u64::from(hz.max(1))
}
