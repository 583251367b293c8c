//! The contention profile's endpoints (`crate::contention`, docs/CONTENTION.md):
//! * `/pprof/contention`: the text google-pprof reads (`--- contention:`);
//! * `/debug/pprof/mutex` and `/debug/pprof/block`: gzipped protobuf with Go's sample types
//!   `contentions/count` and `delay/nanoseconds`. As in Go, `mutex` charges the holders (the
//!   releasing threads' chains) and `block` the waiters (Go tells lock waits from other
//!   blocking; here a semaphore is how Python's `threading.Lock` blocks, and a futex wait is how
//!   Rust's `Mutex` and `Condvar` both do: the call chains tell them apart).
//!
//! With a contention profile running (`CPUPROFILE_CONTENTION`), each answers the profile so far,
//! or with `?seconds=N` what the next N seconds added (Go's handlers' delta). Without one, the
//! request takes one for `?seconds=N` (30 by default, as the CPU profile) and answers it.

use super::endpoints::{optional_seconds, ClientWatch};
use super::request::{Request, Response};
use crate::contention::{self, View};
use crate::format::contention::{ContentionProfile, ContentionRecord};
use crate::symbolize::Symbolizer;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Set while a request takes a profile of its own: one at a time.
static TAKING: AtomicBool = AtomicBool::new(false);

/// What a request asked for: text or protobuf, and which waits.
#[derive(Clone, Copy)]
pub(super) enum Answer {
    /// `/pprof/contention`.
    Text,
    /// `/debug/pprof/mutex` (`false`) or `/debug/pprof/block` (`true`).
    Protobuf { block: bool },
}

/// Answers a contention endpoint.
pub(super) fn serve(req: &Request, answer: Answer, client_gone: ClientWatch) -> Response {
    let seconds = match optional_seconds(req) {
        Ok(s) => s,
        Err(response) => return response,
    };
    let started = SystemTime::now();
    let view = match answer {
        Answer::Protobuf { block: false } => View::Holders,
        _ => View::Waiters,
    };
    let taken = if contention::is_running() && !TAKING.load(Ordering::Acquire) {
        continuous(view, seconds, client_gone)
    } else {
        on_demand(view, seconds.unwrap_or(super::endpoints::DEFAULT_SECONDS), client_gone)
    };
    let profile = match taken {
        Ok(Some(profile)) => profile,
        Ok(None) => return Response::text(400, "the client closed the connection; profile abandoned"),
        Err(response) => return response,
    };
    match answer {
        Answer::Text => Response::new(200, "text/plain; charset=utf-8", profile.to_text()),
        Answer::Protobuf { block } => protobuf(&profile, started, seconds, block),
    }
}

/// The running profile's `view` so far, or what the next `seconds` added to it.
fn continuous(
    view: View,
    seconds: Option<u64>,
    client_gone: ClientWatch,
) -> Result<Option<ContentionProfile>, Response> {
    let before = contention::current(view);
    let Some(s) = seconds else { return Ok(Some(before)) };
    if client_gone(Duration::from_secs(s)) {
        return Ok(None);
    }
    let mut after = contention::current(view);
    let earlier: HashMap<&[u64], (u64, u64)> = before
        .records
        .iter()
        .map(|r| (r.stack.as_slice(), (r.delay_ns, r.count)))
        .collect();
    after.records = after
        .records
        .iter()
        .filter_map(|r| {
            let (delay, count) = earlier.get(r.stack.as_slice()).copied().unwrap_or_default();
            let added = ContentionRecord {
                delay_ns: r.delay_ns.saturating_sub(delay),
                count: r.count.saturating_sub(count),
                stack: r.stack.clone(),
            };
            (added.count > 0).then_some(added)
        })
        .collect();
    after.duration_ms = s * 1000;
    Ok(Some(after))
}

/// The `view` of a profile of the next `seconds`, taken for this request.
fn on_demand(view: View, seconds: u64, client_gone: ClientWatch) -> Result<Option<ContentionProfile>, Response> {
    if TAKING.swap(true, Ordering::AcqRel) {
        return Err(Response::text(
            409,
            "another contention profile request is being served; retry when it ends",
        ));
    }
    let result = match contention::start(contention::DEFAULT_PERIOD_NS) {
        Ok(()) => {
            let gone = client_gone(Duration::from_secs(seconds));
            contention::stop();
            Ok((!gone).then(|| contention::current(view)))
        }
        Err(e) => Err(Response::text(500, format!("cannot take a contention profile: {e}"))),
    };
    TAKING.store(false, Ordering::Release);
    result
}

fn protobuf(profile: &ContentionProfile, started: SystemTime, seconds: Option<u64>, block: bool) -> Response {
    let mut symbolizer = Symbolizer::new(profile.maps());
    let mut pprof = profile.to_pprof(
        |addr| super::endpoints::function_frame(&mut symbolizer, addr),
        |_| String::new(),
    );
    let since_epoch = started.duration_since(UNIX_EPOCH).unwrap_or_default();
    pprof.time_ns = u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX);
    if let Some(s) = seconds {
        pprof.duration_ns = s * 1_000_000_000;
    }
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    match gz.write_all(&pprof.encode()).and_then(|()| gz.finish()) {
        Ok(body) => {
            let mut r = Response::new(200, "application/octet-stream", body);
            let name = if block { "block" } else { "mutex" };
            r.headers
                .push(("Content-Disposition", format!("attachment; filename=\"{name}\"")));
            r
        }
        Err(e) => Response::text(500, format!("cannot encode the contention profile: {e}")),
    }
}
