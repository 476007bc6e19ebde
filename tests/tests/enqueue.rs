//! Enqueue: in the caller's transaction, on a pool and a connection, with options, in
//! batches, with idempotency keys, and rejecting bad input with stable codes.

use std::time::Duration;

use jobq::{Job, JobContext, JobError};
use jobq_testing::TestDatabase;
use sqlx::Acquire;
use tests::N;

struct Keyed;

impl Job for Keyed {
    const KIND: &'static str = "keyed";
    type Args = N;
    type Error = JobError;
    fn idempotency_key(args: &N) -> Option<String> {
        Some(format!("n-{}", args.n))
    }
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

struct Plain;

impl Job for Plain {
    const KIND: &'static str = "plain";
    const QUEUE: &'static str = "mail";
    const PRIORITY: i16 = 3;
    const RETRY: jobq::RetryPolicy = jobq::RetryPolicy::exponential(7);
    type Args = N;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: N) -> Result<(), JobError> {
        Ok(())
    }
}

struct Blob;

impl Job for Blob {
    const KIND: &'static str = "blob";
    type Args = String;
    type Error = JobError;
    async fn run(_ctx: JobContext, _args: String) -> Result<(), JobError> {
        Ok(())
    }
}

async fn count(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn job_exists_exactly_when_the_transaction_commits() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();

    let mut tx = pool.begin().await?;
    let e = Plain::enqueue(&mut tx, N { n: 1 }).await?;
    assert!(!e.duplicate);
    // Not visible outside the transaction before commit.
    assert_eq!(count(pool).await, 0);
    tx.rollback().await?;
    assert_eq!(count(pool).await, 0, "a rolled-back enqueue leaves no job");

    let mut tx = pool.begin().await?;
    let e = Plain::enqueue(&mut tx, N { n: 2 }).await?;
    tx.commit().await?;
    let (state, attempts) = tests::job_state(pool, e.id).await;
    assert_eq!((state.as_str(), attempts), ("pending", 0));
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn enqueue_works_on_pool_connection_and_transaction() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    Plain::enqueue(pool, N { n: 1 }).await?;
    let mut conn = pool.acquire().await?;
    Plain::enqueue(&mut *conn, N { n: 2 }).await?;
    let mut tx = conn.begin().await?;
    Plain::enqueue(&mut *tx, N { n: 3 }).await?;
    Plain::enqueue(&mut tx, N { n: 4 }).await?;
    tx.commit().await?;
    drop(conn);
    assert_eq!(count(pool).await, 4);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn defaults_and_options_land_in_the_row() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let a = Plain::enqueue(pool, N { n: 1 }).await?;
    let row: (String, i16, i32, serde_json::Value) = sqlx::query_as(
        "SELECT queue, priority, max_attempts, payload FROM jobq.jobs WHERE id = $1",
    )
    .bind(a.id.0)
    .fetch_one(pool)
    .await?;
    assert_eq!(row, ("mail".into(), 3, 7, serde_json::json!({"n": 1})));

    let at = chrono::Utc::now() + chrono::Duration::hours(2);
    let b = Plain::with(N { n: 2 })
        .run_after(at)
        .priority(-5)
        .queue("urgent")
        .max_attempts(2)
        .enqueue(pool)
        .await?;
    let row: (String, i16, i32, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
        "SELECT queue, priority, max_attempts, run_after FROM jobq.jobs WHERE id = $1",
    )
    .bind(b.id.0)
    .fetch_one(pool)
    .await?;
    assert_eq!((row.0.as_str(), row.1, row.2), ("urgent", -5, 2));
    assert!((row.3 - at).num_milliseconds().abs() < 1);

    // run_in is measured by the database's clock.
    let c = Plain::with(N { n: 3 })
        .run_in(Duration::from_secs(600))
        .enqueue(pool)
        .await?;
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM run_after - now())::float8 FROM jobq.jobs WHERE id = $1",
    )
    .bind(c.id.0)
    .fetch_one(pool)
    .await?;
    assert!((590.0..=600.5).contains(&secs), "{secs}");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn duplicate_idempotency_key_returns_the_existing_job() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let first = Keyed::enqueue(pool, N { n: 7 }).await?;
    assert!(!first.duplicate);
    let second = Keyed::enqueue(pool, N { n: 7 }).await?;
    assert!(second.duplicate);
    assert_eq!(first.id, second.id);
    assert_eq!(count(pool).await, 1);

    // In any state, as long as the row exists.
    sqlx::query("UPDATE jobq.jobs SET state = 'done', finished_at = now()")
        .execute(pool)
        .await?;
    let third = Keyed::enqueue(pool, N { n: 7 }).await?;
    assert_eq!((third.id, third.duplicate), (first.id, true));

    // A key taken by a transaction that rolls back is free again (Oban #1087).
    let mut tx = pool.begin().await?;
    let in_tx = Keyed::enqueue(&mut tx, N { n: 8 }).await?;
    assert!(!in_tx.duplicate);
    tx.rollback().await?;
    let after = Keyed::enqueue(pool, N { n: 8 }).await?;
    assert!(!after.duplicate);
    assert_eq!(count(pool).await, 2);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn concurrent_duplicate_enqueues_insert_one_row() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            let e = Keyed::enqueue(&mut tx, N { n: 1 }).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.commit().await?;
            anyhow::Ok(e)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await??);
    }
    assert_eq!(ids.iter().filter(|e| !e.duplicate).count(), 1);
    assert!(ids.iter().all(|e| e.id == ids[0].id));
    assert_eq!(count(&pool).await, 1);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn enqueue_many_is_one_statement_in_order_with_duplicates() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let existing = Keyed::enqueue(pool, N { n: 2 }).await?;
    let out = Keyed::enqueue_many(pool, [1, 2, 3, 1, 4].map(|n| N { n })).await?;
    assert_eq!(out.len(), 5);
    assert_eq!(
        out.iter().map(|e| e.duplicate).collect::<Vec<_>>(),
        vec![false, true, false, true, false]
    );
    assert_eq!(out[1].id, existing.id);
    assert_eq!(out[3].id, out[0].id);
    assert_eq!(count(pool).await, 4);

    let plain = Plain::enqueue_many(pool, (0..1000).map(|n| N { n })).await?;
    assert_eq!(plain.len(), 1000);
    // Ids come back in input order and match the payloads.
    for (i, e) in plain.iter().enumerate().step_by(97) {
        let n: i64 =
            sqlx::query_scalar("SELECT (payload->>'n')::bigint FROM jobq.jobs WHERE id = $1")
                .bind(e.id.0)
                .fetch_one(pool)
                .await?;
        assert_eq!(n, i as i64);
    }
    assert!(Plain::enqueue_many(pool, Vec::new()).await?.is_empty());
    // Every row of a batch of bare args has the kind's defaults and is due now …
    let defaults: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE kind = 'plain' AND queue = 'mail'
           AND priority = 3 AND max_attempts = 7 AND state = 'pending' AND run_after <= now()",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(defaults, 1000);
    // … and in a batch that mixes options, each row has its own.
    let mixed = Plain::enqueue_many_with(
        pool,
        [
            Plain::with(N { n: 1 }).priority(-1),
            Plain::with(N { n: 2 }).queue("other").max_attempts(2),
            Plain::with(N { n: 3 }).run_in(Duration::from_secs(3600)),
        ],
    )
    .await?;
    let mut rows = Vec::new();
    for e in &mixed {
        let row: (i16, String, i32, String) = sqlx::query_as(
            "SELECT priority, queue, max_attempts, state FROM jobq.jobs WHERE id = $1",
        )
        .bind(e.id.0)
        .fetch_one(pool)
        .await?;
        rows.push(row);
    }
    assert_eq!(
        rows,
        vec![
            (-1, "mail".to_owned(), 7, "pending".to_owned()),
            (3, "other".to_owned(), 2, "pending".to_owned()),
            (3, "mail".to_owned(), 7, "scheduled".to_owned()),
        ]
    );

    // Rolled back with its transaction, like a single enqueue.
    let mut tx = pool.begin().await?;
    Plain::enqueue_many(&mut tx, (0..10).map(|n| N { n })).await?;
    tx.rollback().await?;
    assert_eq!(count(pool).await, 1007);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn bad_input_is_rejected_with_a_stable_code() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();

    let huge = "x".repeat(jobq::MAX_PAYLOAD_BYTES + 1);
    let e = Blob::enqueue(pool, huge).await.unwrap_err();
    assert_eq!(e.code(), "payload_too_large", "{e}");

    let e = Plain::with(N { n: 1 })
        .queue("")
        .enqueue(pool)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_queue", "{e}");
    let e = Plain::with(N { n: 1 })
        .queue("q".repeat(jobq::MAX_QUEUE_LEN + 1))
        .enqueue(pool)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_queue", "{e}");

    let e = Plain::with(N { n: 1 })
        .max_attempts(0)
        .enqueue(pool)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_max_attempts", "{e}");

    // Before PostgreSQL's first representable time: a clear error, not a driver error.
    let e = Plain::with(N { n: 1 })
        .run_after(chrono::DateTime::<chrono::Utc>::MIN_UTC)
        .enqueue(pool)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "run_after_out_of_range", "{e}");

    let e = Plain::with(N { n: 1 })
        .idempotency_key("")
        .enqueue(pool)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_idempotency_key", "{e}");

    // A batch with one bad job inserts nothing.
    let e = Blob::enqueue_many(
        pool,
        ["ok".to_owned(), "y".repeat(jobq::MAX_PAYLOAD_BYTES + 1)],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), "payload_too_large");
    assert_eq!(count(pool).await, 0);

    // A run_after far in the past is fine: the job is simply due.
    let old = chrono::DateTime::parse_from_rfc3339("1970-01-01T00:00:00Z")?.to_utc();
    Plain::with(N { n: 1 }).run_after(old).enqueue(pool).await?;
    // One far in the future is stored as given and is not due.
    Plain::with(N { n: 2 })
        .run_after(chrono::DateTime::<chrono::Utc>::MAX_UTC)
        .enqueue(pool)
        .await?;
    let due: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE run_after <= now()")
        .fetch_one(pool)
        .await?;
    assert_eq!((count(pool).await, due), (2, 1));
    db.close().await;
    Ok(())
}

/// Enqueues on a pool keep their connection for the next one for a moment; the
/// application's pool must still get it back at once when it needs it, and for good
/// when nobody enqueues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_on_a_pool_of_one_leave_the_connection_to_the_application() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.new_pool(1).await?;
    for round in 0..20 {
        for n in 0..5 {
            Plain::enqueue(&pool, N { n }).await?;
        }
        Keyed::enqueue_many(&pool, (0..3).map(|n| N { n: round * 10 + n })).await?;
        // The application's own statement on the only connection, right after.
        let mut conn = tokio::time::timeout(Duration::from_secs(1), pool.acquire())
            .await
            .map_err(|_| {
                anyhow::anyhow!("round {round}: the pool's only connection was not given back")
            })??;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
    }
    assert_eq!(count(&pool).await, 160);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        pool.size() as usize - pool.num_idle(),
        0,
        "a connection stayed checked out after the enqueues stopped"
    );
    tokio::time::timeout(Duration::from_secs(5), pool.close()).await?;
    db.close().await;
    Ok(())
}
