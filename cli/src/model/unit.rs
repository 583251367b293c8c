//! What a profile's counts measure: CPU samples (each the profile's period), or one of a heap
//! profile's four values (pprof's sample types), already scaled back to the program's
//! allocations. The readers ([`crate::model::stacks`]) add counts whatever they are; the
//! renderers ask the unit how to name and print them.

use cpuprof::format::heap::HeapValue;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unit {
    /// Samples of a CPU (or wall-clock) profile; `period_us` of the stacks says what one is
    /// worth.
    #[default]
    Samples,
    /// A heap profile's `value` (bytes or objects), each line scaled back from its samples as
    /// pprof does; `period` is the mean bytes between samples (`heap_v2/N`; 1 when every
    /// allocation was recorded).
    Heap { value: HeapValue, period: u64 },
}

impl Unit {
    /// The heap value counted, for a heap profile.
    pub fn heap_value(self) -> Option<HeapValue> {
        match self {
            Unit::Samples => None,
            Unit::Heap { value, .. } => Some(value),
        }
    }

    /// Whether the counts are bytes (a heap profile's `*_space`).
    pub fn is_bytes(self) -> bool {
        self.heap_value().is_some_and(HeapValue::is_bytes)
    }

    /// What the counts are called: `samples`, or pprof's name of the heap value
    /// (`inuse_space`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Heap { value, .. } => value.name(),
        }
    }

    /// What one count is: `samples`, `bytes` or `objects`.
    pub fn counts(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Heap { value, .. } if value.is_bytes() => "bytes",
            Unit::Heap { .. } => "objects",
        }
    }
}
