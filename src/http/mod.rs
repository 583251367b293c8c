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

mod endpoints;
mod request;

use crate::sys::fd::identity;
use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, IntoRawFd};
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
/// process; there is no handle to stop it. Each call starts another listener.
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
    let address = loopback_unless_named(address);
    let target = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{address}: no such address")))?;
    let listener = TcpListener::bind(target)?;
    let bound = listener.local_addr()?;
    let identity = identity(listener.as_raw_fd()).ok_or_else(io::Error::last_os_error)?;
    // Non-blocking, so that an `accept` never waits on whatever the number may come to hold.
    listener.set_nonblocking(true)?;
    let builder = std::thread::Builder::new().name("cpuprof-http".into());
    crate::sys::thread::spawn_signal_free(builder, move || {
        listen(listener, identity);
    })?;
    Ok(bound)
}

/// Accepts connections while the listener's descriptor still holds the socket bound, checked
/// right before each `accept` and at least every [`LISTENER_CHECK`].
fn listen(listener: TcpListener, ours: (u64, u64)) {
    let fd = listener.as_raw_fd();
    loop {
        let mut pending = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. Polling a number the program has reused only reads its state.
        let ready = unsafe { libc::poll(&mut pending, 1, LISTENER_CHECK.as_millis() as libc::c_int) };
        if identity(fd) != Some(ours) {
            crate::say!(
                "cpuprof: the HTTP endpoint's listening socket (descriptor {fd}) was closed or reused by \
                 the program; the endpoint stops serving"
            );
            // The number is the program's now: closing it would close the program's descriptor.
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

/// Starts the endpoint if `CPUPROF_HTTP` asks for it (never in setuid/setgid programs).
/// Failures are reported on stderr; the program runs on without the endpoint. The variable is
/// removed, so programs this one runs (`system`, `fork` + `exec`) do not fight for the port.
/// `libcpuprof.so` calls this when it is loaded, before the program's own threads exist; a
/// Rust program that wants the same switch calls it early in `main`, before starting threads
/// (it changes the environment).
pub fn serve_from_env() {
    let Some(address) = std::env::var("CPUPROF_HTTP").ok().filter(|a| !a.is_empty()) else {
        return;
    };
    std::env::remove_var("CPUPROF_HTTP");
    if crate::session::autostart::is_privileged() {
        return;
    }
    match serve(&address) {
        Ok(bound) => crate::say!(
            "cpuprof: serving profiles on http://{bound}/pprof/profile and http://{bound}/debug/pprof/profile"
        ),
        Err(e) => crate::say!("cpuprof: CPUPROF_HTTP={address}: cannot listen: {e}; the program continues without it"),
    }
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
    let spawned = crate::sys::thread::spawn_signal_free(builder, move || {
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
    identity: Option<(u64, u64)>,
}

impl Connection {
    fn new(stream: TcpStream) -> Self {
        let identity = identity(stream.as_raw_fd());
        Connection {
            stream: ManuallyDrop::new(stream),
            identity,
        }
    }

    fn ours(&self) -> bool {
        self.identity.is_some() && identity(self.stream.as_raw_fd()) == self.identity
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
