//! The ceiling: the same work as raw SQL on plain connections, no framework. Every jobq
//! figure is compared with the matching row here.

use std::time::Instant;

use sqlx::postgres::PgPoolCopyExt;
use sqlx::{Connection, PgConnection, PgPool};

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
    insert_one_on(conn, i).await
}

/// The raw one-row INSERT on any executor: a held connection, or a pool (which checks a
/// connection out and back in around it, as an enqueue on a pool does).
pub(crate) async fn insert_one_on<'e>(
    conn: impl sqlx::PgExecutor<'e>,
    i: usize,
) -> anyhow::Result<()> {
    sqlx::query("INSERT INTO jobq.jobs (kind, queue, payload) VALUES ($1, $2, $3::text::jsonb)")
        .bind(KIND)
        .bind("default")
        .bind(i.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

/// Where a bulk ceiling runs: a held connection, or a pool (which checks a connection
/// out and back in around each batch, as `enqueue_many(&pool, …)` does).
pub(crate) enum On<'a> {
    Conn(&'a mut PgConnection),
    Pool(&'a PgPool),
}

/// Batches of `batch` rows, one `INSERT … SELECT FROM unnest(…)` each.
pub(crate) async fn insert_batches(mut on: On<'_>, n: usize, batch: usize) -> anyhow::Result<f64> {
    let kinds = vec![KIND.to_owned(); batch];
    let queues = vec!["default".to_owned(); batch];
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let payloads: Vec<String> = (done..done + batch).map(|i| i.to_string()).collect();
        let insert = sqlx::query(
            "INSERT INTO jobq.jobs (kind, queue, payload)
             SELECT k, q, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS t(k, q, p)",
        )
        .bind(&kinds)
        .bind(&queues)
        .bind(&payloads);
        match &mut on {
            On::Conn(conn) => insert.execute(&mut **conn).await?,
            On::Pool(pool) => insert.execute(*pool).await?,
        };
        done += batch;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Batches of `batch` rows, one `COPY jobq.jobs FROM STDIN` (text format) each: the
/// other bulk path a driver offers, beside the UNNEST insert.
pub(crate) async fn copy_batches(mut on: On<'_>, n: usize, batch: usize) -> anyhow::Result<f64> {
    const COPY: &str = "COPY jobq.jobs (kind, queue, payload) FROM STDIN";
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let mut data = String::with_capacity(batch * 24);
        for i in done..done + batch {
            data.push_str(KIND);
            data.push_str("\tdefault\t");
            data.push_str(&i.to_string());
            data.push('\n');
        }
        match &mut on {
            On::Conn(conn) => {
                let mut copy = conn.copy_in_raw(COPY).await?;
                copy.send(data.into_bytes()).await?;
                copy.finish().await?;
            }
            On::Pool(pool) => {
                let mut copy = pool.copy_in_raw(COPY).await?;
                copy.send(data.into_bytes()).await?;
                copy.finish().await?;
            }
        }
        done += batch;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Drains the pre-filled table with `clients` connections, each claiming `batch` jobs
/// (FOR UPDATE SKIP LOCKED) and completing them in one statement, until none is left.
/// Returns jobs per second.
///
/// The statements are planned as jobq's are, once autovacuum has analyzed the table as
/// it filled: the claim names `blocked_by IS NULL`, the predicate of the claim index
/// (without it the planner sorted the whole table for every claim), and the completion's
/// state test is written `IS TRUE`, so it finds the rows by primary key rather than by
/// walking every entry of `jobs_state_id_idx` for `running`, dead ones included.
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
                           AND blocked_by IS NULL AND run_after <= now()
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
                     WHERE id = ANY($1) AND (state = 'running') IS TRUE",
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
