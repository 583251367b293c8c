//! Timers and the signal handler: the only code that runs in signal context.

pub mod default_actions;
pub mod events;
pub mod handler;
pub(crate) mod perf_event;
pub mod runnable_debts;
pub mod signals;
mod thread_accounts;
pub mod thread_timers;
pub mod timer;
pub mod unannounced;
pub(crate) mod walk_stack;

pub use crate::arch::{calling_registers, interrupted_registers};
pub use handler::{
    forget_in_forked_child, on_profiling_signal, publish, refresh_dwarf, set_dwarf, unpublish, wait_for_handlers,
    walk_outside_handler, with_published_state, Labels, SampleSource, SamplerState, ThreadFilter, UnwinderChoice,
};
pub use signals::SignalError;
pub use thread_accounts::{StartChain, ROOT_FRAMES};
pub use timer::Clock;
