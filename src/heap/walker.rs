//! How a sampled allocation's call chain is walked: as CPU samples are when a CPU profile
//! runs (its DWARF snapshot, kept current by its writer); otherwise with the heap profile's
//! own snapshot of the unwind tables, on a stack of its own (a DWARF walk needs ~17 KiB, more
//! than the allocating thread may have left); by frame pointers when neither is at hand.
//! Frame pointers alone would lose the caller of every function built without them — the
//! allocating function itself, in most C and C++ code built with -O2, and `operator new`.
//!
//! The snapshot is built when the heap profile starts and rebuilt, off the allocation path,
//! when objects were loaded or unloaded since ([`refresh_if_stale`], from the poller and
//! before each file). A walk holds [`IN_FLIGHT`] while it uses the snapshot, so a replaced one
//! is freed only when no walk can be using it (or leaked if one seems stuck).

use crate::claim_pool::ClaimPool;
use crate::sampler::walk_stack::Workspace;
use crate::sync::Mutex;
use crate::unwind::{self, DwarfUnwinder, Registers, StackReader, THREAD_STACKS};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Walker {
    dwarf: DwarfUnwinder,
    workspaces: ClaimPool<Workspace>,
}

static WALKER: AtomicPtr<Walker> = AtomicPtr::new(std::ptr::null_mut());
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static REFRESHING: Mutex<()> = Mutex::new(());

fn build(depth: usize) -> Walker {
    let workspaces = std::thread::available_parallelism().map_or(8, |n| (2 * n.get()).clamp(8, 64));
    Walker {
        dwarf: DwarfUnwinder::build(),
        workspaces: ClaimPool::new(workspaces, workspaces, || Workspace::new(depth)),
    }
}

/// Builds the snapshot if there is none, or if objects were loaded or unloaded since it was
/// built. Not for the allocation path. `depth`: frames a walk keeps.
pub fn refresh_if_stale(depth: usize) {
    let Some(_one) = REFRESHING.try_lock() else { return };
    // SAFETY: only refreshers (serialised above) free a walker, and this one is not freed
    // while we look at it.
    let current = unsafe { WALKER.load(Ordering::SeqCst).as_ref() };
    if current.is_some_and(|w| !w.dwarf.is_stale()) {
        return;
    }
    let old = WALKER.swap(Box::into_raw(Box::new(build(depth))), Ordering::SeqCst);
    if old.is_null() {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(200);
    while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        if Instant::now() > deadline {
            // A walk seems stuck (its thread stopped): leave the old snapshot to it.
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: from Box::into_raw, and no walk holds it any more (IN_FLIGHT was 0 after the
    // swap, SeqCst on both sides).
    drop(unsafe { Box::from_raw(old) });
}

/// Makes walks possible before a profile starts: the snapshot built (or rebuilt if stale), and
/// `/proc/self/mem` kept open, through which stack memory of threads not yet known is read.
/// Not for the allocation or lock path.
pub fn prepare(depth: usize) {
    refresh_if_stale(depth);
    let _ = unwind::safe_read::keep_open();
}

/// The call chain at `regs` (the calling thread's registers) into `out`, PC first.
/// Async-signal-safe.
pub fn walk(regs: Registers, out: &mut [u64]) -> usize {
    let n = crate::sampler::walk_outside_handler(regs, out);
    if n > 0 {
        return n;
    }
    let tp = unwind::thread_pointer();
    let top = THREAD_STACKS.vouched_top(tp, regs.sp);
    if top.is_none() {
        THREAD_STACKS.request(tp, regs.sp);
    }
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    // SAFETY: a walker stays alive while IN_FLIGHT is non-zero (`refresh_if_stale`).
    let walker = unsafe { WALKER.load(Ordering::SeqCst).as_ref() };
    let n = walker.map_or(0, |w| {
        let Some(mut workspace) = w.workspaces.claim() else {
            return 0;
        };
        let n = workspace.run(|frames, window| {
            let mut stack = StackReader::new(regs.sp, top, window);
            w.dwarf
                .walk(regs, &mut stack, frames, false)
                .unwrap_or_else(|| unwind::walk(regs, &mut stack, frames))
        });
        let kept = n.min(out.len());
        out[..kept].copy_from_slice(&workspace.frames[..kept]);
        kept
    });
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    if n > 0 {
        return n;
    }
    let mut window = [0u64; 32];
    unwind::walk(regs, &mut StackReader::new(regs.sp, top, &mut window), out)
}
