//! Metrics, as a Prometheus scrape sees them: the job counters of one enqueue and run, and
//! the outbox's `jobq_outbox_published_total`, `jobq_outbox_publish_failures_total`,
//! `jobq_outbox_unpublished` and `jobq_outbox_lag_seconds` from a relay to the real NATS
//! JetStream. The recorder is process-global, so this binary holds one test.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use jobq::outbox::{self, Event, OutboxEvent, Relay};
use jobq::{JobContext, JobError, Runtime};
use jobq_testing::TestDatabase;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tests::{N, eventually, init_tracing, job_state};

#[jobq::job(kind = "metrics_ok", retry = "none")]
async fn counted(_ctx: JobContext, _args: N) -> Result<(), JobError> {
    Ok(())
}

/// The value of the sample `name{labels}` in the scrape, if present.
fn sample(handle: &PrometheusHandle, name_and_labels: &str) -> Option<f64> {
    handle.render().lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        (series == name_and_labels).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_the_outbox_report_what_they_did() -> anyhow::Result<()> {
    init_tracing();
    let handle = PrometheusBuilder::new().install_recorder()?;
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await?;
    let js = jetstream::new(client.clone());
    let name = format!("JOBQ_METRICS_{}", std::process::id());
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await?;

    // Five events the stream takes, two whose subject no stream holds.
    let mut tx = pool.begin().await?;
    let job = Counted::enqueue(&mut tx, N { n: 1 }).await?.id;
    for i in 0..5 {
        outbox::publish(&mut tx, Event::new("m_sent", &i)).await?;
    }
    for i in 0..2 {
        outbox::publish(&mut tx, Event::new("m_lost", &i)).await?;
    }
    tx.commit().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let stream_subject = format!("{name}.events");
    let relay = Relay::nats(client, move |e: &OutboxEvent| {
        if e.event_type == "m_sent" {
            stream_subject.clone()
        } else {
            "jobq.metrics.nowhere".to_owned()
        }
    })
    .poll_interval(Duration::from_millis(50))
    .backoff(Duration::from_millis(50), Duration::from_millis(200));
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Counted>()
        .relay(relay)
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?;

    let published = r#"jobq_outbox_published_total{event_type="m_sent"}"#;
    assert!(
        eventually(Duration::from_secs(30), || async {
            sample(&handle, published) == Some(5.0)
        })
        .await,
        "{}",
        handle.render()
    );
    let failures = r#"jobq_outbox_publish_failures_total{code="nats_stream_not_found"}"#;
    assert!(
        eventually(Duration::from_secs(30), || async {
            sample(&handle, failures).is_some_and(|n| n >= 2.0)
        })
        .await,
        "{}",
        handle.render()
    );
    // The relay's first gauge reading, taken before it sent anything: 5 + 2 unpublished,
    // the oldest at least the 300 ms waited.
    let unpublished = |t: &str| format!(r#"jobq_outbox_unpublished{{event_type="{t}"}}"#);
    let lag = |t: &str| format!(r#"jobq_outbox_lag_seconds{{event_type="{t}"}}"#);
    assert_eq!(sample(&handle, &unpublished("m_lost")), Some(2.0));
    assert!(sample(&handle, &lag("m_lost")).is_some_and(|s| s >= 0.3));
    // Refreshed every 5 s: the drained type reads zero, the stuck one keeps its lag.
    assert!(
        eventually(Duration::from_secs(30), || async {
            sample(&handle, &unpublished("m_sent")) == Some(0.0)
                && sample(&handle, &lag("m_sent")) == Some(0.0)
        })
        .await,
        "{}",
        handle.render()
    );
    assert_eq!(sample(&handle, &unpublished("m_lost")), Some(2.0));
    assert!(sample(&handle, &lag("m_lost")).is_some_and(|s| s >= 5.0));

    // The job's counters.
    assert!(
        eventually(Duration::from_secs(30), || async {
            job_state(pool, job).await.0 == "done"
        })
        .await
    );
    let labels = r#"{kind="metrics_ok",queue="default"}"#;
    assert_eq!(
        sample(&handle, &format!("jobq_jobs_enqueued_total{labels}")),
        Some(1.0)
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            sample(&handle, &format!("jobq_jobs_completed_total{labels}")) == Some(1.0)
        })
        .await,
        "{}",
        handle.render()
    );
    rt.shutdown().await;
    js.delete_stream(&name).await?;
    Ok(())
}
