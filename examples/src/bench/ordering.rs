//! The per-key ordering rows: the same jobs drained unordered, spread over many ordering
//! keys, and with one hot key holding half of them (measured on the other keys' jobs,
//! which must not wait for the hot key's line).

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::report::{Report, Target};
use crate::util::{BenchDb, KIND, Samples};
use crate::worker::Worker;
use crate::{Settings, drain_filled, progress};

/// Inserts `n` due bench jobs over `keys` ordering keys, interleaved (job `i` has key
/// `i mod keys`) and chained as enqueue chains them: each waits behind the job of its key
/// before it. With `hot`, every odd job has the key `hot` instead and the even ones share
/// the other `keys - 1` keys. Ids start at 1 (the reset restarts the sequence). Returns
/// the ids of the last job of each key but `hot`.
async fn fill_ordered(db: &BenchDb, n: usize, keys: usize, hot: bool) -> anyhow::Result<Vec<i64>> {
    let (n, keys) = (i64::try_from(n)?, i64::try_from(keys)?);
    sqlx::query(
        "INSERT INTO jobq.jobs (id, kind, queue, payload, ordering_scope, ordering_key, blocked_by)
         SELECT i, $1, 'default', '0'::jsonb, $1, k.key, nullif(greatest(i - k.step, 0), 0)
         FROM generate_series(1, $2::int8) i,
              LATERAL (SELECT CASE WHEN NOT $4 THEN 'k' || (i % $3)
                                   WHEN i % 2 = 1 THEN 'hot'
                                   ELSE 'k' || ((i / 2) % ($3 - 1)) END AS key,
                              CASE WHEN NOT $4 THEN $3 WHEN i % 2 = 1 THEN 2
                                   ELSE 2 * ($3 - 1) END AS step) k;
         ",
    )
    .bind(KIND)
    .bind(n)
    .bind(keys)
    .bind(hot)
    .execute(&db.pool)
    .await?;
    sqlx::query("SELECT setval('jobq.jobs_id_seq', $1)")
        .bind(n)
        .execute(&db.pool)
        .await?;
    sqlx::query("ANALYZE jobq.jobs").execute(&db.pool).await?;
    Ok(sqlx::query_scalar(
        "SELECT max(id) FROM jobq.jobs WHERE ordering_key <> 'hot' GROUP BY ordering_key",
    )
    .fetch_all(&db.pool)
    .await?)
}

/// Drains with one worker process until the jobs `lasts` (each key's last job, so its
/// whole key) are done; returns the rate of the jobs of those keys.
async fn drain_keys(
    s: &Settings,
    db: &BenchDb,
    concurrency: usize,
    lasts: &[i64],
) -> anyhow::Result<f64> {
    let jobs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE ordering_key <> 'hot'")
            .fetch_one(&db.pool)
            .await?;
    let mut w = Worker::spawn(&db.url, concurrency).await?;
    db.settle_stats().await?;
    let start = Instant::now();
    w.go().await?;
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let done: bool =
            sqlx::query_scalar("SELECT bool_and(state = 'done') FROM jobq.jobs WHERE id = ANY($1)")
                .bind(lasts)
                .fetch_one(&db.pool)
                .await?;
        if done {
            break;
        }
        if start.elapsed() > s.drain_cap * 3 {
            bail!("the other keys did not finish within {:?}", s.drain_cap * 3);
        }
    }
    let elapsed = start.elapsed();
    w.stop().await?;
    Ok(jobs as f64 / elapsed.as_secs_f64())
}

/// The ordering rows, at the drain's best concurrency.
pub(crate) async fn ordering(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    concurrency: usize,
) -> anyhow::Result<()> {
    let keys = if s.quick { 100 } else { 1000 };
    let per_key = s.jobs / keys;
    let (mut plain, mut ordered, mut hot) = Default::default();
    let mut capped = false;
    for rep in 0..s.reps {
        progress(&format!("ordering, repetition {}: unordered", rep + 1));
        db.reset().await?;
        db.fill(s.jobs).await?;
        Samples::push(&mut plain, drain_filled(s, db, 1, concurrency).await?.rate);
        progress(&format!(
            "ordering, repetition {}: {keys} keys × {per_key}",
            rep + 1
        ));
        db.reset().await?;
        fill_ordered(db, s.jobs, keys, false).await?;
        let run = drain_filled(s, db, 1, concurrency).await?;
        capped |= run.capped;
        Samples::push(&mut ordered, run.rate);
        progress(&format!("ordering, repetition {}: one hot key", rep + 1));
        db.reset().await?;
        let lasts = fill_ordered(db, s.jobs, keys, true).await?;
        Samples::push(&mut hot, drain_keys(s, db, concurrency, &lasts).await?);
    }
    r.ceiling(
        "unordered_paired",
        &format!(
            "reference, paired: the same {} jobs unordered (c={concurrency})",
            s.jobs
        ),
        plain,
    );
    r.jobq(
        &format!(
            "ordering: {keys} keys × {per_key} jobs (c={concurrency}){}",
            if capped {
                format!(" (stopped after {:?})", s.drain_cap)
            } else {
                String::new()
            }
        ),
        ordered,
        Some("unordered_paired"),
        vec![Target::ratio_at_least(0.5)],
    );
    r.jobq(
        &format!(
            "ordering: one hot key with half the jobs; rate of the other {} keys' jobs",
            keys - 1
        ),
        hot,
        Some("unordered_paired"),
        vec![Target::ratio_at_least(0.5)],
    );
    Ok(())
}
