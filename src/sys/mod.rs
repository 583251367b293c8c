//! What cpuprof holds inside the program besides memory: its own threads and descriptors.
//!
//! The program owns the process. It may block or `sigwait` for any signal, close or `dup2`
//! over any descriptor, and expects `open` to return the lowest free number. cpuprof's threads
//! therefore block every signal ([`thread::spawn_signal_free`]), and its long-lived
//! descriptors sit at high numbers and are checked to still be its own before each use
//! ([`fd::GuardedFd`], [`procfs`]).

pub mod fd;
pub mod futex;
pub mod messages;
pub mod pages;
pub mod procfs;
pub mod syscall_names;
pub mod thread;
pub mod thread_names;
