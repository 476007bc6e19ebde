//! jobq's metrics scraped by Prometheus.
//!
//! Installs `metrics-exporter-prometheus` as the `metrics` recorder, serves the
//! Prometheus text format on `http://127.0.0.1:9464/metrics` (loopback only; set
//! `METRICS_PORT` to change the port), and runs a runtime over a few hundred jobs that
//! succeed, retry and fail, so every jobq metric has samples: enqueued, completed,
//! retried and failed counters by kind and queue, run-time and wait histograms, and the
//! queue depth and oldest-age gauges (refreshed by the worker heartbeat).
//!
//! Run it with `cargo run -p examples --bin prometheus` (uses `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; it creates its own database
//! `jobq_prometheus_example`). It stops after `EXAMPLE_SECONDS` (default 30) or on
//! Ctrl-C; meanwhile `curl -s 127.0.0.1:9464/metrics | grep jobq_`.

use std::time::Duration;

use anyhow::Context;
use jobq::{Job, JobContext, JobError, RetryPolicy, Runtime};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A job that takes a little while; every seventh fails once, every thirteenth for good.
#[derive(Debug)]
pub struct Thumbnail;

/// Which image to render.
#[derive(Debug, Serialize, Deserialize)]
pub struct ImageArgs {
    /// The image.
    pub image_id: i64,
}

impl Job for Thumbnail {
    const KIND: &'static str = "thumbnail";
    const QUEUE: &'static str = "media";
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::from_millis(500)).max(3);
    type Args = ImageArgs;
    type Error = JobError;
    async fn run(ctx: JobContext, args: ImageArgs) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(20 + (args.image_id % 5) as u64 * 20)).await;
        if args.image_id % 13 == 0 {
            return Err(JobError::permanent(
                "corrupt_image",
                "cannot decode the image",
            ));
        }
        if args.image_id % 7 == 0 && ctx.attempt() == 1 {
            return Err(JobError::retryable(
                "storage_timeout",
                "object store timed out",
            ));
        }
        Ok(())
    }
}

/// Answers every request on `listener` with the current scrape (a minimal HTTP/1.1
/// responder; a real service would mount `handle.render()` on its own HTTP server).
async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut buf = [0_u8; 1024];
            let _ = socket.read(&mut buf).await;
            let body = handle.render();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    let handle = PrometheusBuilder::new()
        .set_buckets(&[
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ])?
        .install_recorder()
        .context("installing the Prometheus recorder")?;
    // Histograms need periodic upkeep when no HTTP listener of the exporter runs it.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let port: u16 = std::env::var("METRICS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9464);
    // Loopback only: metrics describe the workload and are nobody else's business.
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    tracing::info!("metrics on http://127.0.0.1:{port}/metrics");
    tokio::spawn(serve(listener, handle.clone()));

    let pool = examples::fresh_database("jobq_prometheus_example", 10).await?;
    jobq::migrate(&pool).await?;
    Thumbnail::enqueue_many(&pool, (1..=300).map(|image_id| ImageArgs { image_id })).await?;

    let seconds: u64 = std::env::var("EXAMPLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let stop = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        }
    };
    Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Thumbnail>()
        .queue("media", 8)
        .build()?
        .run_until(stop)
        .await?;
    let scrape = handle.render();
    let lines: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("jobq_jobs_") || l.starts_with("jobq_queue_"))
        .collect();
    println!("{}", lines.join("\n"));
    pool.close().await;
    Ok(())
}
