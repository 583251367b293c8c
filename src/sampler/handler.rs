//! The profiling signal handler and the state it samples into.
//!
//! Everything reachable from [`on_profiling_signal`] is async-signal-safe: no allocation, no
//! locks, no formatting, no `std::io`, no thread-locals, no panicking operations on any input.
//! The session publishes a [`SamplerState`] through an atomic pointer; `unpublish` waits until
//! no handler can still be using it before the session frees it.

use super::context::interrupted_registers;
use super::scratch::ScratchPool;
use crate::table::{CallChainTable, TableConfig};
use crate::unwind::{self, thread_pointer, THREAD_STACKS};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// gperftools' `filter_in_thread`: called in the handler; a sample is kept only when it
/// returns non-zero.
#[derive(Clone, Copy, Debug)]
pub struct ThreadFilter {
    pub func: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub arg: *mut c_void,
}

// SAFETY: the C API contract makes the callback and its argument usable from any thread.
unsafe impl Send for ThreadFilter {}
unsafe impl Sync for ThreadFilter {}

/// What the handler needs while a profile is being taken.
pub struct SamplerState {
    pub table: CallChainTable,
    scratch: ScratchPool,
    filter: Option<ThreadFilter>,
    /// Signals that produced a sample attempt (after the filter).
    pub interrupts: AtomicU64,
}

impl SamplerState {
    pub fn new(table: TableConfig, filter: Option<ThreadFilter>) -> Self {
        SamplerState {
            scratch: ScratchPool::new(table.max_depth.max(1)),
            table: CallChainTable::new(table),
            filter,
            interrupts: AtomicU64::new(0),
        }
    }

    /// Takes one sample of the interrupted context `uc`, counted `weight` times.
    ///
    /// # Safety
    /// `uc` must be the ucontext of the signal being handled on this thread.
    unsafe fn sample(&self, uc: *const c_void, weight: u64) {
        if let Some(filter) = self.filter {
            if (filter.func)(filter.arg) == 0 {
                return;
            }
        }
        self.interrupts.fetch_add(1, Ordering::Relaxed);
        let Some(mut scratch) = self.scratch.claim() else {
            self.table.stats.samples.fetch_add(weight, Ordering::Relaxed);
            self.table.stats.lost.fetch_add(weight, Ordering::Relaxed);
            return;
        };
        let regs = interrupted_registers(uc);
        let tp = thread_pointer();
        let top = THREAD_STACKS.vouched_top(tp, regs.sp);
        if top.is_none() {
            THREAD_STACKS.request(tp, regs.sp);
        }
        let buf = scratch.buffer();
        let n = unwind::walk(regs, top, buf);
        self.table.record(&buf[..n], weight);
    }
}

static CURRENT: AtomicPtr<SamplerState> = AtomicPtr::new(std::ptr::null_mut());
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Makes `state` the target of every profiling signal from now on.
pub fn publish(state: Arc<SamplerState>) {
    let old = CURRENT.swap(Arc::into_raw(state) as *mut SamplerState, Ordering::SeqCst);
    debug_assert!(old.is_null(), "a sampler state was already published");
}

/// Stops handlers from using the published state and returns it once none can still be
/// inside it. If a handler seems stuck (its thread stopped by a debugger), the state is
/// leaked rather than freed under it, and `None` is returned.
pub fn unpublish() -> Option<Arc<SamplerState>> {
    let ptr = CURRENT.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if ptr.is_null() {
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::yield_now();
    }
    // SAFETY: `ptr` came from Arc::into_raw in `publish`, and no handler holds it any more:
    // any handler that loaded it incremented IN_FLIGHT first (SeqCst) and has decremented it.
    Some(unsafe { Arc::from_raw(ptr) })
}

/// The `SA_SIGINFO` handler for the profiling signal.
///
/// # Safety
/// Only the kernel calls it, with the `uc` of the signal being delivered.
pub unsafe extern "C" fn on_profiling_signal(_sig: c_int, _info: *mut libc::siginfo_t, uc: *mut c_void) {
    // SAFETY: errno is this thread's; it is restored so the interrupted code never sees ours.
    let errno = unsafe { libc::__errno_location() };
    let saved_errno = unsafe { *errno };
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let state = CURRENT.load(Ordering::SeqCst);
    if !state.is_null() {
        // SAFETY: `state` stays alive while IN_FLIGHT is non-zero (see `unpublish`); `uc` is
        // the kernel's ucontext for this signal.
        unsafe { (*state).sample(uc, 1) };
    }
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    unsafe { *errno = saved_errno };
}
