//! What each URL answers: pprof's remote-server protocol (`/pprof/...`, read by google-pprof)
//! and `/debug/pprof/profile` (gzipped protobuf, read by go tool pprof, Parca, Pyroscope).

use super::contention::Answer;
use super::request::{query_param, Request, Response};
use crate::error::Error;
use crate::format::pprof::{Frame, Pprof};
use crate::format::Profile;
use crate::sampler::events::Event;
use crate::session::options::DEFAULT_MEMORY_LIMIT;
use crate::session::{global, Options};
use crate::symbolize::Symbolizer;
use flate2::write::GzEncoder;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `seconds` when the request gives none (pprof's default).
pub(super) const DEFAULT_SECONDS: u64 = 30;
/// Longest profile a request may ask for.
pub(crate) const MAX_SECONDS: u64 = 300;

/// Profiles other programs ask for that cpuprof does not take.
const UNSUPPORTED: &[&str] = &[
    "/debug/pprof/goroutine",
    "/debug/pprof/threadcreate",
    "/debug/pprof/trace",
];

/// Waits up to the given time and says whether the client hung up meanwhile.
pub(crate) type ClientWatch<'a> = &'a dyn Fn(Duration) -> bool;

pub(crate) fn handle(req: &Request, client_gone: ClientWatch) -> Response {
    match (req.method.as_str(), req.path.as_str()) {
        (_, path) if UNSUPPORTED.contains(&path) => Response::text(
            501,
            format!(
                "{path}: not supported; cpuprof takes CPU, event, heap and contention profiles \
                 (/pprof/profile, /pprof/pmuprofile, /pprof/heap, /pprof/growth, /pprof/contention, \
                 /debug/pprof/profile, /debug/pprof/heap, /debug/pprof/allocs, /debug/pprof/mutex, \
                 /debug/pprof/block)"
            ),
        ),
        ("GET", "/pprof/heap") => super::heap::text(),
        ("GET", "/pprof/growth") => super::heap::growth(),
        ("GET", "/debug/pprof/heap") => super::heap::protobuf(req, false, client_gone),
        ("GET", "/debug/pprof/allocs") => super::heap::protobuf(req, true, client_gone),
        ("GET", "/pprof/contention") => super::contention::serve(req, Answer::Text, client_gone),
        ("GET", "/debug/pprof/mutex") => super::contention::serve(req, Answer::Protobuf { block: false }, client_gone),
        ("GET", "/debug/pprof/block") => super::contention::serve(req, Answer::Protobuf { block: true }, client_gone),
        ("GET", "/pprof/profile") => profile(req, Encoding::Legacy, None, client_gone),
        ("GET", "/debug/pprof/profile") => profile(req, Encoding::Protobuf, None, client_gone),
        ("GET", "/pprof/pmuprofile") => match event_of(req) {
            Ok(event) => profile(req, Encoding::Legacy, Some(event), client_gone),
            Err(message) => Response::text(400, message),
        },
        // go tool pprof asks `<profile URL>/../symbol` for names of mappings the profile has none
        // for: `/debug/pprof/symbol` after `/debug/pprof/profile`. (Not GET with addresses in
        // the query, as Go's own handler also takes: google-pprof's URLs put the user's
        // `?seconds=N` there.)
        ("GET", "/pprof/symbol" | "/debug/pprof/symbol") => Response::text(200, "num_symbols: 1"),
        ("POST", "/pprof/symbol" | "/debug/pprof/symbol") => symbols(&req.body),
        ("GET", "/pprof/cmdline") => cmdline(),
        (
            _,
            "/pprof/profile"
            | "/pprof/pmuprofile"
            | "/debug/pprof/profile"
            | "/pprof/cmdline"
            | "/pprof/heap"
            | "/pprof/growth"
            | "/debug/pprof/heap"
            | "/debug/pprof/allocs"
            | "/pprof/contention"
            | "/debug/pprof/mutex"
            | "/debug/pprof/block",
        ) => method_not_allowed("GET"),
        (_, "/pprof/symbol" | "/debug/pprof/symbol") => method_not_allowed("GET, POST"),
        (_, path) => Response::text(
            404,
            format!(
                "{path}: no such endpoint; try /pprof/profile?seconds=N, /debug/pprof/profile?seconds=N, \
                 /pprof/pmuprofile?event=NAME&period=N&seconds=N, \
                 /pprof/heap, /pprof/growth, /debug/pprof/heap, /debug/pprof/allocs, /pprof/contention, \
                 /debug/pprof/mutex, /debug/pprof/block, /pprof/symbol, \
                 /debug/pprof/symbol, /pprof/cmdline"
            ),
        ),
    }
}

fn method_not_allowed(allow: &'static str) -> Response {
    let mut r = Response::text(405, format!("method not allowed; use {allow}"));
    r.headers.push(("Allow", allow.to_string()));
    r
}

#[derive(Clone, Copy)]
enum Encoding {
    /// gperftools' raw profile, symbolised by the client through /pprof/symbol.
    Legacy,
    /// gzipped pprof protobuf, symbolised here.
    Protobuf,
}

/// Set while an on-demand profile is being taken: one at a time.
static PROFILING: AtomicBool = AtomicBool::new(false);

/// In a forked child: no profile of the endpoint's is being taken there (the thread taking
/// one stayed in the parent).
pub(crate) fn forget_in_flight() {
    PROFILING.store(false, Ordering::Release);
}

/// The event of a `/pprof/pmuprofile?event=NAME&period=N` request (pprof's spelling allows
/// `hw_event:unit_mask`; cpuprof takes perf's names and raw `rNNNN` codes).
fn event_of(req: &Request) -> Result<Event, String> {
    let Some(name) = query_param(&req.query, "event").filter(|n| !n.is_empty()) else {
        return Err(format!(
            "/pprof/pmuprofile needs ?event=NAME (one of {}), and takes &period=N and &seconds=N",
            crate::sampler::events::known_names()
        ));
    };
    crate::sampler::events::parse(name, query_param(&req.query, "period")).map_err(|why| format!("event={name}: {why}"))
}

/// A profile of `seconds` of CPU time or, with `event`, of that event, answered as `encoding`.
fn profile(req: &Request, encoding: Encoding, event: Option<Event>, client_gone: ClientWatch) -> Response {
    let seconds = match parse_seconds(query_param(&req.query, "seconds")) {
        Ok(s) => s,
        Err(message) => return Response::text(400, message),
    };
    if PROFILING.swap(true, Ordering::AcqRel) {
        return Response::text(
            409,
            "another profile request is being served; cpuprof takes one profile at a time, retry when it ends",
        );
    }
    let result = take_profile(seconds, event, client_gone);
    PROFILING.store(false, Ordering::Release);
    let taken = match result {
        Ok(Some(taken)) => taken,
        // Nobody reads this; the connection is closed after it.
        Ok(None) => return Response::text(400, "the client closed the connection; profile abandoned"),
        Err(Error::AlreadyRunning { path }) => {
            return Response::text(
                409,
                format!(
                    "the program is already being profiled into {} (CPUPROFILE or ProfilerStart); \
                     on-demand profiles are served when that profile stops",
                    path.display()
                ),
            )
        }
        // The event cannot be counted here (no hardware counters, perf_event_open refused):
        // the request asked for what this machine cannot give.
        Err(e @ Error::Event(_)) => return Response::text(422, format!("{e}")),
        Err(e) => return Response::text(500, format!("cannot take a profile: {e}")),
    };
    match encoding {
        Encoding::Legacy => Response::new(200, "application/octet-stream", taken.bytes),
        Encoding::Protobuf => match to_gzipped_protobuf(&taken) {
            Ok(body) => {
                let mut r = Response::new(200, "application/octet-stream", body);
                r.headers
                    .push(("Content-Disposition", "attachment; filename=\"profile\"".to_string()));
                r
            }
            Err(e) => Response::text(500, format!("cannot encode the profile: {e}")),
        },
    }
}

/// `?seconds=N` where it is optional (a delta of a running profile): `None` without it, a 400
/// answer for a bad value.
pub(super) fn optional_seconds(req: &Request) -> Result<Option<u64>, Response> {
    query_param(&req.query, "seconds")
        .map(|v| parse_seconds(Some(v)).map_err(|message| Response::text(400, message)))
        .transpose()
}

pub(super) fn parse_seconds(value: Option<&str>) -> Result<u64, String> {
    let Some(value) = value else { return Ok(DEFAULT_SECONDS) };
    match value.parse::<u64>() {
        Ok(s) if (1..=MAX_SECONDS).contains(&s) => Ok(s),
        _ => Err(format!(
            "seconds={value:?}: give a whole number of seconds from 1 to {MAX_SECONDS}"
        )),
    }
}

/// A profile taken on demand: the legacy file's bytes, when it started and how long it ran.
struct Taken {
    bytes: Vec<u8>,
    started: SystemTime,
    duration: Duration,
}

/// Profiles the whole process for `seconds`, in memory (no file is created), and returns the
/// profile's bytes; `None` when the client hung up first: the profile is stopped at once, so
/// the next request need not wait for a profile nobody will read.
fn take_profile(seconds: u64, event: Option<Event>, client_gone: ClientWatch) -> Result<Option<Taken>, Error> {
    let options = Options {
        report_on_stderr: false,
        in_memory: Some(DEFAULT_MEMORY_LIMIT),
        // What the request asks for, whatever CPUPROFILE_EVENT says.
        event,
        event_refused: None,
        ..Options::from_env(|k| std::env::var(k).ok())
    };
    let (started, clock) = (SystemTime::now(), Instant::now());
    global::start_on_demand(Path::new("(on-demand profile)"), options)?;
    let abandoned = client_gone(Duration::from_secs(seconds));
    let (_, bytes) = global::stop_on_demand_keeping()?;
    let duration = clock.elapsed();
    Ok(bytes.filter(|_| !abandoned).map(|bytes| Taken {
        bytes,
        started,
        duration,
    }))
}

fn to_gzipped_protobuf(taken: &Taken) -> Result<Vec<u8>, String> {
    let profile = Profile::parse(&taken.bytes).map_err(|e| e.to_string())?;
    let mut symbolizer = Symbolizer::new(profile.maps.clone());
    let mut pprof = Pprof::from_profile(
        &profile,
        |addr| function_frame(&mut symbolizer, addr),
        |_| String::new(),
    );
    // Lines only for named locations: a line without a function is nothing a reader shows.
    let named: Vec<u64> = pprof
        .locations
        .iter()
        .filter(|l| !l.frames.is_empty())
        .map(|l| l.address)
        .collect();
    let lines = symbolizer.lines(&named);
    for location in &mut pprof.locations {
        if let (Some(frame), Some((file, line))) = (location.frames.first_mut(), lines.get(&location.address)) {
            (frame.file, frame.line) = (file.clone(), *line);
        }
    }
    // The legacy file has no clock; the profile's own start and length are known here.
    let since_epoch = taken.started.duration_since(UNIX_EPOCH).unwrap_or_default();
    pprof.time_ns = u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX);
    pprof.duration_ns = u64::try_from(taken.duration.as_nanos()).unwrap_or(u64::MAX);
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&pprof.encode()).map_err(|e| e.to_string())?;
    gz.finish().map_err(|e| e.to_string())
}

/// The frame naming `addr` (its function, no line), or none: what the protobuf endpoints
/// give pprof's encoder for each location.
pub(super) fn function_frame(symbolizer: &mut Symbolizer, addr: u64) -> Vec<Frame> {
    symbolizer
        .function(addr)
        .map(|name| Frame {
            function: name.to_string(),
            ..Frame::default()
        })
        .into_iter()
        .collect()
}

/// `0xADDR+0xADDR...` -> `0xADDR<TAB>name` per address with a known function.
fn symbols(body: &[u8]) -> Response {
    let text = String::from_utf8_lossy(body);
    let mut symbolizer = Symbolizer::for_current_process();
    let mut out = String::new();
    for item in text.split(['+', '\n', '\r', ' ']).filter(|s| !s.is_empty()) {
        let hex = item
            .strip_prefix("0x")
            .or_else(|| item.strip_prefix("0X"))
            .unwrap_or(item);
        let Ok(addr) = u64::from_str_radix(hex, 16) else {
            return Response::text(400, format!("{item:?} is not a hexadecimal address"));
        };
        if let Some(name) = symbolizer.function(addr) {
            out.push_str(&format!("{item}\t{name}\n"));
        }
    }
    Response::text(200, out)
}

fn cmdline() -> Response {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let text: String = String::from_utf8_lossy(&raw).replace('\0', "\n");
    Response::text(200, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that stays for the whole profile.
    fn stays(wait: Duration) -> bool {
        std::thread::sleep(wait);
        false
    }

    fn handle(req: &Request) -> Response {
        super::handle(req, &stays)
    }

    fn get(path: &str) -> Request {
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        Request {
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn seconds_are_bounded() {
        assert_eq!(parse_seconds(None), Ok(30));
        assert_eq!(parse_seconds(Some("2")), Ok(2));
        for bad in ["-1", "0", "1e9", "1000000000", "abc", ""] {
            assert!(parse_seconds(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(handle(&get("/pprof/profile?seconds=-1")).status, 400);
    }

    #[test]
    fn a_profile_whose_client_left_is_stopped() {
        let r = super::handle(&get("/pprof/profile?seconds=300"), &|_| true);
        assert_eq!(r.status, 400);
        assert!(String::from_utf8_lossy(&r.body).contains("abandoned"));
        assert!(!PROFILING.load(Ordering::Acquire));
    }

    #[test]
    fn text_endpoints_and_refusals() {
        assert_eq!(handle(&get("/pprof/symbol")).body, b"num_symbols: 1\n");
        assert_eq!(handle(&get("/debug/pprof/symbol")).body, b"num_symbols: 1\n");
        // google-pprof's form of the symbol URL: the user's query is not addresses.
        assert_eq!(handle(&get("/pprof/symbol?seconds=2")).body, b"num_symbols: 1\n");
        let cmdline = String::from_utf8(handle(&get("/pprof/cmdline")).body).unwrap();
        assert!(cmdline.lines().next().is_some_and(|l| !l.is_empty()), "{cmdline}");
        let r = handle(&get("/debug/pprof/goroutine"));
        assert_eq!(r.status, 501);
        assert!(String::from_utf8_lossy(&r.body).contains("not supported"));
        for (query, says) in [
            ("", "needs ?event=NAME"),
            ("?event=hugs", "not an event cpuprof knows"),
            ("?event=cycles&period=0", "period"),
            ("?event=page-faults&seconds=0", "seconds"),
        ] {
            let r = handle(&get(&format!("/pprof/pmuprofile{query}")));
            assert_eq!(r.status, 400, "{query}");
            assert!(String::from_utf8_lossy(&r.body).contains(says), "{query}: {:?}", r.body);
        }
        assert_eq!(handle(&get("/nope")).status, 404);
        for path in ["/pprof/profile", "/debug/pprof/symbol"] {
            let mut delete = get(path);
            delete.method = "DELETE".into();
            assert_eq!(handle(&delete).status, 405, "{path}");
        }
    }

    #[test]
    fn symbol_lookup_names_this_process_functions() {
        let addr = cmdline as *const () as usize as u64;
        for path in ["/pprof/symbol", "/debug/pprof/symbol"] {
            let mut req = get(path);
            req.method = "POST".into();
            req.body = format!("{addr:#x}+0x8").into_bytes();
            let body = String::from_utf8(handle(&req).body).unwrap();
            let lines: Vec<&str> = body.lines().collect();
            assert_eq!(lines.len(), 1, "{path}: {body}");
            assert!(
                lines[0].starts_with(&format!("{addr:#x}\t")) && lines[0].contains("cmdline"),
                "{path}: {body}"
            );
            req.body = b"0xzz".to_vec();
            assert_eq!(handle(&req).status, 400);
        }
    }
}
