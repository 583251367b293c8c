//! Stack walking for the signal handler: DWARF CFI (framehop) or frame pointers, every stack
//! read checked against known stack ranges, and copied by the kernel where nothing vouches for it.

pub mod dwarf;
pub mod fp;
#[cfg(target_arch = "x86_64")]
pub mod frame_records;
pub mod safe_read;
pub mod stack_reader;
pub mod thread_stacks;

pub use dwarf::DwarfUnwinder;
pub use fp::{walk, Registers};
pub use stack_reader::StackReader;
pub use thread_stacks::{thread_pointer, THREAD_STACKS};
