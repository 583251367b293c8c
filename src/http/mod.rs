//! An HTTP endpoint inside the profiled process, so that it can be profiled on demand, while
//! it runs, by the usual pprof clients:
//!
//! * `GET /pprof/profile?seconds=N`: a CPU profile of the next N seconds (30 if not given, at
//!   most 300) in gperftools' format, pprof's
//!   remote-server protocol: `google-pprof http://host:port/pprof/profile` (or
//!   `go tool pprof` on the same URL), which ask `POST /pprof/symbol` for the function names;
//! * `GET /debug/pprof/profile?seconds=N`: the same profile as gzipped pprof protobuf,
//!   symbolised in the process, for `go tool pprof`, Parca and Pyroscope (with
//!   `/debug/pprof/symbol`, which go tool pprof asks for names the protobuf lacks);
//! * `GET /pprof/cmdline`: the program's command line, one argument per line.
//!
//! Every response names the process that answered in an [`PID_HEADER`] (`X-Cpuprof-Pid`)
//! header.
//!
//! One profile is taken at a time: a second request while one runs, or while the program is
//! already being profiled into a file, gets `409 Conflict`. The profile covers the whole
//! process with the `CPUPROFILE_*` settings of its environment. A client that hangs up
//! abandons its profile at once.
//!
//! Start it with [`serve`], with `CPUPROF_HTTP=[host:]port` in the environment of a program
//! using `libcpuprof.so` (see [`serve_from_env`]), or with the C function `CpuprofServeHttp`.
//! It listens on loopback unless a host is named: anyone who can connect can profile the
//! process and read its command line, function names and mappings.
//!
//! `CPUPROF_HTTP` is for a whole process tree: a launcher that execs the server and exits
//! hands the port on to the server (a process that finds it in use waits on standby and takes
//! it within about a second once it is free), and a forked child never keeps the parent's
//! listening socket ([`in_forked_child`]). See `follow.rs`.
//!
//! Hand-written HTTP/1.1 on `std::net` rather than a server crate: the endpoint needs one
//! request per connection on a handful of paths, with hard limits, and every dependency is
//! linked into programs that never asked for it. Each connection gets its own short-lived
//! thread (at most [`MAX_CONNECTIONS`]; beyond that, `503`). A client has [`REQUEST_TIMEOUT`]
//! for its whole request and [`RESPONSE_TIMEOUT`] to read the answer, however it splits them,
//! so a slow or silent client cannot hold a connection for long. These threads block every signal, so neither
//! the application's signals nor the profiler's land on them, and nothing here runs in
//! signal context.
//!
//! The program may close the listening socket's descriptor behind cpuprof's back (daemons
//! `close_range()` everything after start-up) and open one of its own on the same number:
//! the listener checks before every `accept` that the descriptor still holds the socket it
//! bound, and stops serving, without touching the descriptor, once it does not. Connections
//! are checked the same way before every read and write and before they are closed.

mod contention;
mod endpoints;
mod follow;
mod heap;
mod request;

pub use follow::{STANDBY_RETRY, TREE_VAR};
pub use request::PID_HEADER;

use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Connections served at once; more get `503` at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its whole request, head and body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to read the whole response (a profile is up to a few MiB).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often an idle listener checks that its descriptor is still its socket, so that a
/// socket the program closed is released (and said so) within this time.
const LISTENER_CHECK: Duration = Duration::from_secs(1);

static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// Starts the endpoint on `address` (`port`, `:port` or `host:port`; a bare port binds
/// 127.0.0.1) and returns the address bound (port 0 picks a free one).
///
/// The endpoint serves on a thread of its own, which blocks every signal, for the rest of the
/// process; there is no handle to stop it. Each call starts another listener. A child this
/// process forks (without exec) gets no copy of it from `libcpuprof.so`, whose fork handler
/// calls [`in_forked_child`] (a Rust program that forks without exec calls it in the child).
///
/// # Errors
///
/// If `address` does not resolve, cannot be bound (in use, or a privileged port), or the
/// listener's thread cannot be started.
///
/// # Example
///
/// ```no_run
/// // Serve on a free loopback port, then fetch a 10-second profile with
/// // `go tool pprof http://127.0.0.1:PORT/debug/pprof/profile?seconds=10`.
/// let bound = cpuprof::http::serve("0")?;
/// eprintln!("profiles on http://{bound}/debug/pprof/profile");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn serve(address: &str) -> io::Result<SocketAddr> {
    let target = resolve(address)?;
    let socket = follow::new_socket(target)?;
    follow::bind_and_listen(&socket, target).map_err(follow::NotListening::error)?;
    serve_socket(socket)
}

/// The first address `address` resolves to, loopback for a bare port.
fn resolve(address: &str) -> io::Result<SocketAddr> {
    let address = loopback_unless_named(address);
    address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{address}: no such address")))
}

/// Serves on `socket`, bound and listening, on a new thread of cpuprof's; its address.
fn serve_socket(socket: OwnedFd) -> io::Result<SocketAddr> {
    let (listener, held) = follow::into_listener(socket)?;
    let bound = listener.local_addr()?;
    let builder = std::thread::Builder::new().name("cpuprof-http".into());
    crate::in_program::thread::spawn_signal_free(builder, move || listen(listener, held))?;
    Ok(bound)
}

/// Accepts connections while the listener's descriptor still holds the socket bound, checked
/// right before each `accept` and at least every [`LISTENER_CHECK`].
fn listen(listener: TcpListener, mut held: follow::Held) {
    let fd = listener.as_raw_fd();
    loop {
        let mut pending = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. Polling a number the program has reused only reads its state.
        let ready = unsafe { libc::poll(&mut pending, 1, LISTENER_CHECK.as_millis() as libc::c_int) };
        if !held.is_still_ours() {
            crate::say!(
                "cpuprof: the HTTP endpoint's listening socket (descriptor {fd}) was closed or reused by \
                 the program; the endpoint stops serving"
            );
            // The number is the program's now: closing it would close the program's descriptor.
            held.release();
            let _ = listener.into_raw_fd();
            return;
        }
        if ready <= 0 {
            continue;
        }
        match listener.accept() {
            Ok((conn, _)) => accept(conn),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // Out of descriptors or the like: wait rather than spin.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Starts the endpoint if `CPUPROF_HTTP` asks for it (never in setuid/setgid programs), for
/// the whole process tree: `libcpuprof.so` calls this when it is loaded, in every process the
/// tree execs, before the program's own threads exist. A Rust program that wants the same
/// switch calls it early in `main`, before starting threads (it changes the environment).
///
/// * The process the user started binds the address and says so on stderr, or says why it
///   cannot; it leaves `CPUPROF_HTTP` in the environment, and records itself and the numeric
///   address it bound (port 0: the port picked) in `CPUPROF_HTTP_TREE` ([`TREE_VAR`]).
/// * Programs it runs (`system`, `fork` + `exec`, a script's commands) inherit both. Each
///   tries the address too: while someone holds it, it waits quietly on standby, retrying every
///   second; the first survivor to find it free binds it and says so, once. So with a launcher
///   (`pg_ctl start`, a wrapper script, a program that forks, execs the server and exits), the
///   endpoint moves to the server within about a second of the launcher's exit.
/// * The process the user started, finding the port held by another program, says so and
///   waits the same way. Other failures (no such host, a privileged port) are reported by the
///   process the user started, and leave the tree without an endpoint.
///
/// Forked children (without exec) take no part: see [`in_forked_child`].
pub fn serve_from_env() {
    let Some(requested) = env_var("CPUPROF_HTTP").filter(|a| !a.trim().is_empty()) else {
        return;
    };
    let tree = env_var(follow::TREE_VAR);
    if crate::session::autostart::is_privileged() {
        return;
    }
    let pid = std::process::id();
    let role = follow::role(&requested, tree.as_deref(), pid);
    let (target, reports) = match role {
        follow::Role::Started => match resolve(&requested) {
            Ok(target) => (target, true),
            Err(e) => {
                report_cannot(&requested, &e, "");
                return follow::mark_tree(pid, None, &requested);
            }
        },
        follow::Role::StartedAgain(Some(target)) => (target, true),
        follow::Role::Descendant(Some(target)) => (target, false),
        // The tree has no endpoint (the process started said why).
        follow::Role::StartedAgain(None) | follow::Role::Descendant(None) => return,
    };
    let fail = |e: io::Error| {
        if reports {
            report_cannot(&requested, &e, "");
        }
        if role == follow::Role::Started {
            follow::mark_tree(pid, None, &requested);
        }
    };
    let socket = match follow::new_socket(target) {
        Ok(socket) => socket,
        Err(e) => return fail(e),
    };
    let standby_socket = match follow::bind_and_listen(&socket, target) {
        Ok(()) => match serve_socket(socket) {
            Ok(bound) => {
                match role {
                    follow::Role::Started => {
                        follow::mark_tree(pid, Some(bound), &requested);
                        announce(bound, "");
                    }
                    // Said before its exec.
                    follow::Role::StartedAgain(_) => {}
                    follow::Role::Descendant(_) => announce(bound, &format!(" (pid {pid})")),
                }
                return;
            }
            Err(e) => return fail(e),
        },
        Err(refused) if refused.in_use() => {
            if reports {
                let e = match &refused {
                    follow::NotListening::Bind(e) | follow::NotListening::Listen(e) => e,
                };
                report_cannot(
                    &requested,
                    e,
                    " until the port is free (cpuprof tries again every second)",
                );
            }
            match refused {
                // The socket may be bound again later.
                follow::NotListening::Bind(_) => Some(socket),
                follow::NotListening::Listen(_) => None,
            }
        }
        Err(refused) => return fail(refused.error()),
    };
    if role == follow::Role::Started {
        follow::mark_tree(pid, Some(target), &requested);
    }
    let builder = std::thread::Builder::new().name("cpuprof-http".into());
    let waiting = crate::in_program::thread::spawn_signal_free(builder, move || {
        let socket = follow::standby(standby_socket, target);
        if let Ok((listener, held)) = follow::into_listener(socket) {
            announce(target, &format!(" (pid {}; the port was freed)", std::process::id()));
            listen(listener, held);
        }
    });
    if let (Err(e), true) = (waiting, reports) {
        crate::say!("cpuprof: CPUPROF_HTTP={requested}: cannot wait for the port: {e}");
    }
}

/// The variable `name`, read from `environ` itself rather than with `getenv`: bash replaces
/// getenv/setenv with its own, and once its setenv has run (autostart's, for `CPUPROFILE`),
/// its getenv finds none of the variables it has not imported yet.
fn env_var(name: &str) -> Option<String> {
    std::env::vars_os()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.into_string().ok())
}

fn report_cannot(requested: &str, e: &io::Error, more: &str) {
    crate::say!("cpuprof: CPUPROF_HTTP={requested}: cannot listen: {e}; the program continues without it{more}");
}

/// Says where profiles are served: once, by the process that binds.
fn announce(bound: SocketAddr, whose: &str) {
    let line = format_args!(
        "cpuprof: serving profiles on http://{bound}/pprof/profile and http://{bound}/debug/pprof/profile{whose}"
    );
    // The first announcement is the root's; a later one (the port was freed) comes from the
    // process the endpoint moved to, which is never the root, and is said all the same.
    if whose.is_empty() {
        crate::in_program::messages::say(line);
    } else {
        crate::in_program::messages::say_for_tree(line);
    }
}

/// Called in a child just forked (from `session::children`'s fork child handler): closes the
/// child's copies of the endpoint's sockets, if their numbers still hold them, and forgets the
/// connections and the profile in flight. Async-signal-safe (atomics, `fstat`, `close`).
///
/// The child inherits the listening socket but not the thread that accepts on it: kept, the
/// socket would keep the port bound after the parent exits, and clients would connect and wait
/// forever. Nor does a forked child go on standby: starting a thread in a fork child handler
/// is unsafe (a lock another thread of the parent held at the fork stays held in the child)
/// and would make single-threaded children threaded (where `unshare(CLONE_NEWUSER)` then
/// fails); and in a prefork server (nginx, the postgres postmaster) the master should hold the
/// endpoint while workers come and go, and when the master dies a worker that took the port
/// would answer for a process that is not the server. A child that execs tries the port again,
/// as every program of the tree does. So does a child that calls [`serve`] itself.
pub fn in_forked_child() {
    follow::close_inherited();
    OPEN_CONNECTIONS.store(0, Ordering::Release);
    endpoints::forget_in_flight();
}

fn loopback_unless_named(address: &str) -> String {
    let address = address.trim();
    if address.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{address}")
    } else if let Some(port) = address.strip_prefix(':') {
        format!("127.0.0.1:{port}")
    } else {
        address.to_string()
    }
}

fn accept(conn: TcpStream) {
    // Accepted sockets do not inherit the listener's O_NONBLOCK on Linux; made sure of here
    // because the deadlines below rely on blocking reads with timeouts.
    let _ = conn.set_nonblocking(false);
    let conn = Connection::new(conn);
    if OPEN_CONNECTIONS.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        let _ = request::Response::text(503, "too many connections; retry later")
            .write_to(&mut Deadline::after(&conn, Duration::from_secs(1)));
        return;
    }
    let builder = std::thread::Builder::new()
        .name("cpuprof-http-conn".into())
        // Not smaller than the default: compressing the protobuf (miniz_oxide) uses a few
        // hundred KiB of stack in unoptimised builds.
        .stack_size(2 * 1024 * 1024);
    let spawned = crate::in_program::thread::spawn_signal_free(builder, move || {
        let response = match request::read_request(&mut Deadline::after(&conn, REQUEST_TIMEOUT)) {
            Ok(req) => endpoints::handle(&req, &|wait| client_hung_up(&conn, wait)),
            Err(refusal) => refusal,
        };
        let _ = response.write_to(&mut Deadline::after(&conn, RESPONSE_TIMEOUT));
        if let Ok(stream) = conn.stream() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
    });
    if spawned.is_err() {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted connection that is read, written and closed only while its descriptor still
/// holds it: a program that `close_range()`s its descriptors in the middle of a request may
/// have put a file of its own on the number, which must not receive a response nor be closed.
struct Connection {
    stream: ManuallyDrop<TcpStream>,
    /// Its identity, recorded for a forked child to close its copy (see [`in_forked_child`]).
    held: follow::Held,
}

impl Connection {
    fn new(stream: TcpStream) -> Self {
        let held = follow::Held::record(stream.as_raw_fd());
        Connection {
            stream: ManuallyDrop::new(stream),
            held,
        }
    }

    fn ours(&self) -> bool {
        self.held.is_still_ours()
    }

    /// The stream, if the descriptor still holds it.
    fn stream(&self) -> io::Result<&TcpStream> {
        if self.ours() {
            Ok(&self.stream)
        } else {
            Err(io::Error::other("the descriptor was reused by the program"))
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.held.release();
        if self.ours() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.stream) };
        }
    }
}

/// A read shorter than this that did not finish the request means a client sending it in
/// small pieces: the next read waits [`SMALL_READ_PAUSE`] first so that pieces pile up, and
/// a client sending one byte per segment wakes its thread at most 20 times a second instead
/// of once per byte. Real clients send a request in one or two writes and never wait.
const SMALL_READ: usize = 256;
const SMALL_READ_PAUSE: Duration = Duration::from_millis(50);

/// A connection whose reads (or writes) must all be over by one deadline, however the peer
/// splits them: each one waits at most for the time left.
struct Deadline<'a> {
    conn: &'a Connection,
    end: Instant,
    last_read_small: bool,
}

impl<'a> Deadline<'a> {
    fn after(conn: &'a Connection, limit: Duration) -> Self {
        Deadline {
            conn,
            end: Instant::now() + limit,
            last_read_small: false,
        }
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.last_read_small {
            std::thread::sleep(SMALL_READ_PAUSE.min(self.left()?));
        }
        let stream = self.conn.stream()?;
        stream.set_read_timeout(Some(self.left()?))?;
        let n = (&mut &*stream).read(buf)?;
        self.last_read_small = n < SMALL_READ;
        Ok(n)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let stream = self.conn.stream()?;
        stream.set_write_timeout(Some(self.left()?))?;
        (&mut &*stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Waits up to `wait`; true as soon as the client closes its end of the connection (or it
/// fails), so that a profile nobody will read is abandoned. A client that only shuts down its
/// sending side after the request counts as gone too: HTTP clients do not do that.
fn client_hung_up(conn: &Connection, wait: Duration) -> bool {
    let end = Instant::now() + wait;
    loop {
        if !conn.ours() {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut watched = libc::pollfd {
            fd: conn.stream.as_raw_fd(),
            // Not POLLIN: bytes the client sends after its request must not wake this loop.
            events: libc::POLLRDHUP,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd on a descriptor this thread owns.
        match unsafe { libc::poll(&mut watched, 1, ms) } {
            0 => {}
            n if n > 0 => return true,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            // Cannot watch (no memory, say): wait out the time as if the client stayed.
            _ => {
                std::thread::sleep(left);
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_ports_bind_loopback() {
        assert_eq!(loopback_unless_named("6060"), "127.0.0.1:6060");
        assert_eq!(loopback_unless_named(":6060"), "127.0.0.1:6060");
        assert_eq!(loopback_unless_named("0.0.0.0:6060"), "0.0.0.0:6060");
    }

    #[test]
    fn an_address_in_use_is_an_error() {
        let first = serve("127.0.0.1:0").unwrap();
        let e = serve(&first.to_string()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
