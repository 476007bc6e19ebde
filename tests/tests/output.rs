//! Recorded output: a handler's `Ok(value)` of a `Serialize` type is stored with the job
//! as `jobs.output`, written with its completion, bounded in size; readable through
//! `jobq::admin`, the dashboard and `jobq-testing`.

use jobq::admin::Admin;
use jobq::{JobContext, JobError, Runtime};
use jobq_testing::TestDatabase;
use jobq_testing::{Outcome, Perform};
use serde::Serialize;
use sqlx::PgPool;
use tests::{N, init_tracing, job_state, run_until_finished};

/// What sending a receipt did.
#[derive(Debug, Serialize)]
pub struct Receipt {
    /// The invoice.
    pub invoice: i64,
    /// Where it went.
    pub sent_to: String,
}

#[jobq::job(kind = "out_receipt", retry = "none")]
async fn send_receipt(_ctx: JobContext, args: N) -> Result<Receipt, JobError> {
    Ok(Receipt {
        invoice: args.n,
        sent_to: format!("customer-{}@example.com", args.n),
    })
}

#[jobq::job(kind = "out_huge", retry = "none")]
async fn huge(_ctx: JobContext, args: N) -> Result<String, JobError> {
    Ok("x".repeat(usize::try_from(args.n).unwrap_or(0)))
}

/// Not `Serialize`: the value is the handler's own and nothing is recorded.
#[derive(Debug)]
pub struct Handle(
    /// A number.
    pub i64,
);

#[jobq::job(kind = "out_opaque", retry = "none")]
async fn opaque(_ctx: JobContext, args: N) -> Result<Handle, JobError> {
    Ok(Handle(args.n))
}

#[jobq::job(kind = "out_unit", retry = "none")]
async fn unit(ctx: JobContext, args: N) -> Result<(), JobError> {
    if args.n > 0 {
        ctx.record_output(&serde_json::json!({"explicit": args.n}))
            .map_err(|e| JobError::permanent("record", e.to_string()))?;
    }
    Ok(())
}

fn runtime(pool: &PgPool) -> jobq::RuntimeBuilder {
    Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<SendReceipt>()
        .register::<Huge>()
        .register::<Opaque>()
        .register::<Unit>()
}

async fn output(pool: &PgPool, id: jobq::JobId) -> Option<serde_json::Value> {
    sqlx::query_scalar("SELECT output FROM jobq.jobs WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_values_are_recorded_with_the_completion() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let receipt = SendReceipt::enqueue(pool, N { n: 42 }).await?.id;
    let opaque = Opaque::enqueue(pool, N { n: 1 }).await?.id;
    let plain = Unit::enqueue(pool, N { n: 0 }).await?.id;
    let explicit = Unit::enqueue(pool, N { n: 5 }).await?.id;
    run_until_finished(runtime(pool), pool, &[receipt, opaque, plain, explicit]).await;

    let want = serde_json::json!({"invoice": 42, "sent_to": "customer-42@example.com"});
    assert_eq!(job_state(pool, receipt).await.0, "done");
    assert_eq!(output(pool, receipt).await, Some(want.clone()));
    let detail = Admin::new(pool.clone()).job(receipt).await?;
    assert_eq!(detail.job.output, Some(want));
    assert_eq!(job_state(pool, opaque).await.0, "done");
    assert_eq!(
        output(pool, opaque).await,
        None,
        "not Serialize: nothing recorded"
    );
    assert_eq!(output(pool, plain).await, None);
    assert_eq!(
        output(pool, explicit).await,
        Some(serde_json::json!({"explicit": 5}))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_past_the_limit_fails_with_a_clear_error() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let limit = i64::try_from(jobq::MAX_OUTPUT_BYTES)?;
    let small = Huge::enqueue(pool, N { n: limit - 2 }).await?.id; // plus two quotes
    let big = Huge::enqueue(pool, N { n: limit }).await?.id;
    run_until_finished(runtime(pool), pool, &[small, big]).await;
    assert_eq!(job_state(pool, small).await.0, "done");
    assert_eq!(
        output(pool, small)
            .await
            .and_then(|o| o.as_str().map(str::len)),
        Some(jobq::MAX_OUTPUT_BYTES - 2)
    );
    let (state, code, message): (String, Option<String>, Option<String>) =
        sqlx::query_as("SELECT state, last_error_code, last_error FROM jobq.jobs WHERE id = $1")
            .bind(big.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(state, "failed");
    assert_eq!(code.as_deref(), Some("output_too_large"));
    let message = message.unwrap_or_default();
    assert!(message.contains("the limit is 65536"), "{message}");
    assert_eq!(output(pool, big).await, None);
    Ok(())
}

#[tokio::test]
async fn inline_runs_return_the_recorded_output() {
    let (outcome, out) = Perform::<SendReceipt>::new(N { n: 7 })
        .run_with_output()
        .await;
    assert!(matches!(outcome, Outcome::Done), "{outcome}");
    assert_eq!(
        out,
        Some(serde_json::json!({"invoice": 7, "sent_to": "customer-7@example.com"}))
    );
    let (outcome, out) = Perform::<Huge>::new(N { n: 70_000 })
        .run_with_output()
        .await;
    assert_eq!(outcome.code(), Some("output_too_large"), "{outcome}");
    assert_eq!(out, None);
    let (_, out) = Perform::<Opaque>::new(N { n: 1 }).run_with_output().await;
    assert_eq!(out, None);
}
