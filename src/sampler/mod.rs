//! Timers and the signal handler: the only code that runs in signal context.

mod context;
pub mod handler;
mod scratch;
pub mod signals;
pub mod timer;

pub use context::interrupted_registers;
pub use handler::{on_profiling_signal, publish, unpublish, SamplerState, ThreadFilter};
pub use signals::SignalError;
pub use timer::Clock;
