//! The scale rows: autovacuum on for the run, the drain of a dirty table against an empty
//! one, the soak, and the soak with a snapshot held open in the middle.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use jobq::maintenance::PrunerConfig;
use jobq::{Job, JobContext, JobError, Runtime};

use crate::Settings;
use crate::report::{Report, Target};
use crate::util::{BenchDb, KIND, Samples, quantile};

/// The server's autovacuum setting as the run found it, to put back when it ends.
#[derive(Debug)]
pub(crate) struct Autovacuum {
    /// `postgresql.auto.conf`'s own value before the run (`None`: it had none).
    before: Option<String>,
    changed: bool,
}

impl Autovacuum {
    /// Turns autovacuum on for the run (`ALTER SYSTEM`, reloaded), remembering what
    /// `postgresql.auto.conf` said before. The server is left as it was by [`restore`].
    pub(crate) async fn enable(db: &BenchDb, on: bool) -> anyhow::Result<Autovacuum> {
        let mut conn = admin(db).await?;
        let before: Option<String> = sqlx::query_scalar(
            "SELECT setting FROM pg_file_settings
             WHERE name = 'autovacuum' AND sourcefile LIKE '%postgresql.auto.conf'
             ORDER BY seqno DESC LIMIT 1",
        )
        .fetch_optional(&mut conn)
        .await?;
        let want = if on { "on" } else { "off" };
        let current: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
            .fetch_one(&mut conn)
            .await?;
        if current == want {
            return Ok(Autovacuum {
                before,
                changed: false,
            });
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET autovacuum = {want}"
        )))
        .execute(&mut conn)
        .await
        .context("turning autovacuum on needs a superuser (ALTER SYSTEM)")?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await?;
        wait_setting(db, want).await?;
        eprintln!("  … autovacuum {want} for this run (was {current}); restored at the end");
        Ok(Autovacuum {
            before,
            changed: true,
        })
    }

    /// Puts `postgresql.auto.conf` back as it was and reloads, on a connection of its
    /// own to the server's `postgres` database (the bench database may be gone).
    pub(crate) async fn restore(self, db: &BenchDb) -> anyhow::Result<()> {
        if !self.changed {
            return Ok(());
        }
        let mut conn = admin(db).await?;
        let sql = match &self.before {
            None => "ALTER SYSTEM RESET autovacuum".to_owned(),
            Some(v) if v == "on" || v == "off" => format!("ALTER SYSTEM SET autovacuum = {v}"),
            Some(v) => bail!("unexpected autovacuum setting `{v}` in postgresql.auto.conf"),
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut conn)
            .await?;
        Ok(())
    }
}

/// A connection to the server's `postgres` database, for server-wide settings.
async fn admin(db: &BenchDb) -> anyhow::Result<sqlx::PgConnection> {
    use sqlx::Connection;
    Ok(sqlx::PgConnection::connect_with(&db.options.clone().database("postgres")).await?)
}

async fn wait_setting(db: &BenchDb, want: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A new connection reads the reloaded configuration.
        let mut conn = db.connect().await?;
        let now: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
            .fetch_one(&mut conn)
            .await?;
        if now == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("autovacuum did not become {want} after pg_reload_conf()");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rows around the due jobs of the dirty table: scheduled for later (same kind), due of
/// a kind no worker serves, finished history.
struct Clutter {
    scheduled: i64,
    unserved: i64,
    finished: i64,
}

async fn fill_clutter(db: &BenchDb, c: &Clutter) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, priority, run_after)
         SELECT $1, 'default', '0'::jsonb, 'scheduled', (i % 5)::int2,
                now() + interval '1 hour' + i * interval '1 millisecond'
         FROM generate_series(1, $2) i",
    )
    .bind(KIND)
    .bind(c.scheduled)
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, run_after)
         SELECT 'bench_unserved', 'default', '0'::jsonb, now() - interval '1 minute'
         FROM generate_series(1, $1)",
    )
    .bind(c.unserved)
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
         SELECT 'bench_history', 'default', '0'::jsonb, 'done', 1, now(), now()
         FROM generate_series(1, $1)",
    )
    .bind(c.finished)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// Mean time of the runtime's claim statement (a copy of `store::job_claim`'s, taking 64
/// jobs of the bench kind), run `n` times in transactions rolled back, on the table as
/// it is. Milliseconds.
async fn claim_mean_ms(db: &BenchDb, n: usize) -> anyhow::Result<f64> {
    let mut conn = db.connect().await?;
    let mut total = 0.0;
    for _ in 0..n {
        sqlx::query("BEGIN").execute(&mut conn).await?;
        let start = Instant::now();
        let rows = sqlx::query(crate::raw::RUNTIME_CLAIM)
            .bind("default")
            .bind(vec![KIND.to_owned()])
            .bind(vec![60.0_f64])
            .bind(64_i64)
            .bind("bench-probe")
            .execute(&mut conn)
            .await?;
        total += start.elapsed().as_secs_f64();
        sqlx::query("ROLLBACK").execute(&mut conn).await?;
        if rows.rows_affected() == 0 {
            bail!("the claim probe found no due job");
        }
    }
    Ok(total / n as f64 * 1e3)
}

/// Drain of `s.jobs` due jobs on an empty table and on one that also holds jobs
/// scheduled for later, due jobs of an unserved kind and finished history, alternating,
/// at the drain's best concurrency (`concurrency`).
pub(crate) async fn dirty(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    concurrency: usize,
) -> anyhow::Result<()> {
    let clutter = if s.quick {
        Clutter {
            scheduled: 20_000,
            unserved: 4_000,
            finished: 20_000,
        }
    } else {
        Clutter {
            scheduled: 1_000_000,
            unserved: 200_000,
            finished: 1_000_000,
        }
    };
    let (mut clean, mut dirty) = (Samples::default(), Samples::default());
    let (mut clean_ms, mut dirty_ms) = (Samples::default(), Samples::default());
    for rep in 0..s.reps {
        for dirty_first in [rep % 2 == 1, rep % 2 == 0] {
            db.reset().await?;
            if dirty_first {
                crate::progress(&format!(
                    "dirty table, repetition {}: {} scheduled, {} unserved, {} finished",
                    rep + 1,
                    clutter.scheduled,
                    clutter.unserved,
                    clutter.finished
                ));
                fill_clutter(db, &clutter).await?;
            } else {
                crate::progress(&format!("dirty table, repetition {}: empty table", rep + 1));
            }
            db.fill(s.jobs).await?;
            sqlx::query("VACUUM ANALYZE jobq.jobs")
                .execute(&db.pool)
                .await?;
            let ms = claim_mean_ms(db, if s.quick { 20 } else { 200 }).await?;
            let run = crate::drain_filled(s, db, 1, concurrency).await?;
            if dirty_first {
                dirty.push(run.rate);
                dirty_ms.push(ms);
            } else {
                clean.push(run.rate);
                clean_ms.push(ms);
            }
        }
    }
    r.ceiling(
        "drain_clean",
        &format!("dirty table: drain on an empty table, concurrency {concurrency}"),
        clean,
    );
    r.jobq(
        &format!(
            "dirty table: drain beside {} scheduled, {} unserved due, {} finished",
            clutter.scheduled, clutter.unserved, clutter.finished
        ),
        dirty,
        Some("drain_clean"),
        vec![Target::ratio_at_least(0.9)],
    );
    r.cost(
        "  claim statement mean, empty table",
        clean_ms,
        "ms",
        vec![],
    );
    r.cost(
        "  claim statement mean, dirty table",
        dirty_ms,
        "ms",
        vec![],
    );
    Ok(())
}

/// The soak's job: its argument is the enqueue time in microseconds since the epoch, so
/// the handler can record its start latency.
#[derive(Debug)]
struct SoakJob;

/// What the soak's handlers record.
#[derive(Debug, Default)]
struct SoakLog {
    completed: AtomicU64,
    latencies_ms: Mutex<Vec<f64>>,
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Job for SoakJob {
    const KIND: &'static str = KIND;
    type Args = u64;
    type Error = JobError;

    async fn run(ctx: JobContext, enqueued_us: u64) -> Result<(), JobError> {
        if let Some(log) = ctx.state::<Arc<SoakLog>>() {
            let ms = micros_now().saturating_sub(enqueued_us) as f64 / 1e3;
            if let Ok(mut l) = log.latencies_ms.lock() {
                l.push(ms);
            }
            log.completed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// One minute of the soak.
#[derive(Debug, Clone, Copy)]
struct Minute {
    rate: f64,
    p99_ms: f64,
    table_mib: f64,
    dead: i64,
}

/// Offered load at 70 % of the measured peak drain, enqueue and drain at once, for
/// `minutes`, autovacuum on, the pruner on with a 30 s retention. With `hold`, a
/// REPEATABLE READ transaction is held open for `hold.1` minutes from minute `hold.0`.
pub(crate) async fn soak(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    minutes: usize,
    hold: Option<(usize, usize)>,
) -> anyhow::Result<()> {
    let what = if hold.is_some() {
        "held snapshot"
    } else {
        "soak"
    };
    crate::progress(&format!("{what}: measuring the peak drain"));
    db.reset().await?;
    db.fill(s.jobs.min(50_000)).await?;
    let peak = crate::drain_filled(s, db, 1, 64).await?.rate;
    let offered = 0.7 * peak;
    db.reset().await?;
    crate::progress(&format!(
        "{what}: {minutes} min at {offered:.0} jobs/s (70 % of {peak:.0})"
    ));
    let log = Arc::new(SoakLog::default());
    let pool = db.new_pool(10).await?;
    let handle = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<SoakJob>()
        .queue("default", 64)
        .state(log.clone())
        .pruner(Some(PrunerConfig {
            interval: Duration::from_secs(5),
            done_after: Duration::from_secs(30),
            failed_after: Duration::from_secs(30),
            cancelled_after: Duration::from_secs(30),
            ..PrunerConfig::default()
        }))
        .build()?
        .start()
        .await?;
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The producer: a batch every 10 ms, carrying its enqueue time.
    let producer = {
        let pool = pool.clone();
        let errors = errors.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            let mut sent = 0.0_f64;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let due = t0.elapsed().as_secs_f64() * offered;
                let n = (due - sent).floor().max(0.0) as usize;
                if n == 0 {
                    continue;
                }
                let now = micros_now();
                if SoakJob::enqueue_many(&pool, std::iter::repeat_n(now, n))
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                sent += n as f64;
            }
        })
    };
    let mut per_minute: Vec<Minute> = Vec::new();
    let mut held = None;
    let start = Instant::now();
    let mut last_completed = 0;
    for minute in 0..minutes {
        if let Some((from, len)) = hold
            && minute == from
        {
            let mut conn = db.connect().await?;
            let len = Duration::from_secs(60 * len as u64);
            held = Some(tokio::spawn(async move {
                sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    .execute(&mut conn)
                    .await?;
                sqlx::query("SELECT count(*) FROM jobq.queues")
                    .execute(&mut conn)
                    .await?;
                tokio::time::sleep(len).await;
                sqlx::query("COMMIT").execute(&mut conn).await?;
                anyhow::Ok(())
            }));
        }
        tokio::time::sleep_until((start + Duration::from_secs(60 * (minute as u64 + 1))).into())
            .await;
        let completed = log.completed.load(Ordering::Relaxed);
        let mut lat = log
            .latencies_ms
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default();
        lat.sort_by(f64::total_cmp);
        let (bytes, dead): (i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size('jobq.jobs'),
                    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                              WHERE relid = 'jobq.jobs'::regclass), 0)",
        )
        .fetch_one(&db.pool)
        .await?;
        let m = Minute {
            rate: (completed - last_completed) as f64 / 60.0,
            p99_ms: quantile(&lat, 0.99),
            table_mib: bytes as f64 / (1024.0 * 1024.0),
            dead,
        };
        last_completed = completed;
        let holding = hold.is_some_and(|(from, len)| minute >= from && minute < from + len);
        eprintln!(
            "  … {what} minute {}: {:.0} jobs/s, start p99 {:.1} ms, jobq.jobs {:.1} MiB, {} dead tuples{}",
            minute + 1,
            m.rate,
            m.p99_ms,
            m.table_mib,
            m.dead,
            if holding { " (snapshot held)" } else { "" }
        );
        per_minute.push(m);
    }
    stop.store(true, Ordering::Relaxed);
    producer.await?;
    if let Some(h) = held {
        h.await??;
    }
    handle.shutdown().await;
    pool.close().await;
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("{what}: {errors} enqueue batches failed");
    }
    let one = |v: f64| Samples(vec![v]);
    let max_mib = per_minute.iter().map(|m| m.table_mib).fold(0.0, f64::max);
    match hold {
        None => {
            let (Some(first), Some(last)) = (per_minute.first(), per_minute.last()) else {
                return Ok(());
            };
            r.ceiling(
                "soak_first",
                "soak: completed, first minute",
                one(first.rate),
            );
            r.jobq(
                &format!("soak: completed, minute {}", per_minute.len()),
                one(last.rate),
                Some("soak_first"),
                vec![Target::ratio_at_least(0.9)],
            );
            r.cost(
                "soak: start p99, first minute",
                one(first.p99_ms),
                "ms",
                vec![],
            );
            r.cost(
                &format!("soak: start p99, minute {}", per_minute.len()),
                one(last.p99_ms),
                "ms",
                vec![Target::AtMost(2.0 * first.p99_ms, "ms (2× first)")],
            );
            for (i, m) in per_minute.iter().enumerate() {
                r.cost(
                    &format!("  soak: jobq.jobs size, minute {}", i + 1),
                    one(m.table_mib),
                    "MiB",
                    vec![],
                );
            }
            r.cost("soak: largest jobq.jobs size", one(max_mib), "MiB", vec![]);
        }
        Some((from, len)) => {
            let mean = |ms: &[Minute]| ms.iter().map(|m| m.rate).sum::<f64>() / ms.len() as f64;
            let before = &per_minute[..from];
            let during = &per_minute[from..from + len];
            let after = &per_minute[(from + len).min(per_minute.len() - 1)];
            r.ceiling(
                "held_before",
                "held snapshot: completed before the hold",
                one(mean(before)),
            );
            r.jobq(
                "held snapshot: completed during the 5-minute hold",
                one(mean(during)),
                Some("held_before"),
                vec![Target::ratio_at_least(0.7)],
            );
            r.jobq(
                "held snapshot: completed in the minute after it",
                one(after.rate),
                Some("held_before"),
                vec![Target::ratio_at_least(0.95)],
            );
            for (i, m) in during.iter().enumerate() {
                r.cost(
                    &format!("  held snapshot: dead tuples, minute {} of the hold", i + 1),
                    one(m.dead as f64),
                    "",
                    vec![],
                );
            }
            r.cost(
                "held snapshot: largest jobq.jobs size",
                one(max_mib),
                "MiB",
                vec![],
            );
        }
    }
    Ok(())
}
