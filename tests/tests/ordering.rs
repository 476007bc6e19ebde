//! Per-key ordering with real processes: four `ordered_worker` processes, twenty SIGKILLs
//! while they work, and every key's jobs still run one at a time in enqueue order. A
//! poisoned key parks behind its failed job (visible in stats and `show`) while the
//! others proceed; it releases on replay (the failed job first) or on unpark.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::admin::Admin;
use jobq::{JobContext, JobError, JobId};
use jobq_testing::TestDatabase;
use serde::{Deserialize, Serialize};

/// The args of `ordered_worker`'s job.
#[derive(Debug, Serialize, Deserialize)]
struct StepArgs {
    key: String,
    seq: i64,
}

/// The same kind as `ordered_worker` serves, for enqueueing here; this process runs none.
#[jobq::job(kind = "ordered_step", queue = "ordered", ordering = key)]
async fn ordered_step(_ctx: JobContext, _args: StepArgs) -> Result<(), JobError> {
    Ok(())
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_worker(db: &TestDatabase) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_ordered_worker"))
        .env("DATABASE_URL", db.url())
        .env("ORDERED_CONCURRENCY", "4")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

const KEYS: usize = 24;
const STEPS: i64 = 40;
const KILLS: usize = 20;

/// Every attempt's start and every successful attempt's end, per job.
struct Record {
    starts: BTreeMap<i64, Vec<DateTime<Utc>>>,
    ends: BTreeMap<i64, Vec<DateTime<Utc>>>,
}

async fn record(pool: &sqlx::PgPool) -> Record {
    let mut r = Record {
        starts: BTreeMap::new(),
        ends: BTreeMap::new(),
    };
    let starts: Vec<(i64, DateTime<Utc>)> = sqlx::query_as("SELECT job_id, at FROM starts")
        .fetch_all(pool)
        .await
        .unwrap();
    for (id, at) in starts {
        r.starts.entry(id).or_default().push(at);
    }
    let ends: Vec<(i64, DateTime<Utc>)> = sqlx::query_as("SELECT job_id, at FROM ends")
        .fetch_all(pool)
        .await
        .unwrap();
    for (id, at) in ends {
        r.ends.entry(id).or_default().push(at);
    }
    r
}

/// Asserts that the jobs `ids` (one key, ascending = enqueue order) each ran, and that
/// every attempt of a job started after every attempt of the job before it had started
/// and the earlier job's successful attempt had ended: one at a time, in id order.
/// (A killed attempt is followed by a retry of the same job, never by the next job.)
fn assert_in_order(key: &str, ids: &[i64], r: &Record) {
    for pair in ids.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_starts = &r.starts[&a];
        let b_starts = r
            .starts
            .get(&b)
            .unwrap_or_else(|| panic!("key {key}: job {b} never started"));
        let a_last_start = a_starts.iter().max().unwrap();
        let a_last_end = r.ends[&a].iter().max().unwrap();
        let b_first_start = b_starts.iter().min().unwrap();
        assert!(
            a_last_start < b_first_start && a_last_end <= b_first_start,
            "key {key}: job {b} started at {b_first_start} before job {a} (last start {a_last_start}, end {a_last_end}) was done"
        );
    }
}

async fn ids_of(pool: &sqlx::PgPool, key: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT id FROM jobq.jobs WHERE kind = 'ordered_step' AND ordering_key = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_and_twenty_kills_keep_every_key_in_order_and_poison_parks()
-> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    sqlx::raw_sql(
        "CREATE TABLE starts (key text, seq bigint, job_id bigint, attempt int, pid int, at timestamptz);
         CREATE TABLE ends (job_id bigint, attempt int, at timestamptz);
         CREATE TABLE poisoned (key text PRIMARY KEY);
         INSERT INTO poisoned VALUES ('poison-replay'), ('poison-skip');",
    )
    .execute(pool)
    .await?;
    // The poisoned keys first, then every key's steps interleaved, so a key's ids are
    // spread over the table; half the steps by batch, half one at a time.
    for key in ["poison-replay", "poison-skip"] {
        for seq in 0..4 {
            OrderedStep::enqueue(
                pool,
                StepArgs {
                    key: key.into(),
                    seq,
                },
            )
            .await?;
        }
    }
    for seq in 0..STEPS {
        let args = (0..KEYS).map(|k| StepArgs {
            key: format!("k{k}"),
            seq,
        });
        if seq % 2 == 0 {
            OrderedStep::enqueue_many(pool, args).await?;
        } else {
            for a in args {
                OrderedStep::enqueue(pool, a).await?;
            }
        }
    }

    let mut workers = Workers(Vec::new());
    for _ in 0..4 {
        workers.0.push(spawn_worker(&db)?);
    }
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let i = rand::random_range(0..workers.0.len());
        workers.0[i].kill()?; // SIGKILL
        workers.0[i].wait()?;
        workers.0[i] = spawn_worker(&db)?;
    }
    let finished = tests::eventually(Duration::from_secs(240), || async {
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE state <> 'done' AND ordering_key LIKE 'k%'",
        )
        .await
            == 0
    })
    .await;
    assert!(finished, "the unpoisoned keys did not finish in 240 s");
    let retried = count(
        pool,
        "SELECT count(*) FROM jobq.jobs WHERE attempts > 1 AND ordering_key LIKE 'k%'",
    )
    .await;
    assert!(retried > 0, "no kill hit a running attempt");

    let r = record(pool).await;
    for k in 0..KEYS {
        let key = format!("k{k}");
        let ids = ids_of(pool, &key).await;
        assert_eq!(ids.len(), STEPS as usize);
        let seqs: Vec<i64> = sqlx::query_scalar(
            "SELECT (payload->>'seq')::int8 FROM jobq.jobs WHERE ordering_key = $1 ORDER BY id",
        )
        .bind(&key)
        .fetch_all(pool)
        .await?;
        assert_eq!(
            seqs,
            (0..STEPS).collect::<Vec<_>>(),
            "key {key}: enqueue order"
        );
        assert_in_order(&key, &ids, &r);
    }

    // The poisoned keys are parked behind their failed first job; nothing after it ran.
    let admin = Admin::new(pool.clone()).actor("operator");
    let replay_ids = ids_of(pool, "poison-replay").await;
    let skip_ids = ids_of(pool, "poison-skip").await;
    let failed_first = tests::eventually(Duration::from_secs(60), || async {
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE state = 'failed' AND ordering_key LIKE 'poison%'",
        )
        .await
            == 2
    })
    .await;
    assert!(failed_first);
    for ids in [&replay_ids, &skip_ids] {
        assert_eq!(admin.job(JobId(ids[0])).await?.job.state, "failed");
        for &id in &ids[1..] {
            let d = admin.job(JobId(id)).await?;
            assert_eq!(d.job.parked_behind, Some(jobq::JobId(ids[0])));
            assert!(!r.starts.contains_key(&id), "parked job {id} ran");
        }
    }
    let stats = jobq::stats::stats(pool).await?;
    let kind = stats
        .kinds
        .iter()
        .find(|k| k.kind == "ordered_step")
        .unwrap();
    assert_eq!(kind.parked, 6);
    assert_eq!(
        stats
            .queues
            .iter()
            .find(|q| q.queue == "ordered")
            .unwrap()
            .parked,
        6
    );
    assert_eq!(stats.parked_keys.len(), 2);

    // Replay: the failed job runs again first, then the rest, in order.
    sqlx::query("DELETE FROM poisoned").execute(pool).await?;
    admin
        .replay(JobId(replay_ids[0]), Some("fixed the poison"))
        .await?;
    // Unpark: the failed job stays failed, the rest proceed.
    let u = admin
        .unpark("poison-skip", None, Some("give up on the first"))
        .await?;
    assert_eq!(u.skipped, vec![skip_ids[0]]);
    let drained = tests::eventually(Duration::from_secs(60), || async {
        count(
            pool,
            "SELECT count(*) FROM jobq.jobs WHERE state <> 'done' AND ordering_key LIKE 'poison%'",
        )
        .await
            == 1
    })
    .await;
    assert!(drained, "the released keys did not finish");
    drop(workers);
    let r = record(pool).await;
    assert_in_order("poison-replay", &replay_ids, &r);
    assert_in_order("poison-skip", &skip_ids[1..], &r);
    assert_eq!(admin.job(JobId(skip_ids[0])).await?.job.state, "failed");
    let audited = count(
        pool,
        "SELECT count(*) FROM jobq.job_audit WHERE action = 'unpark' AND actor = 'operator'",
    )
    .await;
    assert_eq!(audited, 1);
    assert!(jobq::stats::stats(pool).await?.parked_keys.is_empty());
    Ok(())
}

/// Steps the `recorded_*` jobs ran, in order: the handlers' state, given to the drain.
#[derive(Clone, Default)]
struct Ran(std::sync::Arc<std::sync::Mutex<Vec<(String, i64)>>>);

impl Ran {
    fn push(ctx: &jobq::JobContext, step: (String, i64)) -> Result<(), JobError> {
        let ran = ctx
            .state::<Ran>()
            .ok_or_else(|| JobError::permanent("no_state", "the drain gives no Ran"))?;
        ran.0.lock().unwrap().push(step);
        Ok(())
    }
}

#[jobq::job(kind = "recorded_step", ordering = key, ordering_scope = "recorded", retry = "none")]
async fn recorded_step(ctx: jobq::JobContext, args: StepArgs) -> Result<(), JobError> {
    if args.seq < 0 {
        return Err(JobError::permanent("poison", "negative step"));
    }
    Ran::push(&ctx, (args.key, args.seq))
}

/// The same scope from a second kind: one line with `recorded_step`'s jobs.
#[jobq::job(kind = "recorded_other", ordering = key, ordering_scope = "recorded")]
async fn recorded_other(ctx: jobq::JobContext, args: StepArgs) -> Result<(), JobError> {
    Ran::push(&ctx, (format!("other:{}", args.key), args.seq))
}

#[tokio::test]
async fn the_builder_sets_the_key_a_scope_spans_kinds_and_a_test_drain_keeps_the_order()
-> anyhow::Result<()> {
    use jobq::Job;
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let step = |key: &str, seq| StepArgs {
        key: key.into(),
        seq,
    };
    let mut tx = pool.begin().await?;
    // The builder's key overrides the field's.
    let a = RecordedStep::with(step("ignored", 1))
        .ordering_key("a")
        .enqueue(&mut *tx)
        .await?;
    RecordedOther::enqueue(&mut *tx, step("a", 2)).await?;
    RecordedStep::enqueue_many_with(
        &mut *tx,
        [
            RecordedStep::with(step("a", 3)),
            RecordedStep::with(step("b", 1)),
        ],
    )
    .await?;
    tx.commit().await?;
    let (scope, key): (String, String) =
        sqlx::query_as("SELECT ordering_scope, ordering_key FROM jobq.jobs WHERE id = $1")
            .bind(a.id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!((scope.as_str(), key.as_str()), ("recorded", "a"));

    let ran = Ran::default();
    let report = db.drain().state(ran.clone()).run().await?;
    assert_eq!(report.done(), 4);
    let ran = ran.0.lock().unwrap().clone();
    let of_a: Vec<&(String, i64)> = ran.iter().filter(|r| r.0 != "b").collect();
    assert_eq!(
        of_a,
        vec![
            &("ignored".to_owned(), 1),
            &("other:a".to_owned(), 2),
            &("a".to_owned(), 3)
        ],
        "{ran:?}"
    );

    // A poisoned step parks its key in a drain too: the drain ends, the rest waits.
    RecordedStep::enqueue(pool, step("c", -1)).await?;
    let parked = RecordedStep::enqueue(pool, step("c", 2)).await?;
    let report = db.drain().run().await?;
    assert_eq!((report.done(), report.failed()), (0, 1));
    assert_eq!(tests::job_state(pool, parked.id).await.0, "pending");
    db.close().await;
    Ok(())
}
