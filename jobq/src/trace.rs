//! Trace context across the queue (the `otel` feature): `enqueue` and `outbox::Event::new`
//! capture the current span's W3C trace context (`traceparent`, `tracestate`) into the
//! row, and each attempt's `jobq.job` span takes the enqueuing span as its parent, so one
//! trace shows the request, the enqueue and every attempt with its retries.
//!
//! The context is read from `tracing`'s current span through `tracing-opentelemetry`, so
//! it is captured only when the application installed its layer and the span is sampled
//! in; otherwise nothing is stored and attempts start traces of their own. The W3C
//! propagator is used directly, whatever global propagator the application set, because
//! the row is read back by jobq alone. Without the feature nothing is captured.

use std::collections::HashMap;

#[cfg(feature = "otel")]
use opentelemetry::{propagation::TextMapPropagator, trace::TraceContextExt};
#[cfg(feature = "otel")]
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "otel")]
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The current span's trace context as W3C headers (`traceparent`, and `tracestate` when
/// it is not empty), or `None` when there is no valid span context to carry.
#[cfg(feature = "otel")]
pub(crate) fn capture() -> Option<HashMap<String, String>> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.retain(|_, v| !v.is_empty());
    (!carrier.is_empty()).then_some(carrier)
}

/// The `jobq.enqueue` span of an enqueue of `jobs` (one kind, one round trip); each job
/// is given its trace context. The span exists only when the current span has a trace to
/// continue: it is a producer span, child of the caller's, and each attempt's span is its
/// child. Otherwise it is disabled and the jobs carry nothing, so an untraced enqueue
/// keeps the plain insert.
#[cfg(feature = "otel")]
pub(crate) fn enqueue_span(kind: &str, jobs: &mut [crate::store::NewJob]) -> tracing::Span {
    if !tracing::Span::current()
        .context()
        .span()
        .span_context()
        .is_valid()
    {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "jobq.enqueue",
        otel.name = %format_args!("publish {kind}"),
        otel.kind = "producer",
        messaging.system = "jobq",
        messaging.operation.type = "publish",
        messaging.batch.message_count = jobs.len(),
    );
    let carried = span
        .in_scope(capture)
        .and_then(|c| serde_json::to_string(&c).ok());
    for job in jobs {
        job.trace_context.clone_from(&carried);
    }
    span
}

/// Without the `otel` feature enqueues carry no trace context.
#[cfg(not(feature = "otel"))]
pub(crate) fn enqueue_span(_kind: &str, _jobs: &mut [crate::store::NewJob]) -> tracing::Span {
    tracing::Span::none()
}

/// Makes `span` (not yet entered) a child of the context stored as `stored`. A context
/// that does not parse is ignored: the attempt then starts a trace of its own.
#[cfg(feature = "otel")]
pub(crate) fn continue_in(span: &tracing::Span, stored: Option<&str>) {
    let Some(carrier) =
        stored.and_then(|s| serde_json::from_str::<HashMap<String, String>>(s).ok())
    else {
        return;
    };
    let parent = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed: nothing to continue then.
        let _ = span.set_parent(parent);
    }
}

/// Without the `otel` feature there is no context to capture.
#[cfg(not(feature = "otel"))]
pub(crate) fn capture() -> Option<HashMap<String, String>> {
    None
}

/// Without the `otel` feature attempts start traces of their own.
#[cfg(not(feature = "otel"))]
pub(crate) fn continue_in(_span: &tracing::Span, _stored: Option<&str>) {}
