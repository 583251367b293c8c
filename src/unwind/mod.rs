//! Stack walking for the signal handler: DWARF CFI (framehop) or frame pointers, every stack
//! read checked against known stack ranges, with readability probes for anything not vouched for.

pub mod dwarf;
pub mod fp;
pub mod probe;
mod stack_reader;
pub mod thread_stacks;

pub use dwarf::DwarfUnwinder;
pub use fp::{walk, Registers};
pub use thread_stacks::{thread_pointer, THREAD_STACKS};
