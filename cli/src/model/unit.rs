//! What a profile's counts measure: CPU samples (each the profile's period), one of a heap
//! profile's four values (pprof's sample types), already scaled back to the program's
//! allocations, or one of a contention profile's two (delay, contentions). The readers ([`crate::model::stacks`]) add counts whatever they are; the
//! renderers ask the unit how to name and print them.

use cpuprof::format::contention::{ContentionValue, View};
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
    /// A contention profile's `value`: nanoseconds waited (`delay`) or waits (`contentions`),
    /// charged to the waiters or the holders (`view`).
    Contention { value: ContentionValue, view: View },
}

/// A value `--sample-index` names: one of a heap profile's four or a contention profile's two
/// (pprof's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleValue {
    Heap(HeapValue),
    Contention(ContentionValue),
}

impl SampleValue {
    /// The value named `name`, if any.
    pub fn from_name(name: &str) -> Option<SampleValue> {
        HeapValue::from_name(name)
            .map(SampleValue::Heap)
            .or_else(|| ContentionValue::from_name(name).map(SampleValue::Contention))
    }

    /// pprof's name of the value.
    pub fn name(self) -> &'static str {
        match self {
            SampleValue::Heap(v) => v.name(),
            SampleValue::Contention(v) => v.name(),
        }
    }
}

impl Unit {
    /// The heap value counted, for a heap profile.
    pub fn heap_value(self) -> Option<HeapValue> {
        match self {
            Unit::Heap { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The contention value counted, for a contention profile.
    pub fn contention_value(self) -> Option<ContentionValue> {
        match self {
            Unit::Contention { value, .. } => Some(value),
            _ => None,
        }
    }

    /// Whether the counts are nanoseconds (a contention profile's `delay`).
    pub fn is_nanoseconds(self) -> bool {
        self.contention_value() == Some(ContentionValue::Delay)
    }

    /// The kind of profile, for messages: `a CPU profile`, `a heap profile (inuse_space)`.
    pub fn profile_kind(self) -> String {
        match self {
            Unit::Samples => "a CPU profile".to_string(),
            Unit::Heap { value, .. } => format!("a heap profile ({})", value.name()),
            Unit::Contention { value, view } => {
                format!(
                    "a contention profile ({}, charged to the {})",
                    value.name(),
                    view.name()
                )
            }
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
            Unit::Contention { value, .. } => value.name(),
        }
    }

    /// What one count is: `samples`, `bytes` or `objects`.
    pub fn counts(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Heap { value, .. } if value.is_bytes() => "bytes",
            Unit::Heap { .. } => "objects",
            Unit::Contention {
                value: ContentionValue::Delay,
                ..
            } => "nanoseconds",
            Unit::Contention { .. } => "waits",
        }
    }
}
