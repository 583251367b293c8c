//! A program serving the profiler's HTTP endpoint (`CPUPROF_HTTP`) on a free loopback port, as
//! tests/http.rs, tests/hostile_inputs.rs and tests/build_ids.rs start it.

use super::lib;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// The program running under LD_PRELOAD=libcpuprof.so with `CPUPROF_HTTP=127.0.0.1:0`, its
/// stdin, stdout and stderr piped. Its stdout is left in `child` (take it, or read it at
/// [`finish`](Self::finish)); its stderr is read line by line on a thread of its own, so that
/// the program never blocks writing it.
pub struct HttpChild {
    pub child: Child,
    /// Closed by [`finish`](Self::finish): programs that work until their stdin closes end.
    pub stdin: Option<ChildStdin>,
    /// The program's stderr lines after the announcement.
    pub stderr: Receiver<String>,
    /// cpuprof's first line: "... serving profiles on http://ADDRESS/...".
    pub announced: String,
    /// ADDRESS from that line (127.0.0.1:PORT).
    pub address: String,
}

impl HttpChild {
    /// Starts `program args` with `env` added after the endpoint's settings (so it may replace
    /// them), and waits up to 30 s for the announcement.
    pub fn start(program: &Path, args: &[&str], env: &[(&str, &str)]) -> HttpChild {
        let mut child = Command::new(program)
            .args(args)
            .env("LD_PRELOAD", lib())
            .env("CPUPROF_HTTP", "127.0.0.1:0")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = lines_of(child.stderr.take().unwrap());
        let announced = stderr
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{}: no announcement on stderr: {e}", program.display()));
        HttpChild {
            address: address_in(&announced),
            announced,
            stdin: child.stdin.take(),
            child,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Closes stdin, waits for the program, and returns its output (stdout if not taken) and
    /// the stderr lines not read yet.
    pub fn finish(mut self) -> (Output, Vec<String>) {
        drop(self.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        // The reader thread ends at end of file, which has come: collect until it hangs up.
        let rest = std::iter::from_fn(|| self.stderr.recv_timeout(Duration::from_secs(10)).ok()).collect();
        (out, rest)
    }
}

/// The address in cpuprof's "serving profiles on http://ADDRESS/..." line.
pub fn address_in(line: &str) -> String {
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address announced: {line:?}"))
        .to_string()
}

/// The lines `stream` gives, as they come, read on a thread of their own.
pub fn lines_of(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
