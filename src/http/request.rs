//! Reading one HTTP/1.x request with hard limits, and writing a response. Anything outside the
//! limits or the grammar becomes an error status for the client, never a panic or an unbounded
//! allocation; a client that stalls runs into the deadline the server puts on the whole
//! request, and one that sends it in tiny pieces runs out of reads (see [`FREE_READS`]).

use std::io::{self, Read, Write};

/// Request line plus headers.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Bodies (only `POST /pprof/symbol` has one: addresses, 19 bytes each).
pub(crate) const MAX_BODY: usize = 4 * 1024 * 1024;
/// Reads a request may take whatever their size; beyond them, each further read must have
/// brought [`BYTES_PER_READ`] on average. A client sending one byte per segment would
/// otherwise wake its thread once per byte for up to 4 MiB; real clients send a request in a
/// few segments of a kilobyte or more.
pub(crate) const FREE_READS: usize = 64;
pub(crate) const BYTES_PER_READ: usize = 256;

#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) body: Vec<u8>,
}

/// A response with a status and a reason for it.
/// The header that names the process answering (on every response): with an endpoint that
/// moves through a process tree, a client can tell whom it reached.
pub const PID_HEADER: &str = "X-Cpuprof-Pid";

#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// A plain-text answer, for errors and the text endpoints.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        let mut body = body.into();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        Response::new(status, "text/plain; charset=utf-8", body.into_bytes())
    }

    pub(crate) fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{PID_HEADER}: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
            std::process::id()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        out.write_all(&self.body)?;
        out.flush()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Reads one request from `conn`. Errors are the response to send instead.
pub(crate) fn read_request(conn: &mut impl Read) -> Result<Request, Response> {
    let mut reads = Reads::default();
    let mut buf = Vec::with_capacity(1024);
    let mut searched = 0usize;
    let head_end = loop {
        // Only the bytes that came last can complete the blank line: searching the whole
        // buffer after every read would cost time quadratic in the head's size.
        let from = searched.saturating_sub(3);
        if let Some(i) = find(&buf[from..], b"\r\n\r\n") {
            break from + i;
        }
        searched = buf.len();
        if buf.len() > MAX_HEAD {
            return Err(Response::text(431, format!("request head over {MAX_HEAD} bytes")));
        }
        let mut chunk = [0u8; 4096];
        match reads.read(conn, &mut chunk) {
            Ok(0) => return Err(Response::text(400, "connection closed before the request was complete")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(refusal) => return Err(refusal),
        }
    };
    if head_end > MAX_HEAD {
        return Err(Response::text(431, format!("request head over {MAX_HEAD} bytes")));
    }
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| Response::text(400, "request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Response::text(400, format!("malformed request line {request_line:?}")));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(Response::text(400, format!("malformed request line {request_line:?}")));
    }
    let mut content_length = 0usize;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(Response::text(400, format!("malformed header line {line:?}")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value
                .parse()
                .map_err(|_| Response::text(400, format!("bad Content-Length {value:?}")))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Response::text(
                411,
                "send a Content-Length; transfer encodings are not accepted",
            ));
        }
    }
    if content_length > MAX_BODY {
        return Err(Response::text(413, format!("body over {MAX_BODY} bytes")));
    }
    let mut body = buf[head_end + 4..].to_vec();
    body.truncate(content_length);
    while body.len() < content_length {
        let mut chunk = vec![0u8; (content_length - body.len()).min(64 * 1024)];
        match reads.read(conn, &mut chunk) {
            Ok(0) => return Err(Response::text(400, "body shorter than its Content-Length")),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(refusal) => return Err(refusal),
        }
    }
    let (mut path, mut query) = target.split_once('?').unwrap_or((target, ""));
    // google-pprof, given `http://host:port/pprof/profile?seconds=2`, takes that whole URL as
    // its base and appends `/pprof/symbol` or `/pprof/profile?seconds=30` to it: a path after
    // the query is the path meant, and the user's own query wins over the appended one.
    if let Some(slash) = query.find('/') {
        let (users, appended) = query.split_at(slash);
        let (appended_path, appended_query) = appended.split_once('?').unwrap_or((appended, ""));
        path = appended_path;
        query = if users.is_empty() { appended_query } else { users };
    }
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        body,
    })
}

/// Counts a request's reads and bytes to hold it to its read budget.
#[derive(Default)]
struct Reads {
    reads: usize,
    bytes: usize,
}

impl Reads {
    fn read(&mut self, conn: &mut impl Read, chunk: &mut [u8]) -> Result<usize, Response> {
        if self.reads >= FREE_READS + self.bytes / BYTES_PER_READ {
            return Err(Response::text(
                400,
                format!(
                    "request arrived in too many small pieces ({} reads for {} bytes); send it in larger writes",
                    self.reads, self.bytes
                ),
            ));
        }
        self.reads += 1;
        loop {
            match conn.read(chunk) {
                Ok(n) => {
                    self.bytes += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(Response::text(408, "request not received in time")),
                Err(e) => return Err(Response::text(400, format!("cannot read the request: {e}"))),
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The value of `key` in a query string (`a=1&b=2`), undecoded.
pub(crate) fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<Request, Response> {
        read_request(&mut &raw[..])
    }

    #[test]
    fn reads_get_and_post() {
        let r = parse(b"GET /pprof/profile?seconds=2 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.query.as_str()),
            ("GET", "/pprof/profile", "seconds=2")
        );
        assert_eq!(query_param(&r.query, "seconds"), Some("2"));
        let r = parse(b"POST /pprof/symbol HTTP/1.0\r\nContent-Length: 11\r\n\r\n0x10+0x2000").unwrap();
        assert_eq!(r.body, b"0x10+0x2000");
        let r = parse(b"GET /pprof/profile?seconds=2/pprof/symbol HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(r.path, "/pprof/symbol");
        let r = parse(b"GET /pprof/profile?seconds=2/pprof/profile?seconds=30 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((r.path.as_str(), r.query.as_str()), ("/pprof/profile", "seconds=2"));
    }

    #[test]
    fn refuses_what_it_should() {
        let status = |raw: &[u8]| parse(raw).unwrap_err().status;
        assert_eq!(status(b"GET /\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nno colon\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: x"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"), 413);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
        assert_eq!(status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 411);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort"), 400);
        let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
        huge.resize(MAX_HEAD + 10, b'a');
        assert_eq!(status(&huge), 431);
    }

    /// A reader handing out one byte per call, as a client sending one-byte segments does.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(1);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_request_in_tiny_pieces_runs_out_of_reads() {
        let short = b"GET / HTTP/1.1\r\n\r\n";
        assert!(read_request(&mut Trickle(short)).is_ok());
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(8000, b'a');
        long.extend_from_slice(b"\r\n\r\n");
        let refusal = read_request(&mut Trickle(&long)).unwrap_err();
        assert_eq!(refusal.status, 400);
        assert!(String::from_utf8_lossy(&refusal.body).contains("too many small pieces"));
        // The same request in one piece is fine, as is a body of many full segments.
        assert!(read_request(&mut &long[..]).is_ok());
    }

    #[test]
    fn responses_carry_length_and_close() {
        let mut out = Vec::new();
        Response::text(409, "busy").write_to(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 409 Conflict\r\n"), "{text}");
        assert!(text.contains("Content-Length: 5\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.contains(&format!("X-Cpuprof-Pid: {}\r\n", std::process::id())));
        assert!(text.ends_with("\r\n\r\nbusy\n"));
    }
}
