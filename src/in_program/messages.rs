//! What cpuprof says on the program's standard error, and which processes say it.
//!
//! stderr belongs to the program: a build tool reads its compiler's diagnostics from it, a
//! program reads its children's through `popen("... 2>&1")`, a service's goes to its log. So
//! by default only the process the user started under the profiler speaks (gperftools'
//! `PROFILE:` line and cpuprof's notes): the processes it execs (which inherit
//! `LD_PRELOAD` and `CPUPROFILE`) and forks keep quiet, and their profiles say what they would
//! have said. `CPUPROFILE_MESSAGES` changes that: `all` (every process speaks), `none`
//! (nothing, ever), `root` (the default).
//!
//! The process started under the profiler is the one that finds `CPUPROFILE_ROOT_PID` unset
//! (or set to its own pid: it exec'd itself); it sets the variable for its descendants.
//!
//! Messages are written with one `write(2)` to descriptor 2, not through Rust's `stderr`,
//! whose lock a forked child may have inherited held by a thread that no longer exists.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which processes speak (`CPUPROFILE_MESSAGES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Only the process the user started under the profiler (the default).
    Root,
    /// Every process.
    All,
    /// None.
    Nobody,
}

/// The variable that names the process started under the profiler.
pub const ROOT_PID_VARIABLE: &str = "CPUPROFILE_ROOT_PID";

const SPEAKS: u8 = 1;
const QUIET: u8 = 2;

/// Whether this process speaks: 0 until decided (it speaks), then [`SPEAKS`] or [`QUIET`].
static STATE: AtomicU8 = AtomicU8::new(0);
/// The audience chosen, for a forked child to decide again.
static AUDIENCE: AtomicU8 = AtomicU8::new(Audience::Root as u8);

/// Parses `CPUPROFILE_MESSAGES`; unknown values give the default.
pub fn parse_audience(value: Option<&str>) -> Audience {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Some("all") => Audience::All,
        Some("none" | "0" | "off" | "quiet") => Audience::Nobody,
        _ => Audience::Root,
    }
}

/// Decides whether this process speaks, from `CPUPROFILE_MESSAGES` and `CPUPROFILE_ROOT_PID`
/// read through `var`, and returns whether it is the root of the profiled process tree (which
/// should then set `CPUPROFILE_ROOT_PID` for its descendants). Called once when
/// libcpuprof.so is loaded, before anything is said.
pub fn decide_from_env(var: impl Fn(&str) -> Option<String>) -> bool {
    let audience = parse_audience(var("CPUPROFILE_MESSAGES").as_deref());
    let own = std::process::id();
    let root = var(ROOT_PID_VARIABLE)
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_none_or(|p| p == own);
    set(audience, root);
    root
}

fn set(audience: Audience, root: bool) {
    AUDIENCE.store(audience as u8, Ordering::Relaxed);
    let speaks = match audience {
        Audience::All => true,
        Audience::Root => root,
        Audience::Nobody => false,
    };
    STATE.store(if speaks { SPEAKS } else { QUIET }, Ordering::Relaxed);
}

/// In a forked child: it is not the process the user started. Async-signal-safe.
pub fn became_forked_child() {
    let audience = match AUDIENCE.load(Ordering::Relaxed) {
        a if a == Audience::All as u8 => Audience::All,
        a if a == Audience::Nobody as u8 => Audience::Nobody,
        _ => Audience::Root,
    };
    set(audience, false);
}

/// Whether this process speaks. Async-signal-safe.
pub fn speaks() -> bool {
    STATE.load(Ordering::Relaxed) != QUIET
}

/// Writes `message` and a newline to stderr if this process speaks. Allocates: not for signal
/// context (see [`say_bytes`]).
pub fn say(message: fmt::Arguments) {
    if speaks() {
        let mut line = message.to_string();
        line.push('\n');
        write_all(line.as_bytes());
    }
}

/// Writes `message` and a newline to stderr unless `CPUPROFILE_MESSAGES=none`, whichever
/// process of the tree this is: for news only one process of the tree can have at a time and
/// the user needs wherever it comes from (the HTTP endpoint moved to the server the root
/// started, after the root exited). Allocates: not for signal context.
pub fn say_for_tree(message: fmt::Arguments) {
    if AUDIENCE.load(Ordering::Relaxed) != Audience::Nobody as u8 {
        let mut line = message.to_string();
        line.push('\n');
        write_all(line.as_bytes());
    }
}

/// Writes `line` (its own newline included) to stderr if this process speaks.
/// Async-signal-safe.
pub fn say_bytes(line: &[u8]) {
    if speaks() {
        write_all(line);
    }
}

fn write_all(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a live buffer to descriptor 2.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        match n {
            n if n > 0 => bytes = &bytes[n as usize..],
            // SAFETY: the calling thread's errno.
            _ if n < 0 && unsafe { *libc::__errno_location() } == libc::EINTR => {}
            _ => return,
        }
    }
}

/// A line built without allocating, for messages from signal context: text and decimal
/// numbers into a fixed buffer (what does not fit is cut).
pub struct FixedLine {
    bytes: [u8; 256],
    len: usize,
}

impl Default for FixedLine {
    fn default() -> Self {
        FixedLine {
            bytes: [0; 256],
            len: 0,
        }
    }
}

impl FixedLine {
    pub fn text(&mut self, text: &[u8]) -> &mut Self {
        let n = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&text[..n]);
        self.len += n;
        self
    }

    pub fn number(&mut self, mut value: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.text(&digits[at..])
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `say!("cpuprof: ...")`: formats like `eprintln!` and writes the line if this process
/// speaks (see the module's documentation).
#[doc(hidden)]
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::in_program::messages::say(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audience_names() {
        assert_eq!(parse_audience(None), Audience::Root);
        assert_eq!(parse_audience(Some("ALL")), Audience::All);
        assert_eq!(parse_audience(Some("none")), Audience::Nobody);
        assert_eq!(parse_audience(Some("bogus")), Audience::Root);
    }
}
