//! What cpuprof owns inside the program it profiles, besides memory: its threads, its
//! descriptors (and the /proc files read through them), its futex words, the pages of its walk
//! stacks, its messages on the program's stderr, the names it keeps of the program's threads and
//! gives their system calls.
//! (The module was `sys`; it is named for where these things live, a process that is not
//! cpuprof's.)
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
