//! The heap profile's own thread, while a profile runs: every 100 ms it rebuilds the unwind
//! tables' snapshot when objects were loaded or unloaded ([`super::walker`]), finds the stacks
//! of threads seen for the first time (`unwind::THREAD_STACKS`), and writes a file when one
//! is due (`HEAP_PROFILE_TIME_INTERVAL`, or a trigger an allocation crossed). It blocks every
//! signal (`in_program::thread`) and ends when the profile stops. A forked child has none:
//! its files are written at its end and on demand, which also refresh the snapshot.

use super::recorder::{is_running, WALK_DEPTH};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static RUNNING: AtomicBool = AtomicBool::new(false);
const PERIOD: Duration = Duration::from_millis(100);

/// Starts the thread unless it runs. Not for the allocation path.
pub fn ensure_running() {
    if RUNNING.swap(true, Ordering::SeqCst) {
        return;
    }
    let builder = std::thread::Builder::new().name("cpuprof-heap".into());
    let spawned = crate::in_program::thread::spawn_signal_free(builder, || {
        while is_running() {
            super::walker::refresh_if_stale(WALK_DEPTH);
            crate::unwind::THREAD_STACKS.resolve_requests();
            super::dumps::when_due();
            std::thread::sleep(PERIOD);
        }
        RUNNING.store(false, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        RUNNING.store(false, Ordering::SeqCst);
        crate::say!("cpuprof: heap profile: no thread of its own ({e}): unwind tables are refreshed only when a file is written");
    }
}

/// In a forked child: the parent's thread is not here.
pub(crate) fn in_forked_child() {
    RUNNING.store(false, Ordering::SeqCst);
}
