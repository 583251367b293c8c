//! The heap profile's endpoints, answered from the running heap profile (`HEAPPROFILE`,
//! `HeapProfilerStart`, `heap::start`, or the endpoint itself in a preloaded program:
//! `docs/HEAP.md`):
//! * `/pprof/heap`: gperftools' text heap profile, as google-pprof asks for it;
//! * `/pprof/growth`: the call chains whose memory in use grew since the previous
//!   `/pprof/growth` request (since the heap profile started, for the first), as a
//!   `heap profile: ... @ growth` text with the grown objects and bytes, not sampled (already
//!   scaled); the `X-Cpuprof-Growth` header says since when;
//! * `/debug/pprof/heap` and `/debug/pprof/allocs`: gzipped protobuf with Go's four sample
//!   types (`inuse_space` and `alloc_space` the defaults); `?seconds=N` gives the difference
//!   over the next N seconds, as Go's handler does; `?gc=` is accepted and ignored.

use super::endpoints::{optional_seconds, ClientWatch};
use super::request::{Request, Response};
use crate::format::heap::{heap_pprof, HeapCounts, HeapKind, HeapProfile, HeapRecord};
use crate::heap;
use crate::symbolize::Symbolizer;
use crate::sync::Mutex;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn not_running() -> Response {
    Response::text(
        409,
        "no heap profile is running: start one with HEAPPROFILE=prefix, HeapProfilerStart, \
         cpuprof::heap::start, or CPUPROF_HEAP=1 beside CPUPROF_HTTP (docs/HEAP.md)",
    )
}

/// `/pprof/heap`.
pub(super) fn text() -> Response {
    if !heap::is_running() {
        return not_running();
    }
    let mut body = Vec::new();
    match heap::profile().write_text(&mut body) {
        Ok(()) => Response::new(200, "text/plain; charset=utf-8", body),
        Err(e) => Response::text(500, format!("cannot write the heap profile: {e}")),
    }
}

/// In-use objects and bytes per chain at the previous `/pprof/growth`, and when.
type InUse = HashMap<Vec<u64>, (i64, i64)>;
static GROWTH_BASE: Mutex<Option<(InUse, SystemTime)>> = Mutex::new(None);

/// `/pprof/growth`.
pub(super) fn growth() -> Response {
    if !heap::is_running() {
        return not_running();
    }
    let now = heap::profile();
    let inuse: InUse = now
        .by_stack()
        .into_iter()
        .map(|(stack, v)| (stack, (v[2], v[3])))
        .collect();
    let mut base = GROWTH_BASE.lock();
    let since = base.as_ref().map(|(_, at)| *at);
    let empty = InUse::new();
    let before = base.as_ref().map_or(&empty, |(b, _)| b);
    let mut records: Vec<HeapRecord> = inuse
        .iter()
        .filter_map(|(stack, &(objects, bytes))| {
            let (o0, b0) = before.get(stack).copied().unwrap_or_default();
            let grew = bytes - b0;
            (grew > 0).then(|| {
                let objects = (objects - o0).max(0) as u64;
                let c = HeapCounts {
                    inuse_objects: objects,
                    inuse_bytes: grew as u64,
                    alloc_objects: objects,
                    alloc_bytes: grew as u64,
                };
                HeapRecord {
                    counts: c,
                    stack: stack.clone(),
                }
            })
        })
        .collect();
    records.sort_by(|a, b| {
        b.counts
            .inuse_bytes
            .cmp(&a.counts.inuse_bytes)
            .then(a.stack.cmp(&b.stack))
    });
    *base = Some((inuse, SystemTime::now()));
    drop(base);
    let profile = HeapProfile {
        kind: HeapKind::Growth,
        period: 1,
        records,
        maps_text: now.maps_text,
    };
    let mut body = Vec::new();
    if let Err(e) = profile.write_text(&mut body) {
        return Response::text(500, format!("cannot write the growth profile: {e}"));
    }
    let mut r = Response::new(200, "text/plain; charset=utf-8", body);
    let since = match since {
        Some(at) => format!(
            "since the previous request, {} s ago",
            at.elapsed().unwrap_or_default().as_secs()
        ),
        None => "since the heap profile started".to_string(),
    };
    r.headers.push((
        "X-Cpuprof-Growth",
        format!("in-use bytes per call chain that grew {since}; estimated from samples"),
    ));
    r
}

/// A call chain and its four values.
type StackValues = (Vec<u64>, [i64; 4]);

/// `/debug/pprof/heap` (`allocs`: `/debug/pprof/allocs`, alloc_space the default).
pub(super) fn protobuf(req: &Request, allocs: bool, client_gone: ClientWatch) -> Response {
    if !heap::is_running() {
        return not_running();
    }
    let seconds = match optional_seconds(req) {
        Ok(s) => s,
        Err(response) => return response,
    };
    let started = SystemTime::now();
    let first = heap::profile();
    let (profile, values): (HeapProfile, Vec<StackValues>) = match seconds {
        None => {
            let values = first.by_stack().into_iter().collect();
            (first, values)
        }
        Some(s) => {
            if client_gone(Duration::from_secs(s)) {
                return Response::text(400, "the client closed the connection; profile abandoned");
            }
            let later = heap::profile();
            let before = first.by_stack();
            let values = later
                .by_stack()
                .into_iter()
                .map(|(stack, v)| {
                    let b = before.get(&stack).copied().unwrap_or_default();
                    let delta = [v[0] - b[0], v[1] - b[1], v[2] - b[2], v[3] - b[3]];
                    (stack, delta)
                })
                .filter(|(_, d)| d.iter().any(|&x| x != 0))
                .collect();
            (later, values)
        }
    };
    let maps = profile.maps();
    let mut symbolizer = Symbolizer::new(maps.clone());
    let mut pprof = heap_pprof(
        &maps,
        profile.period,
        values.iter().map(|(stack, v)| (stack.as_slice(), *v)),
        |addr| super::endpoints::function_frame(&mut symbolizer, addr),
        |_| String::new(),
    );
    if allocs {
        pprof.default_value = "alloc_space";
    }
    let since_epoch = started.duration_since(UNIX_EPOCH).unwrap_or_default();
    pprof.time_ns = u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX);
    if let Some(s) = seconds {
        pprof.duration_ns = s * 1_000_000_000;
    }
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    let body = gz.write_all(&pprof.encode()).and_then(|()| gz.finish());
    match body {
        Ok(body) => {
            let mut r = Response::new(200, "application/octet-stream", body);
            let name = if allocs { "allocs" } else { "heap" };
            r.headers
                .push(("Content-Disposition", format!("attachment; filename=\"{name}\"")));
            r
        }
        Err(e) => Response::text(500, format!("cannot encode the heap profile: {e}")),
    }
}
