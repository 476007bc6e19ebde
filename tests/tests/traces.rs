//! Trace propagation (the `otel` feature): a job enqueued inside a traced span carries
//! its W3C context in `jobs.trace_context`, and every attempt's `jobq.job` span — the
//! retries included — is a child of the `jobq.enqueue` span, itself a child of the
//! enqueuing request's span, in one trace. Spans are collected by OpenTelemetry's
//! in-memory exporter through `tracing-opentelemetry`, as an application would wire it.

use std::sync::OnceLock;

use jobq::admin::Admin;
use jobq::outbox::Event;
use jobq::{JobContext, JobError, Runtime};
use jobq_testing::TestDatabase;
use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use sqlx::PgPool;
use tests::{N, job_state, run_until_finished};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// The exporter and provider every test of this binary shares (the subscriber is global,
/// so that the runtime's tasks on other threads report to it).
fn otel() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static OTEL: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    OTEL.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("jobq-tests"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        (exporter, provider)
    })
}

/// The finished spans of trace `trace`.
fn spans_of(trace: TraceId) -> Vec<SpanData> {
    let (exporter, provider) = otel();
    provider.force_flush().expect("flush");
    exporter
        .get_finished_spans()
        .expect("spans")
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

/// Fails its first attempt (retryable), succeeds on the second.
#[jobq::job(kind = "trace_flaky", retry = "fixed(10ms, max = 3)")]
async fn flaky(ctx: JobContext, _args: N) -> Result<(), JobError> {
    if ctx.attempt() == 1 {
        return Err(JobError::retryable("flaky", "first attempt fails"));
    }
    Ok(())
}

fn runtime(pool: &PgPool) -> jobq::RuntimeBuilder {
    Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Flaky>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_continues_the_trace_of_the_request_that_enqueued_it() -> anyhow::Result<()> {
    otel();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let request = tracing::info_span!("http_request");
    let trace = request.context().span().span_context().trace_id();
    let request_span = request.context().span().span_context().span_id();
    assert_ne!(trace, TraceId::INVALID, "the layer is installed");
    let id = async {
        let mut tx = pool.begin().await?;
        let e = Flaky::enqueue(&mut tx, N { n: 1 }).await?;
        tx.commit().await?;
        anyhow::Ok(e.id)
    }
    .instrument(request.clone())
    .await?;
    drop(request);

    let stored: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT trace_context FROM jobq.jobs WHERE id = $1")
            .bind(id.0)
            .fetch_one(pool)
            .await?;
    let traceparent = stored
        .as_ref()
        .and_then(|c| c["traceparent"].as_str())
        .expect("a traceparent is stored");
    assert!(
        traceparent.contains(&trace.to_string()),
        "{traceparent} is in trace {trace}"
    );
    let row = Admin::new(pool.clone()).job(id).await?.job;
    assert_eq!(row.trace_id(), Some(trace.to_string()));

    run_until_finished(runtime(pool), pool, &[id]).await;
    assert_eq!(job_state(pool, id).await, ("done".to_owned(), 2));

    let spans = spans_of(trace);
    let enqueue: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "publish trace_flaky")
        .collect();
    assert_eq!(enqueue.len(), 1, "one enqueue span: {spans:#?}");
    assert_eq!(enqueue[0].parent_span_id, request_span);
    let enqueue_span = enqueue[0].span_context.span_id();
    let attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "process trace_flaky")
        .collect();
    assert_eq!(
        attempts.len(),
        2,
        "both attempts are in the request's trace"
    );
    for attempt in attempts {
        assert_eq!(attempt.parent_span_id, enqueue_span);
        assert_eq!(attempt.span_kind, opentelemetry::trace::SpanKind::Consumer);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_outside_any_trace_carries_none_and_starts_its_own() -> anyhow::Result<()> {
    otel();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let id = Flaky::enqueue(pool, N { n: 2 }).await?.id;
    let stored: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT trace_context FROM jobq.jobs WHERE id = $1")
            .bind(id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(stored, None);
    assert_eq!(Admin::new(pool.clone()).job(id).await?.job.trace_id(), None);
    run_until_finished(runtime(pool), pool, &[id]).await;
    assert_eq!(job_state(pool, id).await.0, "done");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_outbox_events_carry_the_enqueuing_trace() -> anyhow::Result<()> {
    otel();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let request = tracing::info_span!("http_request");
    let trace = request
        .context()
        .span()
        .span_context()
        .trace_id()
        .to_string();
    let ids = async {
        let mut tx = pool.begin().await?;
        let many = Flaky::enqueue_many(&mut tx, (10..13).map(|n| N { n })).await?;
        jobq::outbox::publish(&mut tx, Event::new("trace_noted", &1)).await?;
        tx.commit().await?;
        anyhow::Ok(many)
    }
    .instrument(request)
    .await?;
    let admin = Admin::new(pool.clone());
    for e in &ids {
        assert_eq!(admin.job(e.id).await?.job.trace_id(), Some(trace.clone()));
    }
    let header: Option<String> =
        sqlx::query_scalar("SELECT headers->>'traceparent' FROM jobq.outbox")
            .fetch_one(pool)
            .await?;
    let header = header.expect("the event carries a traceparent");
    assert!(header.contains(&trace), "{header} is in trace {trace}");
    Ok(())
}
