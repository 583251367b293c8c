//! Errors of the control plane: starting, flushing and stopping a profile (through
//! [`Profiler`](crate::Profiler), the C API or `CPUPROFILE`). Their messages name the file and
//! the cause, ready to print as they are.

use crate::sampler::SignalError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why starting, flushing or stopping a profile failed.
///
/// The I/O variants keep the underlying [`io::Error`] as their
/// [`source`](std::error::Error::source).
#[derive(Debug)]
pub enum Error {
    /// A profile is already being taken in this process (one at a time).
    AlreadyRunning {
        /// The file the running profile is being written to.
        path: PathBuf,
    },
    /// No profile is being taken.
    NotRunning,
    /// The profile file could not be created.
    Open {
        /// The file that was to be created.
        path: PathBuf,
        /// Why creating it failed.
        source: io::Error,
    },
    /// Writing the profile failed (full disk, I/O error); the records before the failure are
    /// in the file.
    Write {
        /// The profile file.
        path: PathBuf,
        /// The failed write's error.
        source: io::Error,
    },
    /// The profiling signal belongs to the application.
    Signal(SignalError),
    /// The timer could not be armed.
    Timer(io::Error),
    /// The writer thread could not be started.
    Spawn(io::Error),
    /// `stop` was called in a child forked from the profiled process: the profile belongs to
    /// the parent, so the child leaves the file alone.
    ForkedChild {
        /// The parent's profile file.
        path: PathBuf,
    },
    /// A profile could not be read back (for a [`Report`](crate::Report)): the reader's
    /// message.
    Read(String),
    /// The event of an event profile cannot be counted here: a name or period cpuprof does
    /// not take, no hardware counters for it (most virtual machines), or `perf_event_open`
    /// refused. The message says which, naming the event.
    Event(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::AlreadyRunning { path } => write!(f, "a profile is already being written to '{}'", path.display()),
            Error::NotRunning => write!(f, "no profile is being taken"),
            Error::Open { path, source } => write!(f, "cannot create profile '{}': {}", path.display(), source),
            Error::Write { path, source } => write!(f, "writing profile '{}' failed: {}", path.display(), source),
            Error::Signal(e) => write!(f, "cannot profile: {e}"),
            Error::Timer(e) => write!(f, "cannot arm the profiling timer: {e}"),
            Error::Spawn(e) => write!(f, "cannot start the profile writer thread: {e}"),
            Error::Read(e) => write!(f, "cannot read the profile: {e}"),
            Error::Event(e) => write!(f, "cannot profile {e}"),
            Error::ForkedChild { path } => {
                write!(
                    f,
                    "profile '{}' belongs to the parent process; this forked child does not write it",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Open { source, .. } | Error::Write { source, .. } | Error::Timer(source) | Error::Spawn(source) => {
                Some(source)
            }
            _ => None,
        }
    }
}
