//! Labels from `tracing` spans (feature `tracing`): [`LabelLayer`].

use super::{keep_trace, swap, LabelSet};
use std::cell::RefCell;
use tracing_core::field::{Field, Visit};
use tracing_core::{span, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The label keys of trace correlation, kept only for sampled traces.
const TRACE_KEYS: [&str; 2] = ["trace_id", "span_id"];

/// A `tracing-subscriber` layer that installs chosen span fields
/// as the thread's label set while the span is entered, and puts back the set before it when
/// the span is exited (feature `tracing`).
///
/// ```
/// use tracing_subscriber::layer::SubscriberExt;
/// let subscriber = tracing_subscriber::registry()
///     .with(cpuprof::labels::LabelLayer::new(&["endpoint", "tenant"]));
/// tracing::subscriber::with_default(subscriber, || {
///     let span = tracing::info_span!("request", endpoint = "/checkout", tenant = "acme");
///     let _entered = span.enter();
///     // Samples taken here carry endpoint=/checkout, tenant=acme.
///     assert!(cpuprof::labels::current().is_some());
/// });
/// ```
///
/// A span's set is its chosen fields and its parent's set (its own values win), interned when
/// the span is created or a field is recorded: entering is a swap. The set goes with the span,
/// so a future instrumented with a span (`Instrument`) keeps its labels on whichever thread
/// polls it. Trace ids are labels too (fields `trace_id` and `span_id`, as Pyroscope names
/// them); every distinct value is a set of its own, kept for the life of the process, so
/// [`LabelLayer::sample_traces`] keeps them for one trace in N ([`keep_trace`]).
#[derive(Clone, Debug)]
pub struct LabelLayer {
    fields: Box<[&'static str]>,
    one_trace_in: u64,
}

/// A span's label set, in its extensions.
struct SpanLabels(&'static LabelSet);

thread_local! {
    /// Spans entered on this thread that installed a set, with the set installed before.
    static ENTERED: RefCell<Vec<(span::Id, Option<&'static LabelSet>)>> = const { RefCell::new(Vec::new()) };
}

impl LabelLayer {
    /// A layer that labels samples with the span fields named `fields` (`trace_id` and
    /// `span_id` among them, if wanted: see [`LabelLayer::sample_traces`]).
    pub fn new(fields: &[&'static str]) -> LabelLayer {
        LabelLayer {
            fields: fields.into(),
            one_trace_in: 1,
        }
    }

    /// Keeps `trace_id` and `span_id` labels for one trace in `n` only (chosen by the trace
    /// id, the same way in every process: [`keep_trace`]); the other labels stay on every
    /// span.
    pub fn sample_traces(mut self, n: u64) -> LabelLayer {
        self.one_trace_in = n.max(1);
        self
    }

    /// `pairs` with the trace keys removed if their trace is not sampled.
    fn sampled(&self, mut pairs: Vec<(String, String)>) -> Vec<(String, String)> {
        let trace = pairs.iter().find(|(k, _)| k == TRACE_KEYS[0]).map(|(_, v)| v.as_str());
        if !trace.is_some_and(|t| keep_trace(t, self.one_trace_in)) {
            pairs.retain(|(k, _)| !TRACE_KEYS.contains(&k.as_str()));
        }
        pairs
    }

    /// The set of `base` with the chosen fields `values` records replacing or adding pairs.
    fn set_with(&self, base: Vec<(String, String)>, record: impl FnOnce(&mut Pick<'_>)) -> Option<&'static LabelSet> {
        let mut pick = Pick {
            wanted: &self.fields,
            pairs: base,
        };
        record(&mut pick);
        let pairs = self.sampled(pick.pairs);
        (!pairs.is_empty()).then(|| LabelSet::new(&pairs))
    }
}

/// Collects the chosen fields' values into pairs, a later value replacing an earlier one.
struct Pick<'a> {
    wanted: &'a [&'static str],
    pairs: Vec<(String, String)>,
}

impl Pick<'_> {
    fn put(&mut self, field: &Field, value: String) {
        if !self.wanted.contains(&field.name()) {
            return;
        }
        match self.pairs.iter_mut().find(|(k, _)| k == field.name()) {
            Some(pair) => pair.1 = value,
            None => self.pairs.push((field.name().to_string(), value)),
        }
    }
}

impl Visit for Pick<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

/// The pairs of a set, owned.
fn pairs_of(set: Option<&'static LabelSet>) -> Vec<(String, String)> {
    set.map(|s| s.pairs().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        .unwrap_or_default()
}

impl<S> Layer<S> for LabelLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<SpanLabels>().map(|l| l.0));
        if let Some(set) = self.set_with(pairs_of(parent), |pick| attrs.record(pick)) {
            span.extensions_mut().insert(SpanLabels(set));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let before = span.extensions().get::<SpanLabels>().map(|l| l.0);
        if let Some(set) = self.set_with(pairs_of(before), |pick| values.record(pick)) {
            span.extensions_mut().replace(SpanLabels(set));
        }
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(set) = span.extensions().get::<SpanLabels>().map(|l| l.0) else {
            return;
        };
        let previous = swap(Some(set));
        ENTERED.with(|e| e.borrow_mut().push((id.clone(), previous)));
    }

    fn on_exit(&self, id: &span::Id, _ctx: Context<'_, S>) {
        ENTERED.with(|e| {
            let mut entered = e.borrow_mut();
            // Spans exit in the reverse order of entering on a thread; one that installed no
            // set is not in the stack.
            if entered.last().is_some_and(|(top, _)| top == id) {
                let (_, previous) = entered.pop().unwrap();
                swap(previous);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    fn labels() -> Vec<(String, String)> {
        pairs_of(super::super::current())
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn spans_install_their_fields_and_their_parents_and_restore_on_exit() {
        let subscriber = tracing_subscriber::registry().with(LabelLayer::new(&["endpoint", "tenant", "n"]));
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("request", endpoint = "/a", tenant = "acme", other = 1);
            let _o = outer.enter();
            assert_eq!(labels(), pairs(&[("endpoint", "/a"), ("tenant", "acme")]));
            {
                let inner = tracing::info_span!("step", endpoint = "/a/step", n = tracing::field::Empty);
                let _i = inner.enter();
                assert_eq!(labels(), pairs(&[("endpoint", "/a/step"), ("tenant", "acme")]));
                inner.record("n", 7);
                drop(_i);
                let _again = inner.enter();
                assert_eq!(
                    labels(),
                    pairs(&[("endpoint", "/a/step"), ("n", "7"), ("tenant", "acme")])
                );
            }
            assert_eq!(labels(), pairs(&[("endpoint", "/a"), ("tenant", "acme")]));
            let unlabelled = tracing::info_span!("idle", other = 2);
            let _u = unlabelled.enter();
            assert_eq!(labels(), pairs(&[("endpoint", "/a"), ("tenant", "acme")]));
        });
        assert!(super::super::current().is_none());
    }

    #[test]
    fn trace_ids_are_kept_for_one_trace_in_n() {
        let layer = LabelLayer::new(&["endpoint", "trace_id", "span_id"]).sample_traces(4);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let mut kept = 0;
            for t in 0..400 {
                let trace = format!("{t:032x}");
                let span = tracing::info_span!("r", endpoint = "/a", trace_id = trace.as_str(), span_id = "01");
                let _e = span.enter();
                let l = labels();
                assert!(l.contains(&("endpoint".to_string(), "/a".to_string())));
                let has = l.iter().any(|(k, _)| k == "trace_id");
                assert_eq!(has, keep_trace(&trace, 4));
                assert_eq!(has, l.iter().any(|(k, _)| k == "span_id"));
                kept += usize::from(has);
            }
            assert!((60..140).contains(&kept), "{kept} of 400 traces kept at one in 4");
        });
    }
}
