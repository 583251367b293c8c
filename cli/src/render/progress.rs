//! A progress line on stderr for work that takes more than a second: shown only on a terminal
//! (or with `CPUPROF_PROGRESS=1`), first drawn after one second, redrawn at most ten times a
//! second, erased when done.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const QUIET_FOR: Duration = Duration::from_secs(1);
const REDRAW_EVERY: Duration = Duration::from_millis(100);

pub struct Progress {
    what: &'static str,
    total: usize,
    started: Instant,
    last_drawn: Option<Instant>,
    enabled: bool,
}

impl Progress {
    pub fn new(what: &'static str, total: usize) -> Self {
        let forced = std::env::var_os("CPUPROF_PROGRESS").is_some_and(|v| v == "1");
        Progress {
            what,
            total,
            started: Instant::now(),
            last_drawn: None,
            enabled: forced || std::io::stderr().is_terminal(),
        }
    }

    /// Reports `done` of `total` items finished.
    pub fn update(&mut self, done: usize) {
        if !self.enabled || done % 256 != 0 {
            return;
        }
        let now = Instant::now();
        if now - self.started < QUIET_FOR || self.last_drawn.is_some_and(|t| now - t < REDRAW_EVERY) {
            return;
        }
        self.last_drawn = Some(now);
        let percent = 100 * done / self.total.max(1);
        eprint!("\r{}: {percent:3}% ({done}/{})", self.what, self.total);
        let _ = std::io::stderr().flush();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.last_drawn.is_some() {
            eprint!("\r{}\r", " ".repeat(self.what.len() + 40));
            let _ = std::io::stderr().flush();
        }
    }
}
