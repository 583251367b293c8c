//! An HTTP endpoint inside the profiled process, so it can be profiled on demand: pprof's
//! remote-server protocol (`go tool pprof` / `google-pprof http://host:port/pprof/profile`)
//! and `/debug/pprof/profile` in gzipped protobuf for Parca, Pyroscope and go tool pprof.
//! Started by `CPUPROF_HTTP=[host:]port` (loopback unless a host is named), by [`serve`] or by
//! the C function `CpuprofServeHttp`.
//!
//! Hand-written HTTP/1.1 on `std::net` rather than a server crate: the endpoint needs one
//! request per connection on a handful of paths, with hard limits, and every dependency is
//! linked into programs that never asked for it. Each connection gets its own short-lived
//! thread (at most [`MAX_CONNECTIONS`]; beyond that, `503`), with socket timeouts so a slow
//! or silent client cannot hold one for long. These threads block every signal, so neither
//! the application's signals nor the profiler's land on them, and nothing here runs in
//! signal context. A second profile request while one runs gets `409` (see `endpoints`).

mod endpoints;
mod request;
mod symbols;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Connections served at once; more get `503` at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its request or to read a response.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// Starts the endpoint on `address` (`port`, `:port` or `host:port`; a bare port binds
/// 127.0.0.1) and returns the address bound (port 0 picks a free one).
pub fn serve(address: &str) -> io::Result<SocketAddr> {
    let address = loopback_unless_named(address);
    let target = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{address}: no such address")))?;
    let listener = TcpListener::bind(target)?;
    let bound = listener.local_addr()?;
    let builder = std::thread::Builder::new().name("cpuprof-http".into());
    crate::sys::thread::spawn_signal_free(builder, move || {
        block_all_signals();
        for conn in listener.incoming() {
            match conn {
                Ok(conn) => accept(conn),
                // Out of descriptors or the like: wait rather than spin.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    })?;
    Ok(bound)
}

/// Starts the endpoint if `CPUPROF_HTTP` asks for it (never in setuid/setgid programs).
/// Failures are reported on stderr; the program runs on without the endpoint. The variable is
/// removed, so programs this one runs (`system`, `fork` + `exec`) do not fight for the port.
/// Called from the library's constructor, before the program's own threads exist.
pub fn serve_from_env() {
    let Some(address) = std::env::var("CPUPROF_HTTP").ok().filter(|a| !a.is_empty()) else {
        return;
    };
    std::env::remove_var("CPUPROF_HTTP");
    if crate::session::autostart::is_privileged() {
        return;
    }
    match serve(&address) {
        Ok(bound) => eprintln!(
            "cpuprof: serving profiles on http://{bound}/pprof/profile and http://{bound}/debug/pprof/profile"
        ),
        Err(e) => eprintln!("cpuprof: CPUPROF_HTTP={address}: cannot listen: {e}; the program continues without it"),
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

fn accept(mut conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = conn.set_write_timeout(Some(CLIENT_TIMEOUT));
    if OPEN_CONNECTIONS.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        let _ = request::Response::text(503, "too many connections; retry later").write_to(&mut conn);
        return;
    }
    let builder = std::thread::Builder::new()
        .name("cpuprof-http-conn".into())
        // Not smaller than the default: compressing the protobuf (miniz_oxide) uses a few
        // hundred KiB of stack in unoptimised builds.
        .stack_size(2 * 1024 * 1024);
    let spawned = crate::sys::thread::spawn_signal_free(builder, move || {
        block_all_signals();
        let response = match request::read_request(&mut conn) {
            Ok(req) => endpoints::handle(&req),
            Err(refusal) => refusal,
        };
        let _ = response.write_to(&mut conn);
        let _ = conn.shutdown(std::net::Shutdown::Both);
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
    });
    if spawned.is_err() {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
    }
}

fn block_all_signals() {
    // SAFETY: fills a local signal set and applies it to the calling thread only.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
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
