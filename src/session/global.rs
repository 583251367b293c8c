//! The process's one profiling session, shared by the Rust API, the C API and autostart.

use super::{Options, Report, Session};
use crate::error::Error;
use crate::sync::Mutex;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

static CURRENT: Mutex<Option<Session>> = Mutex::new(None);

/// A snapshot of the running session, for `ProfilerGetCurrentState`.
#[derive(Clone, Debug)]
pub struct SessionInfo {
    pub path: PathBuf,
    pub start_time: SystemTime,
    pub samples: u64,
}

pub fn start(path: &Path, options: Options) -> Result<(), Error> {
    let mut current = CURRENT.lock();
    if let Some(running) = current.as_ref() {
        return Err(Error::AlreadyRunning {
            path: running.path().to_path_buf(),
        });
    }
    *current = Some(Session::start(path, options)?);
    Ok(())
}

pub fn stop() -> Result<Report, Error> {
    // The lock is held until the old session is fully stopped, so a concurrent start cannot
    // publish its state while this one is still being torn down.
    let mut current = CURRENT.lock();
    current.take().ok_or(Error::NotRunning)?.stop()
}

pub fn flush() -> Result<(), Error> {
    CURRENT.lock().as_ref().ok_or(Error::NotRunning)?.flush();
    Ok(())
}

pub fn info() -> Option<SessionInfo> {
    CURRENT.lock().as_ref().map(|s| SessionInfo {
        path: s.path().to_path_buf(),
        start_time: s.start_time(),
        samples: s.samples_so_far(),
    })
}
