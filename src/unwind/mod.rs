//! Stack walking for the signal handler: frame pointers checked against known stack ranges,
//! with readability probes for anything not vouched for.

pub mod fp;
pub mod probe;
pub mod thread_stacks;

pub use fp::{walk, Registers};
pub use thread_stacks::{thread_pointer, THREAD_STACKS};
