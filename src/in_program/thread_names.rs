//! The names of the program's threads, for profiles whose samples carry their thread (wall
//! clock, and CPU profiles with thread labels). A name is read while its thread lives: by the
//! wall sampler as it looks at threads, by the task poll when it finds a thread nothing
//! announced, by a thread that libcpuprof.so started as it exits, and at the end for threads
//! still running. Thread ids are reused only after the thread is gone; a profile names a
//! reused id by its latest thread.

use crate::sync::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

static NAMES: Mutex<BTreeMap<u32, Vec<u8>>> = Mutex::new(BTreeMap::new());
/// Whether the running profile's samples name threads: the hooks on thread exit and on the
/// task poll read names only then.
static WANTED: AtomicBool = AtomicBool::new(false);

/// The names' lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &NAMES
}

/// In a forked child: the names are the parent's threads'.
pub fn forget_in_child() {
    lock().clear();
}

/// Names are wanted (a profile with thread labels runs) or not.
pub fn want(on: bool) {
    WANTED.store(on, Ordering::Relaxed);
}

pub fn wanted() -> bool {
    WANTED.load(Ordering::Relaxed)
}

/// Reads thread `tid`'s name (`/proc/self/task/TID/comm`); false if it could not be read
/// (the thread is gone).
pub fn read(tid: libc::pid_t) -> bool {
    let Ok(mut name) = std::fs::read(format!("/proc/self/task/{tid}/comm")) else {
        return false;
    };
    if name.last() == Some(&b'\n') {
        name.pop();
    }
    remember(tid as u32, name);
    true
}

/// Reads `tid`'s name unless it is known already.
pub fn read_if_unknown(tid: libc::pid_t) {
    let known = lock().contains_key(&(tid as u32));
    if !known {
        read(tid);
    }
}

/// Records the calling thread's name (`PR_GET_NAME`: no file to open), as thread `tid`.
pub fn remember_own(tid: libc::pid_t) {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL-terminated, into `name`.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0 {
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        remember(tid as u32, name[..len].to_vec());
    }
}

/// Thread `tid`'s name, if read.
pub fn get(tid: u32) -> Option<Vec<u8>> {
    lock().get(&tid).cloned()
}

fn remember(tid: u32, name: Vec<u8>) {
    lock().insert(tid, name);
}

fn lock() -> MutexGuard<'static, BTreeMap<u32, Vec<u8>>> {
    NAMES.lock()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_named_from_proc_and_by_itself() {
        let name = std::thread::Builder::new()
            .name("named-here".into())
            .spawn(|| {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                remember_own(tid);
                let own = get(tid as u32);
                assert!(read(tid));
                assert_eq!(get(tid as u32), own);
                own
            })
            .unwrap()
            .join()
            .unwrap();
        // (Not checked after the join: the kernel clears the thread id that join waits on
        // before the thread leaves /proc, and under qemu the host thread may linger.)
        assert_eq!(name.as_deref(), Some(&b"named-here"[..]));
        assert!(!read(-1), "no such thread");
    }
}
