//! Traces from enqueue to run (jobq's `otel` feature): a pretend HTTP request enqueues a
//! job inside its span; the job fails once and succeeds on its retry. The spans are
//! printed to stdout by OpenTelemetry's stdout exporter: `http_request`, its child
//! `publish traced_receipt` (the enqueue), and that span's two children
//! `process traced_receipt` (one per attempt), all with one trace id.
//!
//! Run it with `cargo run -p examples --bin traces` (uses `DATABASE_URL`; it creates its
//! own database `jobq_traces_example`). To send the spans to a collector instead, build
//! the provider with `opentelemetry-otlp`'s exporter
//! (`SpanExporter::builder().with_tonic().with_endpoint("http://127.0.0.1:4317")`) in
//! place of the stdout one; nothing else changes.

use std::time::Duration;

use jobq::{JobContext, JobError, Runtime};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// The job's arguments.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReceiptArgs {
    /// The order the receipt is for.
    pub order_id: i64,
}

/// Fails its first attempt, so the trace shows a retry.
#[jobq::job(kind = "traced_receipt", retry = "fixed(100ms, max = 3)")]
async fn traced_receipt(ctx: JobContext, args: ReceiptArgs) -> Result<(), JobError> {
    if ctx.attempt() == 1 {
        return Err(JobError::retryable(
            "smtp_busy",
            "the mail server said try later",
        ));
    }
    tracing::info!(order_id = args.order_id, "receipt sent");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("traces-example")));
    tracing::subscriber::set_global_default(subscriber)?;

    let pool = examples::fresh_database("jobq_traces_example", 10).await?;
    jobq::migrate(&pool).await?;

    // The request: its transaction writes the order and enqueues the receipt.
    let request = tracing::info_span!("http_request", http.route = "/orders");
    let id = async {
        let mut tx = pool.begin().await?;
        let e = TracedReceipt::enqueue(&mut tx, ReceiptArgs { order_id: 7 }).await?;
        tx.commit().await?;
        anyhow::Ok(e.id)
    }
    .instrument(request)
    .await?;

    let runtime = Runtime::builder(pool.clone())
        .queue("default", 2)
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?;
    let admin = jobq::admin::Admin::new(pool.clone());
    while admin.job(id).await?.job.state != "done" {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runtime.shutdown().await;
    let trace = admin.job(id).await?.job.trace_id().unwrap_or_default();
    provider.shutdown()?;
    println!("job {id} is done; its spans above share trace id {trace}");
    Ok(())
}
