//! Uniqueness windows, debounce / replace, maximum age and deadlines, payload versions and
//! bulk enqueue with options — against a real PostgreSQL, the database deciding.

use std::time::Duration;

use chrono::Utc;
use jobq::{Job, JobContext, JobError, Replace, Unique, UniqueState};
use jobq_testing::{Drain, TestDatabase};
use serde::{Deserialize, Serialize};
use tests::N;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReportArgs {
    customer_id: i64,
    kind_of_report: String,
    note: String,
}

#[jobq::job(kind = "report", unique(by = [customer_id, kind_of_report], states = [pending, running]))]
async fn report(_args: ReportArgs) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "hourly_digest", unique(by = [customer_id], period = "1h"))]
async fn hourly_digest(_args: ReportArgs) -> Result<(), JobError> {
    Ok(())
}

fn args(customer_id: i64, note: &str) -> ReportArgs {
    ReportArgs {
        customer_id,
        kind_of_report: "monthly".into(),
        note: note.into(),
    }
}

async fn rows(pool: &sqlx::PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE kind = $1")
        .bind(kind)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_second_enqueue_of_a_unique_job_returns_the_first() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let first = Report::enqueue(pool, args(7, "a")).await?;
    let second = Report::enqueue(pool, args(7, "b")).await?;
    let other = Report::enqueue(pool, args(8, "a")).await?;
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert!(
        !second.replaced,
        "no Replace asked: the pending job keeps its args"
    );
    assert_eq!(second.id, first.id);
    assert!(!other.duplicate, "another customer is another key");
    let note: String = sqlx::query_scalar("SELECT payload->>'note' FROM jobq.jobs WHERE id = $1")
        .bind(first.id.0)
        .fetch_one(pool)
        .await?;
    assert_eq!(note, "a");
    assert_eq!(rows(pool, "report").await, 2);
    Ok(())
}

#[tokio::test]
async fn concurrent_unique_enqueues_from_eight_connections_insert_one_row() -> anyhow::Result<()> {
    let db = TestDatabase::with_max_connections(12).await?;
    let pool = db.pool().clone();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let pool = pool.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            barrier.wait().await;
            let e = Report::enqueue(&mut tx, args(42, &format!("n{i}"))).await?;
            tx.commit().await?;
            anyhow::Ok(e)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await??);
    }
    let inserted: Vec<_> = results.iter().filter(|e| !e.duplicate).collect();
    assert_eq!(inserted.len(), 1, "{results:?}");
    assert!(
        results.iter().all(|e| e.id == inserted[0].id),
        "{results:?}"
    );
    assert_eq!(rows(&pool, "report").await, 1);
    Ok(())
}

#[tokio::test]
async fn a_rolled_back_holder_frees_the_key() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let mut holder = pool.begin().await?;
    let held = Report::enqueue(&mut holder, args(1, "held")).await?;
    assert!(!held.duplicate);
    // A concurrent enqueue of the same key waits for the holder's transaction…
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { Report::enqueue(&pool, args(1, "second")).await })
    };
    let waiting = tests::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(0)
            > 0
    })
    .await;
    assert!(waiting, "the second enqueue should wait on the holder");
    // …and inserts once it rolls back.
    holder.rollback().await?;
    let second = waiter.await??;
    assert!(
        !second.duplicate,
        "the rolled-back holder left no row to duplicate"
    );
    assert_ne!(second.id, held.id);
    assert_eq!(rows(&pool, "report").await, 1);
    Ok(())
}

#[tokio::test]
async fn a_finished_job_does_not_block_the_next() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let first = Report::enqueue(pool, args(3, "a")).await?;
    let drained = Drain::new(pool).register::<Report>().run().await?;
    assert_eq!(drained.done(), 1);
    let next = Report::enqueue(pool, args(3, "b")).await?;
    assert!(!next.duplicate, "done is not among the listed states");
    assert_ne!(next.id, first.id);
    // Listing `done` makes a finished job hold its key.
    let rule = Unique::new().states(&[UniqueState::Pending, UniqueState::Done]);
    let held = Report::with(args(4, "x"))
        .unique(rule.clone())
        .enqueue(pool)
        .await?;
    Drain::new(pool).register::<Report>().run().await?;
    let again = Report::with(args(4, "y"))
        .unique(rule)
        .enqueue(pool)
        .await?;
    assert!(again.duplicate);
    assert_eq!(again.id, held.id);
    Ok(())
}

#[tokio::test]
async fn a_period_bucket_bounds_uniqueness() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let a = HourlyDigest::enqueue(pool, args(5, "a")).await?;
    let b = HourlyDigest::enqueue(pool, args(5, "b")).await?;
    assert!(b.duplicate);
    assert_eq!(a.id, b.id);
    // The same key in another bucket: move the first job's key into a past bucket, as an
    // hour passing would, by rewriting its stored key to the previous bucket's.
    sqlx::query(
        "UPDATE jobq.jobs SET unique_key = md5('[5]' || '|' ||
             (floor(extract(epoch FROM now())::float8 / 3600)::bigint - 1)::text)
         WHERE id = $1",
    )
    .bind(a.id.0)
    .execute(pool)
    .await?;
    let c = HourlyDigest::enqueue(pool, args(5, "c")).await?;
    assert!(!c.duplicate, "a new bucket is a new key");
    Ok(())
}

#[jobq::job(kind = "reindex", unique(by = [customer_id]), debounce = "1s")]
async fn reindex(ctx: JobContext, args: ReportArgs) -> Result<(), JobError> {
    let seen = ctx
        .state::<tokio::sync::mpsc::UnboundedSender<String>>()
        .ok_or_else(|| JobError::permanent("no_state", "no channel"))?;
    let _ = seen.send(args.note);
    Ok(())
}

#[tokio::test]
async fn debounce_runs_a_burst_once_with_the_last_args() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut ids = Vec::new();
    for i in 0..20 {
        let e = Reindex::enqueue(pool, args(9, &format!("edit {i}"))).await?;
        ids.push(e);
    }
    assert!(!ids[0].duplicate);
    assert!(
        ids[1..]
            .iter()
            .all(|e| e.duplicate && e.replaced && e.id == ids[0].id)
    );
    let (run_after_gap,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM run_after - now())::float8 FROM jobq.jobs WHERE id = $1",
    )
    .bind(ids[0].id.0)
    .fetch_one(pool)
    .await?;
    assert!(
        run_after_gap > 0.0,
        "pushed into the future by the debounce"
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let drained = Drain::new(pool)
        .register::<Reindex>()
        .state(tx)
        .advance_clock(true)
        .run()
        .await?;
    assert_eq!(drained.done(), 1);
    assert_eq!(rx.recv().await.as_deref(), Some("edit 19"));
    assert!(rx.try_recv().is_err(), "one run only");
    Ok(())
}

#[tokio::test]
async fn replace_changes_a_pending_job_and_leaves_a_running_one() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let first = Report::enqueue(pool, args(11, "old")).await?;
    let later = Utc::now() + chrono::Duration::hours(2);
    let replaced = Report::with(args(11, "new"))
        .run_after(later)
        .on_conflict(Replace::args().and(Replace::run_after()))
        .enqueue(pool)
        .await?;
    assert!(replaced.duplicate && replaced.replaced);
    assert_eq!(replaced.id, first.id);
    let (note, run_after): (String, chrono::DateTime<Utc>) =
        sqlx::query_as("SELECT payload->>'note', run_after FROM jobq.jobs WHERE id = $1")
            .bind(first.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(note, "new");
    assert!((run_after - later).num_milliseconds().abs() < 5);
    // Only run_after this time: the args stay.
    let now = Utc::now();
    let r = Report::with(args(11, "ignored"))
        .run_after(now)
        .on_conflict(Replace::run_after())
        .enqueue(pool)
        .await?;
    assert!(r.replaced);
    let note: String = sqlx::query_scalar("SELECT payload->>'note' FROM jobq.jobs WHERE id = $1")
        .bind(first.id.0)
        .fetch_one(pool)
        .await?;
    assert_eq!(note, "new");
    // Running: nothing is replaced, and the result says so.
    sqlx::query(
        "UPDATE jobq.jobs SET state = 'running', attempts = 1, locked_until = now() + interval '1 minute'
         WHERE id = $1",
    )
    .bind(first.id.0)
    .execute(pool)
    .await?;
    let r = Report::with(args(11, "too late"))
        .on_conflict(Replace::both())
        .enqueue(pool)
        .await?;
    assert!(r.duplicate);
    assert!(!r.replaced, "a running job is not replaced");
    assert_eq!(r.id, first.id);
    let note: String = sqlx::query_scalar("SELECT payload->>'note' FROM jobq.jobs WHERE id = $1")
        .bind(first.id.0)
        .fetch_one(pool)
        .await?;
    assert_eq!(note, "new");
    Ok(())
}

#[jobq::job(kind = "flaky_old", max_age = "1h", retry = "fixed(5m, max = 50)")]
async fn flaky_old(_args: N) -> Result<(), JobError> {
    Err(JobError::retryable("upstream_down", "503"))
}

#[tokio::test]
async fn a_job_past_its_max_age_is_not_retried() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let e = FlakyOld::enqueue(pool, N { n: 1 }).await?;
    let drained = Drain::new(pool)
        .register::<FlakyOld>()
        .advance_clock(true)
        .run()
        .await?;
    // Retries every 5 minutes for an hour, then expired: far fewer than 50 attempts.
    let (state, attempts, code): (String, i32, String) =
        sqlx::query_as("SELECT state, attempts, last_error_code FROM jobq.jobs WHERE id = $1")
            .bind(e.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(state, "failed", "attempts {attempts}");
    assert_eq!(code, "expired", "attempts {attempts}");
    assert!(
        (11..=13).contains(&attempts),
        "attempts {attempts}, {} ran",
        drained.attempts.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_pending_job_past_its_age_or_deadline_is_failed_without_running() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let aged = Report::with(args(20, "a"))
        .max_age(Duration::from_secs(60))
        .enqueue(pool)
        .await?;
    let deadline = Utc::now() + chrono::Duration::minutes(5);
    let dated = Report::with(args(21, "b"))
        .deadline(deadline)
        .enqueue(pool)
        .await?;
    let fresh = Report::with(args(22, "c"))
        .max_age(Duration::from_secs(3600))
        .enqueue(pool)
        .await?;
    let rt = jobq::Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Report>()
        .build()?;
    let at = Utc::now() + chrono::Duration::minutes(10);
    // Past the age, a claim does not take it…
    let drained = Drain::new(pool).register::<Report>().at(at).run().await?;
    assert_eq!(drained.jobs(), vec![fresh.id], "only the fresh job runs");
    // …and maintenance fails it with `expired`.
    let report = rt.scheduler().run_once_at(Some(at)).await?;
    assert_eq!(report.expired, 2);
    for id in [aged.id, dated.id] {
        let (state, attempts, code): (String, i32, String) =
            sqlx::query_as("SELECT state, attempts, last_error_code FROM jobq.jobs WHERE id = $1")
                .bind(id.0)
                .fetch_one(pool)
                .await?;
        assert_eq!(
            (state.as_str(), attempts, code.as_str()),
            ("failed", 0, "expired")
        );
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct InvoiceArgsV1 {
    amount: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct InvoiceArgsV2 {
    amount_cents: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct InvoiceArgs {
    amount_cents: i64,
    currency: String,
}

#[jobq::upgrade(from = 1)]
fn v1_to_v2(old: InvoiceArgsV1) -> InvoiceArgsV2 {
    InvoiceArgsV2 {
        amount_cents: old.amount * 100,
    }
}

#[jobq::upgrade(from = 2)]
fn v2_to_v3(old: InvoiceArgsV2) -> InvoiceArgs {
    InvoiceArgs {
        amount_cents: old.amount_cents,
        currency: "EUR".into(),
    }
}

#[jobq::job(kind = "invoice_v", version = 3)]
async fn invoice_v(ctx: JobContext, args: InvoiceArgs) -> Result<(), JobError> {
    let seen = ctx
        .state::<tokio::sync::mpsc::UnboundedSender<(i64, String)>>()
        .ok_or_else(|| JobError::permanent("no_state", "no channel"))?;
    let _ = seen.send((args.amount_cents, args.currency));
    Ok(())
}

#[tokio::test]
async fn old_payloads_drain_through_the_upgrade_chain() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let new = InvoiceV::enqueue(
        pool,
        InvoiceArgs {
            amount_cents: 5,
            currency: "USD".into(),
        },
    )
    .await?;
    let version: i32 = sqlx::query_scalar("SELECT payload_version FROM jobq.jobs WHERE id = $1")
        .bind(new.id.0)
        .fetch_one(pool)
        .await?;
    assert_eq!(version, 3);
    // Rows written by the previous deploys.
    let insert = "INSERT INTO jobq.jobs (kind, payload, payload_version) VALUES ('invoice_v', $1, $2) RETURNING id";
    let v1: i64 = sqlx::query_scalar(insert)
        .bind(serde_json::json!({"amount": 7}))
        .bind(1)
        .fetch_one(pool)
        .await?;
    let v2: i64 = sqlx::query_scalar(insert)
        .bind(serde_json::json!({"amount_cents": 900}))
        .bind(2)
        .fetch_one(pool)
        .await?;
    let v9: i64 = sqlx::query_scalar(insert)
        .bind(serde_json::json!({"amount_cents": 1}))
        .bind(9)
        .fetch_one(pool)
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, String)>();
    let drained = Drain::new(pool)
        .register::<InvoiceV>()
        .state(tx)
        .run()
        .await?;
    assert_eq!(drained.done(), 3);
    let mut seen = Vec::new();
    while let Ok(s) = rx.try_recv() {
        seen.push(s);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (5, "USD".to_owned()),
            (700, "EUR".to_owned()),
            (900, "EUR".to_owned())
        ]
    );
    let _ = (v1, v2);
    // No upgrade path: failed permanently with `unknown_version`, the row kept.
    let (state, code, payload): (String, String, serde_json::Value) =
        sqlx::query_as("SELECT state, last_error_code, payload FROM jobq.jobs WHERE id = $1")
            .bind(v9)
            .fetch_one(pool)
            .await?;
    assert_eq!(
        (state.as_str(), code.as_str()),
        ("failed", "unknown_version")
    );
    assert_eq!(payload, serde_json::json!({"amount_cents": 1}));
    Ok(())
}

#[tokio::test]
async fn jobq_testing_performs_a_job_from_an_old_payload() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, String)>();
    drop(tx);
    // Without the channel the handler fails permanently; with a v1 payload it got that far.
    jobq_testing::perform_payload::<InvoiceV>(1, serde_json::json!({"amount": 2}))
        .await
        .assert_permanent("no_state");
    jobq_testing::perform_payload::<InvoiceV>(1, serde_json::json!({"nope": 2}))
        .await
        .assert_permanent("decode");
    jobq_testing::perform_payload::<InvoiceV>(4, serde_json::json!({"amount": 2}))
        .await
        .assert_permanent("unknown_version");
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn bulk_enqueue_carries_options_and_reports_duplicates_per_item() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let existing = Report::enqueue(pool, args(100, "existing")).await?;
    let later = Duration::from_secs(3600);
    let items = vec![
        Report::with(args(101, "a")).run_in(later).priority(-3),
        Report::with(args(100, "dup of existing")),
        Report::with(args(102, "b")).idempotency_key("k-102"),
        Report::with(args(101, "dup within the batch")),
        Report::with(args(103, "c")).max_age(Duration::from_secs(60)),
    ];
    let out = Report::enqueue_many_with(pool, items).await?;
    assert_eq!(out.len(), 5);
    let dup: Vec<bool> = out.iter().map(|e| e.duplicate).collect();
    assert_eq!(dup, vec![false, true, false, true, false]);
    assert_eq!(out[1].id, existing.id);
    assert_eq!(out[3].id, out[0].id);
    let (priority, delayed): (i16, bool) = sqlx::query_as(
        "SELECT priority, run_after > now() + interval '50 minutes' FROM jobq.jobs WHERE id = $1",
    )
    .bind(out[0].id.0)
    .fetch_one(pool)
    .await?;
    assert_eq!((priority, delayed), (-3, true));
    let key: Option<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM jobq.jobs WHERE id = $1")
            .bind(out[2].id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(key.as_deref(), Some("k-102"));
    let expires: bool =
        sqlx::query_scalar("SELECT expires_at IS NOT NULL FROM jobq.jobs WHERE id = $1")
            .bind(out[4].id.0)
            .fetch_one(pool)
            .await?;
    assert!(expires);
    // Plain bulk enqueue still works, and a bulk with replacement goes item by item.
    let plain = Report::enqueue_many(pool, vec![args(200, "x"), args(200, "y")]).await?;
    assert!(!plain[0].duplicate && plain[1].duplicate);
    let replacing = Report::enqueue_many_with(
        pool,
        vec![Report::with(args(200, "z")).on_conflict(Replace::args())],
    )
    .await?;
    assert!(replacing[0].replaced && replacing[0].id == plain[0].id);
    Ok(())
}
