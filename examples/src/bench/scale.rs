//! The scale rows: autovacuum on for the run, the drain of a dirty table against an empty
//! one, the soak, and the soak with a snapshot held open in the middle.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use jobq::maintenance::PrunerConfig;
use jobq::{Job, JobContext, JobError, Runtime};

use crate::Settings;
use crate::report::{Report, Target};
use crate::util::{BenchDb, KIND, Samples, quantile};

/// The server's autovacuum setting, as a line for the report. The bench never changes it
/// (`ALTER SYSTEM` is server-wide and outlives a killed run); it says so when it is off,
/// since then no figure of this run stands for a server with PostgreSQL's defaults.
pub(crate) async fn autovacuum_check(db: &BenchDb) -> anyhow::Result<String> {
    let on: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
        .fetch_one(&db.pool)
        .await?;
    Ok(if on == "on" {
        "autovacuum: on (server setting)".to_owned()
    } else {
        eprintln!(
            "  … WARNING: this server runs with autovacuum = {on}; the bench does not change it"
        );
        format!(
            "autovacuum: **{on} on this server** (its configuration, left alone): the figures \
             are not those of a server with PostgreSQL's default autovacuum"
        )
    })
}

/// `jobq.jobs`' update counters (all, heap-only), read on a fresh connection after the
/// statistics settled.
async fn update_counts(db: &BenchDb) -> anyhow::Result<(i64, i64)> {
    db.settle_stats().await?;
    let mut conn = db.connect().await?;
    let c: (i64, i64) = sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
         WHERE relid = 'jobq.jobs'::regclass",
    )
    .fetch_one(&mut conn)
    .await?;
    sqlx::Connection::close(conn).await?;
    Ok(c)
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

/// Mean time of the runtime's claim statement (`store::job_claim`'s own, taking 64 jobs
/// of the bench kind), run `n` times in transactions rolled back, on the table as it is.
/// Milliseconds.
async fn claim_mean_ms(db: &BenchDb, n: usize) -> anyhow::Result<f64> {
    let mut conn = db.connect().await?;
    let mut total = 0.0;
    for _ in 0..n {
        sqlx::query("BEGIN").execute(&mut conn).await?;
        let start = Instant::now();
        let rows = sqlx::query(jobq::__private::JOB_CLAIM_SQL)
            .bind("default")
            .bind(vec![KIND.to_owned()])
            .bind(vec![60.0_f64])
            .bind(64_i64)
            .bind("bench-probe")
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            // No start positions: every kind from the start of its range.
            .bind(Vec::<i16>::new())
            .bind(Vec::<chrono::DateTime<chrono::Utc>>::new())
            .bind(Vec::<i64>::new())
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
    let (mut clean_hot, mut dirty_hot) = (Samples::default(), Samples::default());
    let mut dirty_noav = Samples::default();
    for rep in 0..s.reps {
        // The last run of the first repetition is the comparison: the dirty table with
        // autovacuum off for `jobq.jobs` alone (a storage parameter of the bench's own
        // database; the server's setting is never touched).
        let runs: &[(bool, bool)] = if rep == 0 {
            &[(false, true), (true, true), (true, false)]
        } else if rep % 2 == 1 {
            &[(true, true), (false, true)]
        } else {
            &[(false, true), (true, true)]
        };
        for &(dirty_first, autovacuum) in runs {
            db.reset().await?;
            if !autovacuum {
                crate::progress("dirty table, comparison: autovacuum off for jobq.jobs");
                sqlx::query("ALTER TABLE jobq.jobs SET (autovacuum_enabled = off)")
                    .execute(&db.pool)
                    .await?;
            }
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
            db.checkpoint().await?;
            let ms = claim_mean_ms(db, if s.quick { 20 } else { 200 }).await?;
            let (upd0, hot0) = update_counts(db).await?;
            let run = crate::drain_filled(s, db, 1, concurrency).await;
            if !autovacuum {
                sqlx::query("ALTER TABLE jobq.jobs RESET (autovacuum_enabled)")
                    .execute(&db.pool)
                    .await?;
            }
            let run = run?;
            let (upd1, hot1) = update_counts(db).await?;
            let hot = 100.0 * (hot1 - hot0) as f64 / (upd1 - upd0).max(1) as f64;
            match (dirty_first, autovacuum) {
                (_, false) => dirty_noav.push(run.rate),
                (true, true) => {
                    dirty.push(run.rate);
                    dirty_ms.push(ms);
                    dirty_hot.push(hot);
                }
                (false, true) => {
                    clean.push(run.rate);
                    clean_ms.push(ms);
                    clean_hot.push(hot);
                }
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
    r.cost(
        "  heap-only (HOT) share of jobq.jobs updates, empty table",
        clean_hot,
        "%",
        vec![],
    );
    r.cost(
        "  heap-only (HOT) share of jobq.jobs updates, dirty table",
        dirty_hot,
        "%",
        vec![],
    );
    r.jobq(
        "dirty table, comparison: autovacuum_enabled = off on jobq.jobs (one run)",
        dirty_noav,
        Some("drain_clean"),
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

/// How a soak is sampled: `samples` windows of `period`, and with `hold` a snapshot held
/// open from window `hold.0` for `hold.1` windows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    period: Duration,
    samples: usize,
    hold: Option<(usize, usize)>,
}

impl Plan {
    /// The soak: `minutes` one-minute windows.
    pub(crate) fn soak(minutes: usize) -> Plan {
        Plan {
            period: Duration::from_secs(60),
            samples: minutes.max(1),
            hold: None,
        }
    }

    /// The held snapshot: `minutes` in thirds (before, held, after), five windows each,
    /// so the default 15 minutes hold the snapshot for 5 and `--soak-minutes 2` for 40 s.
    pub(crate) fn held(minutes: usize) -> Plan {
        Plan {
            period: Duration::from_secs(minutes.max(1) as u64 * 60) / 15,
            samples: 15,
            hold: Some((5, 5)),
        }
    }
}

/// One window of the soak.
#[derive(Debug, Clone, Copy)]
struct Window {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    table_mib: f64,
    dead: i64,
}

/// The soak's runtime: 64 slots on a pool of 10, the pruner on with a 30 s retention
/// for `done` (failed rows are kept, so the run can count them).
async fn soak_runtime(
    pool: &sqlx::PgPool,
    log: Arc<SoakLog>,
) -> anyhow::Result<jobq::RuntimeHandle> {
    Ok(Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<SoakJob>()
        .queue("default", 64)
        .state(log)
        .pruner(Some(PrunerConfig {
            interval: Duration::from_secs(5),
            done_after: Duration::from_secs(30),
            failed_after: Duration::from_secs(7 * 86_400),
            cancelled_after: Duration::from_secs(30),
            ..PrunerConfig::default()
        }))
        .build()?
        .start()
        .await?)
}

/// The soak setup's own peak: jobs completed per second by the soak's runtime (same slots,
/// same pool) while a producer enqueues on that pool as fast as the drain lets it (a
/// backlog of at most 20,000), enqueue and drain at once as in the soak. The drain alone
/// measures more than the two together sustain on a small machine, and a soak offered
/// 70 % of that was overloaded. The window opens after `warmup`, which is longer than the
/// pruner's retention, so the pruner's deletions are part of the peak: a peak taken in
/// the first 25 s, before the pruner had anything to delete, was 17,400/s where the same
/// setup sustained about 10,500/s once it pruned.
async fn soak_peak(db: &BenchDb, warmup: u64, secs: u64) -> anyhow::Result<f64> {
    db.reset().await?;
    let pool = db.new_pool(10).await?;
    let log = Arc::new(SoakLog::default());
    let handle = soak_runtime(&pool, log.clone()).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (pool, log, stop) = (pool.clone(), log.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if sent.saturating_sub(log.completed.load(Ordering::Relaxed)) > 20_000 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                SoakJob::enqueue_many(&pool, std::iter::repeat_n(micros_now(), 1000)).await?;
                sent += 1000;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    let (c0, t0) = (log.completed.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let rate = (log.completed.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    handle.shutdown().await;
    pool.close().await;
    Ok(rate)
}

/// Offered load at 70 % of the soak runtime's own peak drain, enqueue and drain at once,
/// autovacuum as the server has it, the pruner on with a 30 s retention; the windows open
/// after a warm-up at that load. With a hold, a REPEATABLE READ transaction with an xid
/// is held open over the plan's middle windows.
pub(crate) async fn soak(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    plan: Plan,
) -> anyhow::Result<()> {
    let what = if plan.hold.is_some() {
        "held snapshot"
    } else {
        "soak"
    };
    // Retention 30 s and a pruner pass every 5 s (`soak_runtime`): 40 s of warm-up.
    let (warmup, window) = if s.quick { (5, 5) } else { (40, 60) };
    let (peak, offered) = match s.soak_rate {
        Some(rate) => (None, rate),
        None => {
            crate::progress(&format!(
                "{what}: measuring the peak drain of the soak's runtime"
            ));
            let peak = soak_peak(db, warmup, window).await?;
            (Some(peak), 0.7 * peak)
        }
    };
    db.reset().await?;
    crate::progress(&format!(
        "{what}: {} windows of {:?} at {offered:.0} jobs/s ({})",
        plan.samples,
        plan.period,
        peak.map_or("given by --soak-rate".to_owned(), |p| format!(
            "70 % of {p:.0}"
        ))
    ));
    let log = Arc::new(SoakLog::default());
    let pool = db.new_pool(10).await?;
    let handle = soak_runtime(&pool, log.clone()).await?;
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The producer: a batch every 10 ms, carrying its enqueue time.
    let offering = Instant::now();
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
    // The windows open after the peak's warm-up (past the pruner's retention): measured
    // from the start, the first window held the runtime's start-up and the pruner's first
    // deletions (a start p99 of 8 s, 26 ms a minute later), against which any later
    // minute looked good.
    crate::progress(&format!(
        "{what}: {warmup} s of warm-up at the offered rate"
    ));
    tokio::time::sleep(Duration::from_secs(warmup)).await;
    // ...and once the runtime has caught up with what the warm-up offered (less than a
    // second of load waiting), at most three warm-ups later: a window 1 that still
    // completed a backlog (13,988 jobs/s against 10,730 offered, start p50 12 s, in
    // one run) set a baseline that no later window at the offered rate could reach.
    let caught_up = Instant::now() + Duration::from_secs(3 * warmup);
    while Instant::now() < caught_up {
        let waiting = offered * offering.elapsed().as_secs_f64()
            - log.completed.load(Ordering::Relaxed) as f64;
        if waiting < offered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut last_completed = log.completed.load(Ordering::Relaxed);
    if let Ok(mut l) = log.latencies_ms.lock() {
        l.clear();
    }
    let mut windows: Vec<Window> = Vec::new();
    let mut held = None;
    let start = Instant::now();
    for w in 0..plan.samples {
        if let Some((from, len)) = plan.hold
            && w == from
        {
            let mut conn = db.connect().await?;
            let len = plan.period * u32::try_from(len)?;
            held = Some(tokio::spawn(async move {
                sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    .execute(&mut conn)
                    .await?;
                // An xid and a snapshot: vacuum can remove nothing that died after it.
                sqlx::query("SELECT txid_current()")
                    .execute(&mut conn)
                    .await?;
                tokio::time::sleep(len).await;
                sqlx::query("COMMIT").execute(&mut conn).await?;
                anyhow::Ok(())
            }));
        }
        tokio::time::sleep_until((start + plan.period * u32::try_from(w + 1)?).into()).await;
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
        let m = Window {
            rate: (completed - last_completed) as f64 / plan.period.as_secs_f64(),
            p50_ms: quantile(&lat, 0.5),
            p99_ms: quantile(&lat, 0.99),
            table_mib: bytes as f64 / (1024.0 * 1024.0),
            dead,
        };
        last_completed = completed;
        let holding = plan
            .hold
            .is_some_and(|(from, len)| w >= from && w < from + len);
        eprintln!(
            "  … {what} {:.0}–{:.0} s: {:.0} jobs/s, start p50 {:.1} ms, p99 {:.1} ms, jobq.jobs {:.1} MiB, {} dead tuples{}",
            (plan.period * u32::try_from(w)?).as_secs_f64(),
            (plan.period * u32::try_from(w + 1)?).as_secs_f64(),
            m.rate,
            m.p50_ms,
            m.p99_ms,
            m.table_mib,
            m.dead,
            if holding { " (snapshot held)" } else { "" }
        );
        windows.push(m);
    }
    stop.store(true, Ordering::Relaxed);
    producer.await?;
    if let Some(h) = held {
        h.await??;
    }
    handle.shutdown().await;
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = 'failed'")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    let errors = errors.load(Ordering::Relaxed) as f64 + failed as f64;
    let one = |v: f64| Samples(vec![v]);
    let max_mib = windows.iter().map(|m| m.table_mib).fold(0.0, f64::max);
    match peak {
        Some(peak) => r.ceiling(
            &format!("{what}_peak"),
            &format!(
                "{what}: peak of the soak's own runtime, enqueue and drain at once (offered 70 % of it)"
            ),
            one(peak),
        ),
        None => r.cost(
            &format!("{what}: offered load, given by --soak-rate"),
            one(offered),
            "jobs/s",
            vec![],
        ),
    }
    match plan.hold {
        None => soak_rows(r, &windows, errors),
        Some((from, len)) => {
            let mean = |ms: &[Window]| ms.iter().map(|m| m.rate).sum::<f64>() / ms.len() as f64;
            let before = &windows[..from];
            let during = &windows[from..from + len];
            // The windows that end within a minute of the hold's end.
            let within = (60.0 / plan.period.as_secs_f64()).ceil() as usize;
            let after = &windows[from + len..(from + len + within.max(1)).min(windows.len())];
            r.ceiling(
                "held_before",
                "held snapshot: completed before the hold",
                one(mean(before)),
            );
            r.jobq(
                &format!(
                    "held snapshot: completed during the {:.0} s hold",
                    (plan.period * u32::try_from(len)?).as_secs_f64()
                ),
                one(mean(during)),
                Some("held_before"),
                vec![Target::ratio_at_least(0.7)],
            );
            r.jobq(
                "held snapshot: completed within a minute after it",
                one(mean(after)),
                Some("held_before"),
                vec![Target::ratio_at_least(0.95)],
            );
            for (i, m) in during.iter().enumerate() {
                r.cost(
                    &format!("  held snapshot: dead tuples, window {} of the hold", i + 1),
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
            r.cost(
                "held snapshot: failed enqueue batches and failed jobs",
                one(errors),
                "",
                vec![Target::at_most(0.0, "")],
            );
        }
    }
    Ok(())
}

/// The soak's verdict rows: the last minute against the first, the table's size bounded
/// (the last minute's at most 1.5× the first's: retention keeps it flat), no error.
fn soak_rows(r: &mut Report, windows: &[Window], errors: f64) {
    let one = |v: f64| Samples(vec![v]);
    let (Some(first), Some(last)) = (windows.first(), windows.last()) else {
        return;
    };
    let n = windows.len();
    r.ceiling(
        "soak_first",
        "soak: completed, first minute",
        one(first.rate),
    );
    r.jobq(
        &format!("soak: completed, minute {n}"),
        one(last.rate),
        Some("soak_first"),
        vec![Target::ratio_at_least(0.9)],
    );
    r.cost(
        "soak: start p50, first minute",
        one(first.p50_ms),
        "ms",
        vec![],
    );
    r.cost(
        &format!("soak: start p50, minute {n}"),
        one(last.p50_ms),
        "ms",
        vec![],
    );
    r.cost(
        "soak: start p99, first minute",
        one(first.p99_ms),
        "ms",
        vec![],
    );
    r.cost(
        &format!("soak: start p99, minute {n}"),
        one(last.p99_ms),
        "ms",
        vec![Target::AtMost(2.0 * first.p99_ms, "ms (2× first)")],
    );
    for (i, m) in windows.iter().enumerate() {
        r.cost(
            &format!(
                "  soak minute {}: jobq.jobs size ({} dead tuples)",
                i + 1,
                m.dead
            ),
            one(m.table_mib),
            "MiB",
            vec![],
        );
    }
    r.cost(
        &format!("soak: jobq.jobs size, minute {n}"),
        one(last.table_mib),
        "MiB",
        vec![Target::AtMost(1.5 * first.table_mib, "MiB (1.5× first)")],
    );
    r.cost(
        "soak: failed enqueue batches and failed jobs",
        one(errors),
        "",
        vec![Target::at_most(0.0, "")],
    );
}
