//! The ceiling: the same work as raw SQL on plain connections, no framework. Every jobq
//! figure is compared with the matching row here.

use std::time::Instant;

use sqlx::{Connection, PgConnection};

use crate::util::{BenchDb, KIND};

/// One single-row INSERT per transaction (autocommit), sequentially from each of
/// `clients` clients.
pub(crate) async fn insert_one_by_one(
    db: &BenchDb,
    clients: usize,
    n: usize,
) -> anyhow::Result<f64> {
    let per = n / clients;
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(db.connect().await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut conn in conns {
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                insert_one(&mut conn, i).await?;
            }
            conn.close().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((per * clients) as f64 / start.elapsed().as_secs_f64())
}

async fn insert_one(conn: &mut PgConnection, i: usize) -> anyhow::Result<()> {
    sqlx::query("INSERT INTO jobq.jobs (kind, queue, payload) VALUES ($1, $2, $3::text::jsonb)")
        .bind(KIND)
        .bind("default")
        .bind(i.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Batches of `batch` rows, one `INSERT … SELECT FROM unnest(…)` each, from one client.
pub(crate) async fn insert_batches(db: &BenchDb, n: usize, batch: usize) -> anyhow::Result<f64> {
    let mut conn = db.connect().await?;
    let kinds = vec![KIND.to_owned(); batch];
    let queues = vec!["default".to_owned(); batch];
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let payloads: Vec<String> = (done..done + batch).map(|i| i.to_string()).collect();
        sqlx::query(
            "INSERT INTO jobq.jobs (kind, queue, payload)
             SELECT k, q, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS t(k, q, p)",
        )
        .bind(&kinds)
        .bind(&queues)
        .bind(&payloads)
        .execute(&mut conn)
        .await?;
        done += batch;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    conn.close().await?;
    Ok(rate)
}

/// Drains the pre-filled table with `clients` connections, each claiming `batch` jobs
/// (FOR UPDATE SKIP LOCKED) and completing them in one statement, until none is left.
/// Returns jobs per second.
pub(crate) async fn drain(db: &BenchDb, clients: usize, batch: i64) -> anyhow::Result<f64> {
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(db.connect().await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut conn in conns {
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            loop {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "WITH c AS MATERIALIZED (
                         SELECT id FROM jobq.jobs
                         WHERE state = 'pending' AND queue = 'default' AND kind = $2
                           AND run_after <= now()
                         ORDER BY priority, run_after, id
                         LIMIT $1
                         FOR UPDATE SKIP LOCKED
                     )
                     UPDATE jobq.jobs j
                     SET state = 'running', attempts = j.attempts + 1,
                         locked_until = now() + interval '60 seconds', locked_by = 'raw',
                         started_at = now()
                     FROM c WHERE j.id = c.id
                     RETURNING j.id",
                )
                .bind(batch)
                .bind(KIND)
                .fetch_all(&mut conn)
                .await?;
                if ids.is_empty() {
                    break;
                }
                sqlx::query(
                    "UPDATE jobq.jobs
                     SET state = 'done', finished_at = now(), locked_until = NULL, locked_by = NULL
                     WHERE id = ANY($1) AND state = 'running'",
                )
                .bind(&ids)
                .execute(&mut conn)
                .await?;
                done += ids.len();
            }
            conn.close().await?;
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The runtime's claim statement as `store::job_claim` issues it (a copy, for timing it
/// alone on the dirty table): `$1` queue, `$2` kinds, `$3` their leases, `$4` limit,
/// `$5` worker.
pub(crate) const RUNTIME_CLAIM: &str = r#"
    WITH served AS (
        SELECT * FROM unnest($2::text[], $3::float8[]) AS s(kind, lease)
    ),
    candidates AS MATERIALIZED (
        SELECT c.id FROM served k
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_after FROM jobq.jobs j
            WHERE j.state = 'pending' AND j.queue = $1 AND j.kind = k.kind
              AND j.run_after <= now()
            ORDER BY j.priority, j.run_after, j.id
            LIMIT $4
            FOR UPDATE SKIP LOCKED
        ) c
        WHERE NOT EXISTS (SELECT 1 FROM jobq.queues q WHERE q.name = $1 AND q.paused)
        ORDER BY c.priority, c.run_after, c.id
        LIMIT $4
    )
    UPDATE jobq.jobs j
    SET state = 'running',
        attempts = j.attempts + 1,
        locked_until = now() + make_interval(secs => s.lease),
        locked_by = $5,
        started_at = now()
    FROM candidates c, served s
    WHERE j.id = c.id AND s.kind = j.kind
    RETURNING j.id
"#;
