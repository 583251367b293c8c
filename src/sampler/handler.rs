//! The profiling signal handler and the state it samples into.
//!
//! Everything reachable from [`on_profiling_signal`] is async-signal-safe: no allocation, no
//! locks, no formatting, no `std::io`, no thread-locals, no panicking operations on any input.
//! The session publishes a [`SamplerState`] through an atomic pointer; `unpublish` waits until
//! no handler can still be using it before the session frees it.

use super::thread_accounts::{self, Delivery};
use super::thread_timers::ThreadTimerKind;
use super::timer::Clock;
use super::walk_stack::Workspace;
use super::{perf_event, runnable_debts};
use crate::arch::{interrupted_registers, SigInfoFields};
use crate::claim_pool::ClaimPool;
use crate::format::{sample_labels, SampleContext, SignalWeights, ThreadState};
use crate::table::{CallChainTable, TableConfig};
use crate::unwind::{self, thread_pointer, DwarfUnwinder, Registers, StackReader, THREAD_STACKS};
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

/// Which stack walker the handler uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwinderChoice {
    /// DWARF CFI where the code has it, frame pointers where it has none (the default).
    Auto,
    /// Frame pointers only: cheapest, but wrong for code built without them.
    FramePointer,
}

/// What delivers the profiling signal, which decides how a signal is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleSource {
    /// A process-wide interval timer: one sample per signal and overrun.
    ProcessTimer(Clock),
    /// A timer per thread: POSIX CPU timers count `1 + si_overrun`; perf events are re-armed.
    ThreadTimers(ThreadTimerKind),
}

/// What the handler needs while a profile is being taken.
pub struct SamplerState {
    pub table: CallChainTable,
    /// Frame buffers and walk stacks, so the handler's own stack use is small and fixed
    /// (handlers may run on small alternate signal stacks).
    workspaces: ClaimPool<Workspace>,
    /// Workspaces beyond one per thread (and the pool's first size): two per CPU, 16 to 64.
    spare_workspaces: usize,
    filter: Option<ThreadFilter>,
    unwinder: UnwinderChoice,
    source: SampleSource,
    /// Signals that produced a sample attempt (after the filter).
    pub interrupts: AtomicU64,
    /// The weights of the samples recorded, for their effective number of observations.
    weights: WeightCounters,
    /// Which samples carry their thread and state.
    labels: Labels,
    /// [`Labels::Beside`]: the weights of the wall profile's samples.
    wall_weights: WeightCounters,
    /// Called after each sample while the process has no writer thread to drain the ring
    /// (`writer::threadless`); must be async-signal-safe.
    after_sample: Option<fn(&SamplerState)>,
}

/// Which samples carry their thread and state ([`SampleContext`]: a marker ending the chain,
/// which the writer takes off into the file's context lines) and so belong to a wall profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labels {
    /// A CPU profile: none.
    None,
    /// A wall-clock profile: every sample.
    All,
    /// A CPU profile whose samples name their threads: every sample, on the CPU.
    Threads,
    /// A wall-clock profile beside the CPU profile: CPU samples are recorded plain, and
    /// labelled for the wall profile as many times as the thread's CPU time they cover holds
    /// multiples of the wall period (systematic thinning per thread: over a thread's life its
    /// samples cover its CPU time end to end, so its wall samples add up to its CPU time in
    /// wall periods); the wall sampler's samples are labelled.
    Beside { cpu_period_ns: u64, wall_period_ns: u64 },
}

/// Running sums of recorded samples' weights ([`SignalWeights`]). Relaxed atomics: the sums
/// are read once the handlers are done (at stop) or as a snapshot whose parts may be a few
/// signals apart, which moves an estimate by as little.
#[derive(Default)]
struct WeightCounters {
    signals: AtomicU64,
    sum: AtomicU64,
    sum_of_squares: AtomicU64,
}

impl WeightCounters {
    /// Async-signal-safe.
    fn add(&self, weight: u64) {
        self.signals.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(weight, Ordering::Relaxed);
        self.sum_of_squares
            .fetch_add(weight.saturating_mul(weight), Ordering::Relaxed);
    }

    fn snapshot(&self) -> SignalWeights {
        SignalWeights {
            signals: self.signals.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
            sum_of_squares: self.sum_of_squares.load(Ordering::Relaxed),
        }
    }
}

impl SamplerState {
    pub fn new(
        table: TableConfig,
        filter: Option<ThreadFilter>,
        unwinder: UnwinderChoice,
        source: SampleSource,
        labels: Labels,
    ) -> Self {
        // Asked once: `available_parallelism` reads cgroup files, and a descriptor opened
        // while the program runs could take the number its own open() expects.
        let spare_workspaces = concurrent_handlers();
        SamplerState {
            labels,
            wall_weights: WeightCounters::default(),
            unwinder,
            source,
            // Twice the spares at first: a program with a dozen threads never grows the pool, so
            // its thread starts allocate nothing (a new thread's first malloc maps an arena).
            workspaces: ClaimPool::new(2 * spare_workspaces, crate::claim_pool::MAX_ITEMS, || {
                Workspace::new(table.max_depth)
            }),
            spare_workspaces,
            table: CallChainTable::new(table),
            filter,
            interrupts: AtomicU64::new(0),
            weights: WeightCounters::default(),
            after_sample: None,
        }
    }

    /// Makes walk workspaces until there are enough for `threads` threads to be in a handler
    /// at once (each can be in one at a time), with some to spare for walks outside handlers.
    /// On a loaded machine many handlers are preempted at once: with too few workspaces their
    /// samples were lost (40 % of them with 512 threads beside two busy processes on two
    /// cores). Called as threads start ([`workspaces_for_threads`]) and by the writer's poll.
    pub fn ensure_workspaces(&self, threads: usize) {
        // A quarter more than the threads: threads created in a burst are armed by the
        // writer's poll before each reaches its own start, where it would grow the pool.
        let wanted = threads + threads / 4 + self.spare_workspaces;
        if self.workspaces.len() < wanted {
            // In steps of 16: a burst of thread starts makes them a few at a time.
            let wanted = wanted.next_multiple_of(16);
            let depth = self.table.max_depth();
            self.workspaces.grow_to(wanted, || Workspace::new(depth));
        }
    }

    /// How many walk workspaces are made.
    pub fn workspace_count(&self) -> usize {
        self.workspaces.made()
    }

    /// Has `hook` called after each sample (before the state is published). The hook must be
    /// async-signal-safe.
    pub fn call_after_each_sample(&mut self, hook: fn(&SamplerState)) {
        self.after_sample = Some(hook);
    }

    /// How many samples this signal stands for, re-arming a perf event if one sent it, and for
    /// a POSIX timer's, where its periods fall on the thread's lattice (when it has an account).
    ///
    /// # Safety
    /// `info` must be the siginfo of the signal being handled.
    unsafe fn signal_weight(&self, info: *const libc::siginfo_t) -> (u64, Option<Delivery>) {
        let info = &*(info as *const SigInfoFields);
        match self.source {
            // Per-thread timers of either kind: a perf registry gives POSIX timers to threads
            // it cannot give an event, so the signal's code tells which sent it.
            SampleSource::ThreadTimers(_) if info.code == libc::SI_TIMER => {
                let periods = 1 + info.timer_overrun.max(0) as u64;
                (periods, thread_accounts::credit(thread_pointer(), periods))
            }
            // Kernel-generated SIGPOLL-style codes are positive; signals sent by kill or
            // sigqueue are not, and carry no fd of ours.
            SampleSource::ThreadTimers(ThreadTimerKind::Perf) if info.code > 0 => {
                (perf_event::rearm_and_weigh(info.poll_fd), None)
            }
            // The process timer is a POSIX timer too: expiries while its signal was still
            // pending (no thread of the process ran to take it, on a busy machine) are its
            // overruns, not lost (10 % of the samples of 512 threads beside two busy processes).
            SampleSource::ProcessTimer(_) if info.code == libc::SI_TIMER => {
                (1 + info.timer_overrun.max(0) as u64, None)
            }
            _ => (1, None),
        }
    }

    /// Takes one sample of the interrupted context `uc`, counted `weight` times.
    ///
    /// # Safety
    /// `uc` must be the ucontext of the signal being handled on this thread.
    unsafe fn sample(&self, in_flight: &InFlight, uc: *const c_void, (weight, delivery): (u64, Option<Delivery>)) {
        if let Some(filter) = self.filter {
            if (filter.func)(filter.arg) == 0 {
                return;
            }
        }
        self.interrupts.fetch_add(1, Ordering::Relaxed);
        if weight == 0 {
            // A perf event's signal that stands for no CPU time yet (`rearm_and_weigh`).
            return;
        }
        let Some(mut workspace) = self.workspaces.claim() else {
            // Every workspace is held (handlers preempted in great numbers, faster than threads
            // grow the pool): the sample keeps its function, without callers, rather than being
            // lost, and is counted.
            let mut chain = [interrupted_registers(uc).pc, 0, 0];
            self.table.stats.without_callers.fetch_add(weight, Ordering::Relaxed);
            self.record_own(&mut chain, 1, weight, delivery, crate::labels::current_id());
            return;
        };
        let n = self.walk(in_flight, interrupted_registers(uc), true, &mut workspace);
        // Custom labels are read and interned with a few KiB of buffers: on the walk's stack.
        let label = workspace.run(|_, _| crate::labels::sample_id() as usize) as u32;
        self.record_own(&mut workspace.frames, n, weight, delivery, label);
    }

    /// Records `weight` periods of the calling thread's time on the CPU at the chain
    /// `frames[..n]`, as the labels ask: plain, labelled, or both; `frames` may be overwritten
    /// past `n`. `delivery` places the periods on the thread's timer lattice when it is known.
    /// `label`: the number of the thread's label set, 0 for none. Async-signal-safe.
    fn record_own(&self, frames: &mut [u64], n: usize, weight: u64, delivery: Option<Delivery>, label: u32) {
        if n == 0 || frames.len() < 3 {
            return;
        }
        // The thread's label set, if it has one, ends the chain (before a context's marker).
        let label = (label != 0).then(|| sample_labels::marker(label));
        let plain = with_markers(frames, n, label.as_slice());
        let wall_share = match self.labels {
            Labels::None => {
                self.table.record(&frames[..plain], weight);
                self.weights.add(weight);
                return;
            }
            Labels::All | Labels::Threads => weight,
            Labels::Beside {
                cpu_period_ns,
                wall_period_ns,
            } => {
                self.table.record(&frames[..plain], weight);
                self.weights.add(weight);
                // The thread's CPU time these periods cover. From the lattice, consecutive
                // signals tile it exactly; the CPU time at handling would not: a signal handled
                // late (on a crowded CPU, by up to a time slice) would cover a stretch that
                // overlaps the next one's or leaves a gap (up to +47 % on one CPU shared by
                // two busy threads). Without an account (perf timers, a full table), the
                // stretch that ends now.
                let (start, end) = match delivery {
                    Some(d) => d.cpu_span(cpu_period_ns),
                    None => {
                        let now = thread_accounts::thread_cpu_ns();
                        (now.saturating_sub(weight.saturating_mul(cpu_period_ns)), now)
                    }
                };
                (end / wall_period_ns).saturating_sub(start / wall_period_ns)
            }
        };
        // The chain ends in this thread's on-CPU marker, in place of its outermost frame if it
        // fills `frames`.
        let context = SampleContext {
            // SAFETY: gettid is a plain system call.
            tid: unsafe { libc::gettid() } as u32,
            state: ThreadState::OnCpu,
        };
        let n = match label {
            Some(label) => with_markers(frames, n, &[label, context.marker()]),
            None => with_markers(frames, n, &[context.marker()]),
        };
        if wall_share > 0 {
            self.table.record(&frames[..n], wall_share);
            self.label_weights().add(wall_share);
        }
        // Time the wall sampler found this thread runnable since its last sample: charged to
        // the stack it is at now, where it was preempted (`runnable_debts`).
        let owed = runnable_debts::take(context.tid);
        if owed > 0 {
            frames[n - 1] = SampleContext {
                state: ThreadState::Runnable,
                ..context
            }
            .marker();
            self.table.record(&frames[..n], owed);
            self.label_weights().add(owed);
        }
    }

    /// The weights labelled samples count in: the wall profile's own beside a CPU profile.
    fn label_weights(&self) -> &WeightCounters {
        match self.labels {
            Labels::Beside { .. } => &self.wall_weights,
            _ => &self.weights,
        }
    }

    /// The weights of the wall profile's samples beside a CPU profile
    /// ([`Labels::Beside`]).
    pub fn wall_signal_weights(&self) -> SignalWeights {
        self.wall_weights.snapshot()
    }

    /// The weights of the samples recorded so far.
    pub fn signal_weights(&self) -> SignalWeights {
        self.weights.snapshot()
    }

    /// Walks the stack at `regs` into `workspace.frames`, on the workspace's own stack, as
    /// every sample is walked: the calling thread's own stack (`own`: its registry range
    /// vouches for reads), or another thread's, every word of which is copied by the kernel.
    /// `in_flight`: the caller's guard, which keeps the DWARF unwinder alive.
    fn walk(&self, in_flight: &InFlight, regs: Registers, own: bool, workspace: &mut Workspace) -> usize {
        let top = if own {
            let tp = thread_pointer();
            let top = THREAD_STACKS.vouched_top(tp, regs.sp);
            if top.is_none() {
                THREAD_STACKS.request(tp, regs.sp);
            }
            top
        } else {
            None
        };
        let dwarf = match self.unwinder {
            UnwinderChoice::Auto => in_flight.dwarf(),
            UnwinderChoice::FramePointer => None,
        };
        workspace.run(|frames, window| {
            let mut stack = StackReader::new(regs.sp, top, window);
            // Another thread's registers come from /proc/.../syscall, without rbp.
            match dwarf.and_then(|d| d.walk(regs, &mut stack, frames, !own)) {
                Some(n) => n,
                None => unwind::walk(regs, &mut stack, frames),
            }
        })
    }
}

/// Called by a thread as it starts, before its timer is armed: the running profile gets walk
/// workspaces for every thread ([`SamplerState::ensure_workspaces`]). Not for signal context.
pub fn workspaces_for_threads() {
    // Counted here, not from /proc (no descriptor is opened in the program's thread start):
    // the threads started through the interposer and not yet ended, and the main thread.
    let threads = STARTED_THREADS.fetch_add(1, Ordering::Relaxed) + 2;
    let in_flight = InFlight::enter();
    if let Some(state) = in_flight.state() {
        state.ensure_workspaces(threads);
    }
}

/// Called by a thread started through the interposer as it ends (see
/// [`workspaces_for_threads`]).
pub fn thread_ended() {
    let _ = STARTED_THREADS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
}

/// Threads started through the interposer and not yet ended.
static STARTED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// The call chain from `regs` (the calling thread's), walked as samples are and copied into
/// `out`, for call chains recorded outside the handler beside the ones it records: a thread's
/// start notes what called its start routine. The walk runs on a workspace's own stack (a
/// DWARF walk needs ~17 KiB, more than a small thread stack may have left); with no profile
/// running or no workspace free, the chain is empty.
pub fn walk_outside_handler(regs: Registers, out: &mut [u64]) -> usize {
    let in_flight = InFlight::enter();
    in_flight.state().map_or(0, |state| {
        let Some(mut workspace) = state.workspaces.claim() else {
            return 0;
        };
        let n = state.walk(&in_flight, regs, true, &mut workspace);
        let kept = n.min(out.len());
        out[..kept].copy_from_slice(&workspace.frames[..kept]);
        kept
    })
}

/// The call chain of another thread of this process stopped at `regs` (a thread blocked in
/// the kernel, its user registers from `/proc/self/task/TID/syscall`), walked over copies of
/// its stack made by the kernel, so a stack unmapped meanwhile makes a read fail, not fault.
/// Empty with no profile running or no workspace free. Not for signal context (the caller is
/// the wall sampler thread), though nothing here would break in it.
pub fn walk_other_thread(regs: Registers, out: &mut [u64]) -> usize {
    let in_flight = InFlight::enter();
    in_flight.state().map_or(0, |state| {
        let Some(mut workspace) = state.workspaces.claim() else {
            return 0;
        };
        let n = state.walk(&in_flight, regs, false, &mut workspace);
        let kept = n.min(out.len());
        out[..kept].copy_from_slice(&workspace.frames[..kept]);
        kept
    })
}

/// The walk workspaces a profile starts with: two per CPU, 16 to 64 (more are made as
/// threads start: [`SamplerState::ensure_workspaces`]).
fn concurrent_handlers() -> usize {
    std::thread::available_parallelism().map_or(16, |n| (2 * n.get()).clamp(16, 64))
}

static CURRENT: AtomicPtr<SamplerState> = AtomicPtr::new(std::ptr::null_mut());
static DWARF: AtomicPtr<DwarfUnwinder> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers (and calls outside them) using [`CURRENT`] or [`DWARF`]: see [`InFlight`].
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One use of the published state (and DWARF unwinder) under way: while any guard lives,
/// IN_FLIGHT is non-zero and [`unpublish`] and [`set_dwarf`] wait before freeing what they
/// swapped out. Entered (SeqCst) before either pointer is loaded, so a guard that saw a pointer
/// keeps it alive until the guard drops (SeqCst); the references it hands out borrow the guard,
/// so none outlives it. Async-signal-safe: two atomic operations, nothing that can panic.
struct InFlight(());

impl InFlight {
    #[inline(always)]
    fn enter() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight(())
    }

    /// The published state, if a profile is running.
    #[inline(always)]
    fn state(&self) -> Option<&SamplerState> {
        // SAFETY: the state stays alive while IN_FLIGHT is non-zero (see `unpublish`), which it
        // is for as long as `self` is borrowed.
        unsafe { CURRENT.load(Ordering::SeqCst).as_ref() }
    }

    /// The published DWARF unwinder, if any.
    #[inline(always)]
    fn dwarf(&self) -> Option<&DwarfUnwinder> {
        // SAFETY: a published unwinder stays alive while IN_FLIGHT is non-zero (`set_dwarf`).
        unsafe { DWARF.load(Ordering::SeqCst).as_ref() }
    }
}

impl Drop for InFlight {
    #[inline(always)]
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}
/// How long to wait for handlers to leave before giving up on freeing what they might use.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits until no handler is running. Any handler that loaded a pointer before it was
/// swapped out had incremented IN_FLIGHT first (SeqCst), so afterwards none can still hold it.
pub fn wait_for_handlers() -> bool {
    let deadline = Instant::now() + QUIESCE_TIMEOUT;
    while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Makes `unwinder` the DWARF unwinder handlers use (None: frame pointers only) and frees
/// the previous one once no handler can be using it. If a handler seems stuck, the old
/// snapshot is leaked rather than freed under it.
pub fn set_dwarf(unwinder: Option<Box<DwarfUnwinder>>) {
    let new = unwinder.map_or(std::ptr::null_mut(), Box::into_raw);
    let old = DWARF.swap(new, Ordering::SeqCst);
    if !old.is_null() && wait_for_handlers() {
        // SAFETY: `old` came from Box::into_raw and no handler can hold it any more.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// Replaces the DWARF unwinder, if one is in use, when objects were loaded or unloaded since
/// it was built. Not for signal context.
pub fn refresh_dwarf() {
    // SAFETY: only the control plane swaps DWARF, and callers of this function are the control
    // plane, so the snapshot cannot be freed while we look at it.
    let stale = unsafe { DWARF.load(Ordering::SeqCst).as_ref() }.is_some_and(DwarfUnwinder::is_stale);
    if stale {
        set_dwarf(Some(Box::new(DwarfUnwinder::build())));
    }
}

/// Runs `f` on the published state, if any, as a handler would (it stays alive meanwhile).
/// Async-signal-safe if `f` is: for the process-ending paths, which may run in a signal
/// handler.
pub fn with_published_state<R>(f: impl FnOnce(&SamplerState) -> R) -> Option<R> {
    let in_flight = InFlight::enter();
    in_flight.state().map(f)
}

/// In a forked child: the parent's published state is not the child's to sample into or free
/// (it is left as it is, unreachable), and handlers that were running in the parent's other
/// threads at the fork do not exist here. Not for signal context.
pub fn forget_in_forked_child() {
    CURRENT.store(std::ptr::null_mut(), Ordering::SeqCst);
    IN_FLIGHT.store(0, Ordering::SeqCst);
}

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
    if ptr.is_null() || !wait_for_handlers() {
        return None;
    }
    // SAFETY: `ptr` came from Arc::into_raw in `publish`, and no handler holds it any more.
    Some(unsafe { Arc::from_raw(ptr) })
}

/// Ends the chain `frames[..n]` with `markers` (a label set's, then a context's), in place of
/// its outermost frames where `frames` is full; the chain's new length.
fn with_markers(frames: &mut [u64], n: usize, markers: &[u64]) -> usize {
    let n = n.min(frames.len() - markers.len());
    frames[n..n + markers.len()].copy_from_slice(markers);
    n + markers.len()
}

/// Adds `weight` samples of the calling thread's call chain `pcs` from outside signal context:
/// a thread settling, as it exits, what its timer owed it (time on the CPU). Nothing is
/// recorded when no profile is running.
pub fn record_outside_handler(pcs: &[u64], weight: u64, delivery: Option<Delivery>) {
    let in_flight = InFlight::enter();
    if let Some(state) = in_flight.state() {
        let mut chain = [0u64; thread_accounts::ROOT_FRAMES + 3];
        let kept = pcs.len().min(chain.len() - 1);
        chain[..kept].copy_from_slice(&pcs[..kept]);
        state.record_own(&mut chain, kept, weight, delivery, crate::labels::current_id());
    }
}

/// Adds `weight` samples of another thread's call chain `pcs`, ending in its label set's
/// marker (`label`: its number, 0 for none) and its context's marker when the profile records
/// contexts (the wall sampler's looks at threads off the CPU).
pub fn record_other_thread(pcs: &[u64], context: SampleContext, weight: u64, label: u32) {
    let in_flight = InFlight::enter();
    if let Some(state) = in_flight.state() {
        if state.labels != Labels::None && !pcs.is_empty() {
            let mut chain = [0u64; MAX_CONTEXT_CHAIN];
            let kept = pcs.len().min(chain.len() - 2);
            chain[..kept].copy_from_slice(&pcs[..kept]);
            let n = match label {
                0 => with_markers(&mut chain, kept, &[context.marker()]),
                id => with_markers(&mut chain, kept, &[sample_labels::marker(id), context.marker()]),
            };
            state.table.record(&chain[..n], weight);
        } else {
            state.table.record(pcs, weight);
        }
        state.label_weights().add(weight);
    }
}

/// The longest chain [`record_other_thread`] keeps, its marker included.
const MAX_CONTEXT_CHAIN: usize = 256;

/// Records a profiling signal that was taken off the queue instead of delivered (before an
/// `exec`, which could deliver it to the new image), as a sample of `pc`: POSIX timer signals
/// weigh `1 + si_overrun` as in the handler; a perf event's (disabled by then, not re-armed
/// here) weighs 1. Async-signal-safe.
pub fn record_taken_signal(info: &libc::siginfo_t, pc: u64) {
    let in_flight = InFlight::enter();
    if let Some(state) = in_flight.state() {
        let (weight, delivery) = if info.si_code == libc::SI_TIMER {
            // SAFETY: a siginfo the kernel filled in.
            unsafe { state.signal_weight(info) }
        } else {
            (1, None)
        };
        state.interrupts.fetch_add(1, Ordering::Relaxed);
        state.record_own(&mut [pc, 0, 0], 1, weight, delivery, crate::labels::current_id());
    }
}

/// The `SA_SIGINFO` handler for the profiling signal.
///
/// # Safety
/// Only the kernel calls it, with the `uc` of the signal being delivered.
pub unsafe extern "C" fn on_profiling_signal(_sig: c_int, info: *mut libc::siginfo_t, uc: *mut c_void) {
    // SAFETY: errno is this thread's; it is restored so the interrupted code never sees ours.
    let errno = unsafe { libc::__errno_location() };
    let saved_errno = unsafe { *errno };
    {
        let in_flight = InFlight::enter();
        if let Some(state) = in_flight.state() {
            // SAFETY: `info` and `uc` are the kernel's for this signal.
            unsafe {
                let weight = state.signal_weight(info);
                state.sample(&in_flight, uc, weight);
            }
            if let Some(hook) = state.after_sample {
                hook(state);
            }
        }
        // `in_flight` drops here: the state may be freed from now on.
    }
    unsafe { *errno = saved_errno };
}
