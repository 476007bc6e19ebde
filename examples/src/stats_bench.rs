//! How fast `jobq::stats` is on a table of a million finished jobs — a harness, not a
//! timed test.
//!
//! Creates its own database `jobq_stats_bench`, seeds 1,000,000 finished jobs (done,
//! failed and cancelled, over 20 kinds and 4 queues, finished across the last 30 days)
//! plus a few thousand pending and running ones with `INSERT … SELECT generate_series`,
//! vacuums, then times several `stats` calls and prints each statement's `EXPLAIN
//! (ANALYZE, BUFFERS)` so the index use can be read.
//!
//! Run it with `cargo run --release -p examples --bin stats_bench` (uses `DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`). `ROWS` overrides the million.

use std::time::Instant;

use sqlx::{Executor, Row};

/// The statements `jobq::stats` runs, with the parameters it binds, for EXPLAIN.
const EXPLAINED: &[(&str, &str)] = &[
    (
        "pending and running (partial indexes)",
        "SELECT queue, kind, count(*) FILTER (WHERE state = 'pending' AND run_after <= now()),
                min(run_after) FILTER (WHERE state = 'pending' AND run_after <= now())
         FROM (SELECT queue, kind, state, run_after FROM jobq.jobs WHERE state = 'pending'
               UNION ALL
               SELECT queue, kind, state, run_after FROM jobq.jobs WHERE state = 'running') j
         GROUP BY queue, kind",
    ),
    (
        "finished in the window, per kind (loose index scan + index-only range scans)",
        "WITH RECURSIVE kinds AS (
            (SELECT kind FROM jobq.jobs WHERE state IN ('done', 'failed', 'cancelled')
             ORDER BY kind LIMIT 1)
            UNION ALL
            SELECT (SELECT j.kind FROM jobq.jobs j
                    WHERE j.state IN ('done', 'failed', 'cancelled') AND j.kind > k.kind
                    ORDER BY j.kind LIMIT 1)
            FROM kinds k WHERE k.kind IS NOT NULL)
         SELECT k.kind, x.* FROM kinds k CROSS JOIN LATERAL (
            SELECT j.queue, j.state, count(*) FROM jobq.jobs j
            WHERE j.state IN ('done', 'failed', 'cancelled') AND j.kind = k.kind
              AND j.finished_at >= now() - interval '1 hour'
            GROUP BY 1, 2) x
         WHERE k.kind IS NOT NULL",
    ),
    (
        "run-time percentiles, last 1,000 per kind",
        "WITH RECURSIVE kinds AS (
            (SELECT kind FROM jobq.jobs WHERE state IN ('done', 'failed', 'cancelled')
             ORDER BY kind LIMIT 1)
            UNION ALL
            SELECT (SELECT j.kind FROM jobq.jobs j
                    WHERE j.state IN ('done', 'failed', 'cancelled') AND j.kind > k.kind
                    ORDER BY j.kind LIMIT 1)
            FROM kinds k WHERE k.kind IS NOT NULL)
         SELECT k.kind, p.* FROM kinds k CROSS JOIN LATERAL (
            SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY s.secs) FROM (
                SELECT extract(epoch FROM j.finished_at - j.started_at) AS secs
                FROM jobq.jobs j
                WHERE j.state IN ('done', 'failed', 'cancelled') AND j.kind = k.kind
                  AND j.finished_at >= now() - interval '1 hour'
                  AND j.state IN ('done', 'failed') AND j.started_at IS NOT NULL
                ORDER BY j.finished_at DESC LIMIT 1000) s) p
         WHERE k.kind IS NOT NULL",
    ),
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rows: i64 = std::env::var("ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let pool = examples::fresh_database("jobq_stats_bench", 4).await?;
    jobq::migrate(&pool).await?;

    let t = Instant::now();
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at,
                               last_error_code, created_at, run_after)
         SELECT 'kind_' || (i % 20), 'queue_' || (i % 4), '{}',
                CASE WHEN i % 50 = 0 THEN 'failed' WHEN i % 97 = 0 THEN 'cancelled' ELSE 'done' END,
                1,
                f - make_interval(secs => (i % 300) / 10.0),
                f,
                CASE WHEN i % 50 = 0 THEN 'code_' || (i % 7) END,
                f - interval '1 minute', f - interval '1 minute'
         FROM generate_series(1, $1) i,
              LATERAL (SELECT now() - make_interval(secs => (i::float8 / $1) * 30 * 86400) AS f) t",
    )
    .bind(rows)
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, run_after, locked_until, started_at)
         SELECT 'kind_' || (i % 20), 'queue_' || (i % 4), '{}',
                CASE WHEN i % 10 = 0 THEN 'running' ELSE 'pending' END,
                CASE WHEN i % 10 = 0 THEN 1 ELSE 0 END,
                now() - make_interval(secs => i % 600),
                CASE WHEN i % 10 = 0 THEN now() + interval '1 minute' END,
                CASE WHEN i % 10 = 0 THEN now() END
         FROM generate_series(1, 5000) i",
    )
    .execute(&pool)
    .await?;
    println!(
        "seeded {rows} finished + 5000 open jobs in {:.1?}",
        t.elapsed()
    );
    let t = Instant::now();
    pool.execute("VACUUM ANALYZE jobq.jobs").await?;
    println!("vacuum analyze: {:.1?}", t.elapsed());

    for i in 1..=5 {
        let t = Instant::now();
        let s = jobq::stats::stats(&pool).await?;
        println!(
            "stats call {i}: {:.1?} ({} queues, {} kinds, {} failure codes, {} run-time rows)",
            t.elapsed(),
            s.queues.len(),
            s.kinds.len(),
            s.failures.len(),
            s.runtimes.len()
        );
    }

    for (what, sql) in EXPLAINED {
        println!("\n== {what}");
        let plan = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}"
        )))
        .fetch_all(&pool)
        .await?;
        for row in plan {
            let line: String = row.try_get(0)?;
            println!("{line}");
        }
    }
    pool.close().await;
    Ok(())
}
