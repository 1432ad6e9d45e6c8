//! W3C Trace Context through the queue, so that an OpenTelemetry trace does not stop at
//! it.
//!
//! With the `otel` feature and a [`tracing-opentelemetry`](tracing_opentelemetry) layer
//! installed:
//! - an envelope built inside a span carries that span's context in its headers
//!   [`TRACEPARENT`] and [`TRACESTATE`] (and its trace id as `trace_id`, when none was
//!   set); on RabbitMQ they travel as AMQP headers too;
//! - the worker's `job` span is the child of that context on a job's first attempt
//!   (attempt 1: a snooze counts no attempt, so a snoozed run stays in the trace, and a
//!   replayed dead letter starts again at attempt 1), and on a retry starts a trace of
//!   its own with a link to it (a retry can come hours later; one trace per attempt
//!   keeps each readable, and the link leads back);
//! - an exec command gets `TRACEPARENT` and `TRACESTATE` of the `job` span.
//!
//! Without it, headers an envelope was published with pass through untouched, and an
//! exec command gets the envelope's own `traceparent`.

use std::collections::BTreeMap;

/// The header holding a W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The header holding a W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// Puts the current span's trace context into `headers`, unless they carry one; the
/// trace id (32 hex digits) when it did.
pub(crate) fn inject_current(headers: &mut BTreeMap<String, String>) -> Option<String> {
    if headers.contains_key(TRACEPARENT) {
        return None;
    }
    otel::inject_current(headers)
}

/// Relates the `job` span of a delivery to the trace its envelope carries: its child on
/// the first attempt, a new trace linked to it on a retry.
pub(crate) fn adopt(span: &tracing::Span, headers: &BTreeMap<String, String>, first: bool) {
    otel::adopt(span, headers, first);
}

/// The `TRACEPARENT` and `TRACESTATE` to give a command run for the current delivery:
/// its `job` span's context, or else the envelope's own headers.
pub fn for_command(headers: &BTreeMap<String, String>) -> (Option<String>, Option<String>) {
    let mut current = BTreeMap::new();
    if otel::inject_current(&mut current).is_some() {
        return (
            current.remove(TRACEPARENT),
            current.remove(TRACESTATE).filter(|s| !s.is_empty()),
        );
    }
    (
        headers.get(TRACEPARENT).cloned(),
        headers.get(TRACESTATE).cloned(),
    )
}

#[cfg(feature = "otel")]
mod otel {
    use std::collections::BTreeMap;

    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers<'a>(&'a mut BTreeMap<String, String>);

    impl Injector for Headers<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_owned(), value);
        }
    }

    struct ReadHeaders<'a>(&'a BTreeMap<String, String>);

    impl Extractor for ReadHeaders<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).map(String::as_str)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }

    pub(super) fn inject_current(headers: &mut BTreeMap<String, String>) -> Option<String> {
        let cx = tracing::Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        TraceContextPropagator::new().inject_context(&cx, &mut Headers(headers));
        Some(sc.trace_id().to_string())
    }

    pub(super) fn adopt(span: &tracing::Span, headers: &BTreeMap<String, String>, first: bool) {
        let cx = TraceContextPropagator::new().extract(&ReadHeaders(headers));
        let remote = cx.span().span_context().clone();
        if !remote.is_valid() {
            return;
        }
        if first {
            let _ = span.set_parent(cx);
        } else {
            // A root of its own, whatever context is current where it starts.
            let _ = span.set_parent(opentelemetry::Context::new());
            span.add_link(remote);
        }
    }
}

#[cfg(not(feature = "otel"))]
mod otel {
    use std::collections::BTreeMap;

    pub(super) fn inject_current(_: &mut BTreeMap<String, String>) -> Option<String> {
        None
    }

    pub(super) fn adopt(_: &tracing::Span, _: &BTreeMap<String, String>, _: bool) {}
}
