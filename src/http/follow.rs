//! How the endpoint follows a process tree started with `CPUPROF_HTTP`: a launcher (`pg_ctl`,
//! a shell script, a wrapper that forks, execs the server and exits) must not take the
//! endpoint with it.
//!
//! * `CPUPROF_HTTP` stays in the environment, so every program the tree execs tries the port.
//!   The process the user started records itself and the numeric address it bound (or tried)
//!   in [`TREE_VAR`], so that descendants neither resolve a host name again nor pick a port of
//!   their own for port 0; processes that find that record, for their `CPUPROF_HTTP`, with
//!   another pid are its descendants, and are quiet.
//! * A process that finds the address in use keeps a standby socket (at a high descriptor
//!   number, `SO_REUSEADDR`, never listening) and a thread, blocking every signal, that retries
//!   `bind` on it every [`STANDBY_RETRY`]: one `fstat` and one failing `bind` a second. When the
//!   holder exits (or closes its listener), the first survivor to retry binds, listens,
//!   announces itself once, and serves on that same thread. Two that bind in the same instant
//!   cannot both listen (`listen` fails for the second), and the loser waits again.
//! * A forked child (no exec) gets none of this: it runs no thread of cpuprof's, and
//!   [`in_forked_child`] closes its copies of the endpoint's sockets, so that a listener with no
//!   one to accept on it never outlives the process that served it. See [`in_forked_child`] for
//!   why a forked child does not go on standby.
//!
//! Every descriptor of the endpoint (listener, standby socket, connection) is recorded with its
//! identity in [`HELD`], lock-free, because the fork child handler may read it while another
//! thread of the parent was half-way through changing it: a torn record fails the identity
//! check and is left alone.

use crate::in_program::fd::{high_floor, identity};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

/// `PID ADDRESS REQUESTED`: the process the user started with `CPUPROF_HTTP=REQUESTED`, and
/// the address it bound or tried (`-` for none: no endpoint for the tree), set by that process
/// for its descendants. A new variable rather than a rewritten `CPUPROF_HTTP`: bash replaces
/// libc's `setenv` with its own, and a variable it imports from the environment after the
/// library's constructor ran keeps its imported value (a new variable is kept).
pub const TREE_VAR: &str = "CPUPROF_HTTP_TREE";
/// How often a process on standby tries the port again.
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);
/// Backlog of the listening socket (what `std::net::TcpListener::bind` uses).
const BACKLOG: libc::c_int = 128;

/// Where a process stands in the tree of `CPUPROF_HTTP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The process the user started: no record in [`TREE_VAR`] for this `CPUPROF_HTTP`
    /// (a record for another value is an outer tree's). It reports, and records the tree.
    Started,
    /// That process again, after an exec of its own: binds the tree's address (if any) again,
    /// reports only failures.
    StartedAgain(Option<SocketAddr>),
    /// A descendant: binds the tree's address (if any) without a word unless it comes to serve.
    Descendant(Option<SocketAddr>),
}

/// The role of process `pid` with `CPUPROF_HTTP=requested` and [`TREE_VAR`] `tree`.
pub(crate) fn role(requested: &str, tree: Option<&str>, pid: u32) -> Role {
    let record = tree.and_then(|t| {
        let mut parts = t.splitn(3, ' ');
        let root: u32 = parts.next()?.parse().ok()?;
        let address = match parts.next()? {
            "-" => None,
            a => Some(a.parse::<SocketAddr>().ok()?),
        };
        (parts.next()? == requested).then_some((root, address))
    });
    match record {
        None => Role::Started,
        Some((root, address)) if root == pid => Role::StartedAgain(address),
        Some((_, address)) => Role::Descendant(address),
    }
}

/// Records this process as the tree's root and `address` as the tree's endpoint (`None`: the
/// tree has none, the address cannot be bound by anyone).
pub(crate) fn mark_tree(pid: u32, address: Option<SocketAddr>, requested: &str) {
    let address = address.map_or_else(|| "-".to_string(), |a| a.to_string());
    std::env::set_var(TREE_VAR, format!("{pid} {address} {requested}"));
}

/// A new TCP socket for `target`'s family, `SO_REUSEADDR` (so that connections of an exited
/// holder in `TIME_WAIT` do not keep the port from its successor for a minute), close-on-exec,
/// moved to cpuprof's high descriptor numbers.
pub(crate) fn new_socket(target: SocketAddr) -> io::Result<OwnedFd> {
    let family = if target.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket creation; the result is owned below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: an int option on our own socket.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(move_high(socket))
}

/// `socket` at a number at or above [`high_floor`], out of the way of the program's
/// lowest-free-number allocation (where it stays if none is free).
fn move_high(socket: OwnedFd) -> OwnedFd {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own.
    let high = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_DUPFD_CLOEXEC, high_floor()) };
    if high < 0 {
        return socket;
    }
    drop(socket);
    // SAFETY: the duplicate just made is ours alone.
    unsafe { OwnedFd::from_raw_fd(high) }
}

/// Why a socket is not listening on its address.
#[derive(Debug)]
pub(crate) enum NotListening {
    /// `bind` failed: the socket is unchanged and may be bound again later.
    Bind(io::Error),
    /// Bound, but `listen` failed (another socket started listening on the address first):
    /// the socket is spent.
    Listen(io::Error),
}

impl NotListening {
    pub(crate) fn error(self) -> io::Error {
        match self {
            NotListening::Bind(e) | NotListening::Listen(e) => e,
        }
    }

    pub(crate) fn in_use(&self) -> bool {
        let (NotListening::Bind(e) | NotListening::Listen(e)) = self;
        e.kind() == io::ErrorKind::AddrInUse
    }
}

/// Binds `socket` to `target` and listens.
pub(crate) fn bind_and_listen(socket: &OwnedFd, target: SocketAddr) -> Result<(), NotListening> {
    // SAFETY: zeroed sockaddr_storage is valid; the address structures written below fit in it.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match target {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is suitably aligned.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    let fd = socket.as_raw_fd();
    // SAFETY: a valid address of `len` bytes, on our own socket.
    if unsafe {
        libc::bind(
            fd,
            (&storage as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    } != 0
    {
        return Err(NotListening::Bind(io::Error::last_os_error()));
    }
    // SAFETY: our own bound socket.
    if unsafe { libc::listen(fd, BACKLOG) } != 0 {
        return Err(NotListening::Listen(io::Error::last_os_error()));
    }
    Ok(())
}

/// Waits for `target` to be free, on the calling thread (one of cpuprof's, blocking every
/// signal), retrying `bind` every [`STANDBY_RETRY`]; returns the listening socket once it
/// binds (a process that never gets the port waits for the rest of its life). `socket` is a
/// fresh socket from [`new_socket`] whose `bind` failed, if there is one.
///
/// The standby socket is checked before each try like every descriptor of cpuprof's: if the
/// program closed or reused its number (a daemon's `close_range` at start-up), it is abandoned
/// without being closed and a new one is made.
pub(crate) fn standby(socket: Option<OwnedFd>, target: SocketAddr) -> OwnedFd {
    let mut current: Option<(OwnedFd, Held)> = socket.map(|s| {
        let held = Held::record(s.as_raw_fd());
        (s, held)
    });
    loop {
        std::thread::sleep(STANDBY_RETRY);
        if let Some((socket, mut held)) = current.take() {
            if held.is_still_ours() {
                current = Some((socket, held));
            } else {
                // The number is the program's now.
                held.release();
                let _ = socket.into_raw_fd();
            }
        }
        let (socket, mut held) = match current.take() {
            Some(kept) => kept,
            None => match new_socket(target) {
                Ok(s) => {
                    let held = Held::record(s.as_raw_fd());
                    (s, held)
                }
                // Out of descriptors, say: try again at the next round.
                Err(_) => continue,
            },
        };
        match bind_and_listen(&socket, target) {
            Ok(()) => {
                held.release();
                return socket;
            }
            // Still taken, or the address is not there for now (an interface that comes
            // back): the same socket can be bound later.
            Err(NotListening::Bind(e)) if e.raw_os_error() != Some(libc::EINVAL) => current = Some((socket, held)),
            // Bound but another listened first, or (EINVAL) somehow bound already: spent.
            Err(_) => {
                held.release();
                drop(socket);
            }
        }
    }
}

/// Free slot in [`HELD`].
const FREE: RawFd = -1;
/// A slot being filled.
const CLAIMED: RawFd = -2;
/// Room for the listeners, the standby socket and [`super::MAX_CONNECTIONS`] connections,
/// with margin; a descriptor finding no room is not recorded (a forked child keeps its copy).
const SLOTS: usize = 64;

struct Slot {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

/// The endpoint's descriptors and their identities, for [`in_forked_child`].
static HELD: [Slot; SLOTS] = [const {
    Slot {
        fd: AtomicI32::new(FREE),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; SLOTS];

/// A descriptor of the endpoint recorded in [`HELD`] until [`release`](Held::release)d
/// (before it is closed or given up) or dropped.
pub(crate) struct Held {
    slot: Option<usize>,
    identity: Option<(u64, u64)>,
    fd: RawFd,
}

impl Held {
    /// Records `fd` with its identity now.
    pub(crate) fn record(fd: RawFd) -> Held {
        let identity = identity(fd);
        let slot = identity.and_then(|(dev, ino)| {
            HELD.iter().position(|s| {
                let claimed =
                    s.fd.compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok();
                if claimed {
                    s.dev.store(dev, Ordering::Relaxed);
                    s.ino.store(ino, Ordering::Relaxed);
                    s.fd.store(fd, Ordering::Release);
                }
                claimed
            })
        });
        Held { slot, identity, fd }
    }

    /// The identity recorded, if the descriptor had one.
    pub(crate) fn identity(&self) -> Option<(u64, u64)> {
        self.identity
    }

    /// Whether the number still holds the descriptor recorded.
    pub(crate) fn is_still_ours(&self) -> bool {
        self.identity.is_some() && identity(self.fd) == self.identity
    }

    /// Forgets the record: before the descriptor is closed or left to the program.
    pub(crate) fn release(&mut self) {
        if let Some(slot) = self.slot.take() {
            HELD[slot].fd.store(FREE, Ordering::Release);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// Closes, in a child just forked, every descriptor of the endpoint it inherited that still
/// holds what was recorded, and forgets them all. Only `fstat` and `close`: safe in a fork
/// child handler.
pub(crate) fn close_inherited() {
    for slot in &HELD {
        let fd = slot.fd.load(Ordering::Acquire);
        if fd >= 0 {
            let recorded = (slot.dev.load(Ordering::Relaxed), slot.ino.load(Ordering::Relaxed));
            if identity(fd) == Some(recorded) {
                // SAFETY: the number holds the socket the parent recorded: the child's copy.
                unsafe { libc::close(fd) };
            }
        }
        slot.fd.store(FREE, Ordering::Release);
    }
}

/// The listening socket as a non-blocking `TcpListener`, recorded in [`HELD`].
pub(crate) fn into_listener(socket: OwnedFd) -> io::Result<(TcpListener, Held)> {
    let listener = TcpListener::from(socket);
    // Non-blocking, so that an `accept` never waits on whatever the number may come to hold.
    listener.set_nonblocking(true)?;
    let held = Held::record(listener.as_raw_fd());
    if held.identity().is_none() {
        return Err(io::Error::last_os_error());
    }
    Ok((listener, held))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_started_process_is_the_one_without_a_record_for_its_value() {
        let bound: SocketAddr = "127.0.0.1:6060".parse().unwrap();
        assert_eq!(role("6060", None, 10), Role::Started);
        let record = "10 127.0.0.1:6060 6060";
        assert_eq!(role("6060", Some(record), 11), Role::Descendant(Some(bound)));
        assert_eq!(role("6060", Some(record), 10), Role::StartedAgain(Some(bound)));
        assert_eq!(role("6060", Some("10 - 6060"), 11), Role::Descendant(None));
        // A new tree for another value inside the old one, or a record that is not ours.
        assert_eq!(role("7070", Some(record), 11), Role::Started);
        assert_eq!(role("6060", Some("garbage"), 11), Role::Started);
        assert_eq!(role("6060", Some("10 nonsense 6060"), 11), Role::Started);
        // IPv6 and host names as given.
        let v6 = "10 [::1]:6060 localhost:6060";
        assert_eq!(
            role("localhost:6060", Some(v6), 12),
            Role::Descendant(Some("[::1]:6060".parse().unwrap()))
        );
    }

    #[test]
    fn a_socket_whose_bind_failed_binds_when_the_port_is_free() {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = holder.local_addr().unwrap();
        let socket = new_socket(target).unwrap();
        assert!(socket.as_raw_fd() >= high_floor(), "descriptor {}", socket.as_raw_fd());
        let refused = bind_and_listen(&socket, target).unwrap_err();
        assert!(matches!(refused, NotListening::Bind(_)) && refused.in_use());
        drop(holder);
        bind_and_listen(&socket, target).unwrap();
        // A second socket cannot listen there now.
        let other = new_socket(target).unwrap();
        assert!(bind_and_listen(&other, target).unwrap_err().in_use());
        // Both the v6 path and the recorded descriptors.
        let v6 = new_socket("[::1]:0".parse().unwrap()).unwrap();
        if bind_and_listen(&v6, "[::1]:0".parse().unwrap()).is_ok() {
            let (listener, held) = into_listener(v6).unwrap();
            assert!(held.is_still_ours() && listener.local_addr().unwrap().is_ipv6());
        }
    }

    #[test]
    fn recorded_descriptors_are_closed_only_while_they_hold_what_was_recorded() {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = TcpListener::bind("127.0.0.1:0").unwrap();
        let (fd_a, fd_b) = (a.as_raw_fd(), b.as_raw_fd());
        let mut held_a = Held::record(fd_a);
        let held_b = Held::record(fd_b);
        let slot_of = |held: &Held| held.slot.unwrap();
        assert_eq!(HELD[slot_of(&held_a)].fd.load(Ordering::Acquire), fd_a);
        // b's number comes to hold something else (the program's file).
        let theirs = std::fs::File::open("/proc/self/stat").unwrap();
        // SAFETY: dup2 over the test's own descriptor.
        assert_eq!(unsafe { libc::dup2(theirs.as_raw_fd(), fd_b) }, fd_b);
        // As in a forked child, but only for these two slots (other tests record their own).
        for held in [&held_a, &held_b] {
            let slot = &HELD[slot_of(held)];
            let fd = slot.fd.load(Ordering::Acquire);
            if identity(fd) == Some((slot.dev.load(Ordering::Relaxed), slot.ino.load(Ordering::Relaxed))) {
                // SAFETY: the listener's own descriptor.
                unsafe { libc::close(fd) };
            }
        }
        assert!(identity(fd_a).is_none(), "a was closed");
        assert_eq!(identity(fd_b), identity(theirs.as_raw_fd()), "b's file left alone");
        held_a.release();
        assert!(held_a.slot.is_none());
        // Not closed twice by their owners: the numbers are given up.
        let _ = a.into_raw_fd();
        drop(b);
        drop(held_b);
    }
}
