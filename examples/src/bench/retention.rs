//! Retention: reclaiming 7 days' worth of `done` history by the pruner's bounded batch
//! deletes on `jobq.jobs`, against truncating a time partition holding the same rows in a
//! partitioned copy of the table built in the bench's own database.

use std::time::Instant;

use jobq::maintenance::{Pruner, PrunerConfig};
use sqlx::Connection;

use crate::Settings;
use crate::report::Report;
use crate::util::{BenchDb, KIND, Samples};

/// The partitioned copy: `jobq.jobs`' columns, partitioned by `finished_at`, with the
/// indexes `jobq.jobs` keeps on finished rows (its primary key must include the partition
/// key, the reason `jobq.jobs` itself is not partitioned). `old` holds what is more than
/// 7 days old.
const PARTITIONED: &str = "
    DROP SCHEMA IF EXISTS bench_part CASCADE;
    CREATE SCHEMA bench_part;
    CREATE TABLE bench_part.jobs (LIKE jobq.jobs INCLUDING DEFAULTS)
        PARTITION BY RANGE (finished_at);
    ALTER TABLE bench_part.jobs ADD PRIMARY KEY (id, finished_at);
    CREATE INDEX ON bench_part.jobs (state, id);
    CREATE INDEX ON bench_part.jobs (state, finished_at)
        WHERE state IN ('done', 'failed', 'cancelled');
    CREATE INDEX ON bench_part.jobs (kind, finished_at)
        INCLUDE (queue, state, started_at, last_error_code)
        WHERE state IN ('done', 'failed', 'cancelled');
    CREATE INDEX ON bench_part.jobs (queue)
        WHERE state IN ('scheduled', 'done', 'failed', 'cancelled');
";

/// What reclaiming the old rows cost one way.
#[derive(Debug, Default)]
struct Figures {
    rate: Samples,
    secs: Samples,
    wal_per_row: Samples,
    dead: Samples,
    mib: Samples,
}

/// Server-wide WAL position in bytes.
async fn wal(conn: &mut sqlx::PgConnection) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(&mut *conn)
            .await?,
    )
}

/// Dead tuples and total size (MiB) of `table` and its partitions, read on a fresh
/// connection after the statistics settled.
async fn leftovers(db: &BenchDb, table: &str) -> anyhow::Result<(f64, f64)> {
    db.settle_stats().await?;
    let mut conn = db.connect().await?;
    let (dead, bytes): (i64, i64) = sqlx::query_as(
        "WITH t AS (
             SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf
             UNION
             SELECT c.oid FROM pg_class c WHERE c.oid = $1::regclass AND c.relkind = 'r'
         )
         SELECT coalesce(sum(s.n_dead_tup), 0)::bigint,
                coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint
         FROM t LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid",
    )
    .bind(table)
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok((dead as f64, bytes as f64 / (1024.0 * 1024.0)))
}

/// Fills `jobq.jobs` with `old` done rows finished 7 to 14 days ago and a day's worth
/// (`old / 7`) finished in the last day, and the partitioned copy with the same rows.
async fn fill(db: &BenchDb, old: i64) -> anyhow::Result<()> {
    db.reset().await?;
    sqlx::raw_sql(PARTITIONED).execute(&db.pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_part.jobs_old PARTITION OF bench_part.jobs
             FOR VALUES FROM (MINVALUE) TO (now() - interval '7 days');
         CREATE TABLE bench_part.jobs_recent PARTITION OF bench_part.jobs
             FOR VALUES FROM (now() - interval '7 days') TO (MAXVALUE);",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
         SELECT $1, 'default', '0'::jsonb, 'done', 1, f, f
         FROM generate_series(1, $2) i,
              LATERAL (SELECT now() - interval '7 days 1 minute'
                              - (i::float8 / $2) * interval '7 days' AS f) t
         UNION ALL
         SELECT $1, 'default', '0'::jsonb, 'done', 1, f, f
         FROM generate_series(1, $2 / 7) i,
              LATERAL (SELECT now() - (i::float8 * 7 / $2) * interval '1 day' AS f) t",
    )
    .bind(KIND)
    .bind(old)
    .execute(&db.pool)
    .await?;
    sqlx::query("INSERT INTO bench_part.jobs SELECT * FROM jobq.jobs")
        .execute(&db.pool)
        .await?;
    for table in ["jobq.jobs", "bench_part.jobs"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
            .execute(&db.pool)
            .await?;
    }
    Ok(())
}

/// The retention rows: rows reclaimed per second, WAL bytes per row (server-wide: other
/// clients of the server add to it), dead tuples left and the table's size after.
pub(crate) async fn retention(s: &Settings, db: &BenchDb, r: &mut Report) -> anyhow::Result<()> {
    let old: i64 = if s.quick { 20_000 } else { 700_000 };
    let (mut batches, mut partition) = (Figures::default(), Figures::default());
    for rep in 0..s.reps {
        crate::progress(&format!(
            "retention, repetition {}: {old} done rows older than 7 days, {} newer",
            rep + 1,
            old / 7
        ));
        fill(db, old).await?;
        let mut conn = db.connect().await?;

        // The pruner's own pass: bounded batches of 1,000, each in its transaction.
        let pruner = Pruner::new(db.pool.clone(), PrunerConfig::default());
        let (w0, t0) = (wal(&mut conn).await?, Instant::now());
        let report = pruner.run_once().await?;
        let (secs, w1) = (t0.elapsed().as_secs_f64(), wal(&mut conn).await?);
        if report.done != u64::try_from(old)? {
            anyhow::bail!("the pruner deleted {} rows, not {old}", report.done);
        }
        let (dead, mib) = leftovers(db, "jobq.jobs").await?;
        push(&mut batches, old, secs, w1 - w0, dead, mib);

        // The partition holding the same rows, emptied in one statement.
        let (w0, t0) = (wal(&mut conn).await?, Instant::now());
        sqlx::query("TRUNCATE bench_part.jobs_old")
            .execute(&mut conn)
            .await?;
        let (secs, w1) = (t0.elapsed().as_secs_f64(), wal(&mut conn).await?);
        let (dead, mib) = leftovers(db, "bench_part.jobs").await?;
        push(&mut partition, old, secs, w1 - w0, dead, mib);
        conn.close().await?;
    }
    sqlx::raw_sql("DROP SCHEMA bench_part CASCADE")
        .execute(&db.pool)
        .await?;
    let time_ratio = batches.secs.median() / partition.secs.median();
    let wal_ratio = batches.wal_per_row.median() / partition.wal_per_row.median();
    r.ceiling(
        "retention_partition",
        &format!("retention: {old} done rows reclaimed by TRUNCATE of their time partition"),
        partition.rate.clone(),
    );
    r.jobq(
        "retention: the same rows deleted by the pruner in batches of 1,000",
        batches.rate.clone(),
        Some("retention_partition"),
        vec![],
    );
    for (how, f) in [("pruner", batches), ("partition", partition)] {
        r.cost(&format!("  {how}: time"), f.secs, "s", vec![]);
        r.cost(
            &format!("  {how}: WAL bytes per row (server-wide)"),
            f.wal_per_row,
            "B",
            vec![],
        );
        r.cost(&format!("  {how}: dead tuples left"), f.dead, "", vec![]);
        r.cost(&format!("  {how}: table size after"), f.mib, "MiB", vec![]);
    }
    r.cost(
        "retention: pruner ÷ partition, time (medians)",
        Samples(vec![time_ratio]),
        "×",
        vec![],
    );
    r.cost(
        "retention: pruner ÷ partition, WAL (medians)",
        Samples(vec![wal_ratio]),
        "×",
        vec![],
    );
    Ok(())
}

fn push(f: &mut Figures, rows: i64, secs: f64, wal: f64, dead: f64, mib: f64) {
    f.rate.push(rows as f64 / secs);
    f.secs.push(secs);
    f.wal_per_row.push(wal / rows as f64);
    f.dead.push(dead);
    f.mib.push(mib);
}
