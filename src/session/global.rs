//! The process's one profiling session, shared by the Rust API, the C API and autostart.

use super::{Options, Session, Summary};
use crate::error::Error;
use crate::sync::Mutex;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Who started the running session: only they stop it, so an application's `ProfilerStop`
/// cannot cut short a profile requested over HTTP, nor the other way round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The program: the Rust or C API, or `CPUPROFILE`.
    Program,
    /// An on-demand profile of the HTTP endpoint.
    OnDemand,
}

static CURRENT: Mutex<Option<(Session, Owner)>> = Mutex::new(None);

/// A snapshot of the running session, for `ProfilerGetCurrentState`.
#[derive(Clone, Debug)]
pub struct SessionInfo {
    pub path: PathBuf,
    pub start_time: SystemTime,
    pub samples: u64,
}

/// Starts the program's profile.
pub fn start(path: &Path, options: Options) -> Result<(), Error> {
    start_as(path, options, Owner::Program)
}

/// Starts an on-demand profile (the HTTP endpoint's).
pub fn start_on_demand(path: &Path, options: Options) -> Result<(), Error> {
    start_as(path, options, Owner::OnDemand)
}

fn start_as(path: &Path, options: Options, owner: Owner) -> Result<(), Error> {
    let mut current = CURRENT.lock();
    if let Some((running, _)) = current.as_ref() {
        return Err(Error::AlreadyRunning {
            path: running.path().to_path_buf(),
        });
    }
    *current = Some((Session::start(path, options)?, owner));
    Ok(())
}

/// Stops the program's profile (an on-demand one is not the program's to stop).
pub fn stop() -> Result<Summary, Error> {
    stop_if(|owner| owner == Owner::Program)
}

/// [`stop`], returning the profile's bytes too when it was kept in memory.
pub fn stop_keeping() -> Result<(Summary, Option<Vec<u8>>), Error> {
    stop_keeping_if(|owner| owner == Owner::Program)
}

/// Stops the on-demand profile, returning its bytes when it was kept in memory.
pub fn stop_on_demand_keeping() -> Result<(Summary, Option<Vec<u8>>), Error> {
    stop_keeping_if(|owner| owner == Owner::OnDemand)
}

/// A complete copy of the running profile so far (the program's or an on-demand one).
pub fn snapshot() -> Result<Vec<u8>, Error> {
    CURRENT.lock().as_ref().ok_or(Error::NotRunning)?.0.snapshot()
}

/// Stops the on-demand profile.
pub fn stop_on_demand() -> Result<Summary, Error> {
    stop_if(|owner| owner == Owner::OnDemand)
}

/// Stops whatever profile runs, at exit.
pub fn stop_any() -> Result<Summary, Error> {
    stop_if(|_| true)
}

fn stop_if(owned: impl Fn(Owner) -> bool) -> Result<Summary, Error> {
    stop_keeping_if(owned).map(|(summary, _)| summary)
}

fn stop_keeping_if(owned: impl Fn(Owner) -> bool) -> Result<(Summary, Option<Vec<u8>>), Error> {
    // The lock is held until the old session is fully stopped, so a concurrent start cannot
    // publish its state while this one is still being torn down.
    let mut current = CURRENT.lock();
    match current.take() {
        Some((session, owner)) if owned(owner) => session.stop_keeping(),
        other => {
            *current = other;
            Err(Error::NotRunning)
        }
    }
}

/// The session's lock, held across `fork` (`children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &CURRENT
}

/// In a forked child, where the fork handlers made CURRENT consistent and free: the parent's
/// session is forgotten (never stopped, written or freed here: it is the parent's), and
/// `start_child` may start the child's own from it. Only a profile the program owns is
/// followed: an on-demand one belongs to the parent's HTTP client.
pub(crate) fn replace_in_forked_child(start_child: impl FnOnce(&Session) -> Option<Session>) {
    let mut current = CURRENT.lock();
    let Some((parent, owner)) = current.take() else {
        return;
    };
    let child = if owner == Owner::Program {
        start_child(&parent)
    } else {
        None
    };
    std::mem::forget(parent);
    *current = child.map(|session| (session, Owner::Program));
}

pub fn flush() -> Result<(), Error> {
    CURRENT.lock().as_ref().ok_or(Error::NotRunning)?.0.flush();
    Ok(())
}

pub fn info() -> Option<SessionInfo> {
    CURRENT.lock().as_ref().map(|(s, _)| SessionInfo {
        path: s.path().to_path_buf(),
        start_time: s.start_time(),
        samples: s.samples_so_far(),
    })
}
