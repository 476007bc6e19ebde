//! The limit rows: limits that do not bind against none, a binding rate limit counted
//! from the database, and a concurrency limit across worker processes sampled from the
//! database every 10 ms. Limits are set as an operator would (`Admin::limit_set`), so
//! the worker processes read them from `jobq.limits` like any node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use jobq::Rate;
use jobq::admin::{Admin, LimitSet, LimitTarget};

use crate::report::{Report, Target};
use crate::util::{BenchDb, KIND, Samples};
use crate::worker::Worker;
use crate::{Settings, drain_once, progress};

fn target() -> LimitTarget {
    LimitTarget::Kind(KIND.to_owned())
}

async fn set(admin: &Admin, change: LimitSet) -> anyhow::Result<()> {
    admin.limit_set(&target(), &change, Some("bench")).await?;
    Ok(())
}

async fn clear(admin: &Admin, db: &BenchDb) -> anyhow::Result<()> {
    admin.limit_clear(&target(), Some("bench")).await?;
    sqlx::query("TRUNCATE jobq.rate_buckets")
        .execute(&db.pool)
        .await?;
    Ok(())
}

pub(crate) async fn limits(s: &Settings, db: &BenchDb, r: &mut Report) -> anyhow::Result<()> {
    let admin = Admin::new(db.pool.clone()).actor("bench");
    not_binding(s, db, r, &admin).await?;
    binding_rate(s, db, r, &admin).await?;
    concurrency_cap(s, db, r, &admin).await?;
    clear(&admin, db).await
}

/// Drains with no limit and with limits that never bind, alternating.
async fn not_binding(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    admin: &Admin,
) -> anyhow::Result<()> {
    let (mut none, mut loose) = (Samples::default(), Samples::default());
    for rep in 0..s.reps {
        progress(&format!(
            "limits, repetition {}: drain without limits",
            rep + 1
        ));
        clear(admin, db).await?;
        none.push(drain_once(s, db, 1, 64).await?.rate);
        progress(&format!(
            "limits, repetition {}: drain with limits that do not bind",
            rep + 1
        ));
        set(
            admin,
            LimitSet {
                concurrency: Some(10_000),
                rate: Some(Rate::per_second(1_000_000)),
                burst: None,
            },
        )
        .await?;
        loose.push(drain_once(s, db, 1, 64).await?.rate);
    }
    clear(admin, db).await?;
    r.ceiling(
        "drain_unlimited_paired",
        "limits, paired: drain at concurrency 64 with no limit",
        none,
    );
    r.jobq(
        "limits: the same drain with concurrency 10,000 and rate 1,000,000/s set (not binding)",
        loose,
        Some("drain_unlimited_paired"),
        vec![Target::ratio_at_least(0.9)],
    );
    Ok(())
}

/// The first start of a bench job and the database's time now (claims stamp
/// `started_at` with the same clock the buckets use).
async fn first_start(db: &BenchDb) -> anyhow::Result<(Option<DateTime<Utc>>, DateTime<Utc>)> {
    Ok(
        sqlx::query_as("SELECT (SELECT min(started_at) FROM jobq.jobs WHERE kind = $1), now()")
            .bind(KIND)
            .fetch_one(&db.pool)
            .await?,
    )
}

/// Bench jobs started within `window` of the first one.
async fn starts_within(db: &BenchDb, window: Duration) -> anyhow::Result<i64> {
    let Some(first) = first_start(db).await?.0 else {
        return Ok(0);
    };
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE kind = $1 AND started_at < $2")
            .bind(KIND)
            .bind(first + chrono::Duration::from_std(window)?)
            .fetch_one(&db.pool)
            .await?,
    )
}

/// A binding rate limit: jobs started within the window against rate × window + burst.
async fn binding_rate(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    admin: &Admin,
) -> anyhow::Result<()> {
    let (rate, window) = if s.quick {
        (100u32, Duration::from_secs(2))
    } else {
        (500u32, Duration::from_secs(10))
    };
    let expected = f64::from(rate) * window.as_secs_f64() + f64::from(rate);
    let mut counts = Samples::default();
    for rep in 0..s.reps {
        progress(&format!(
            "limits, repetition {}: rate {rate}/s for {window:?}",
            rep + 1
        ));
        clear(admin, db).await?;
        db.reset().await?;
        // Twice what the window may start, so the queue never runs dry.
        db.fill((expected * 2.0) as usize).await?;
        set(
            admin,
            LimitSet {
                rate: Some(Rate::per_second(rate)),
                ..LimitSet::default()
            },
        )
        .await?;
        let mut w = Worker::spawn(&db.url, 64).await?;
        w.go().await?;
        let started = Instant::now();
        // Half a second past the window's end, by the database's clock.
        let wait = chrono::Duration::from_std(window + Duration::from_millis(500))?;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (first, now) = first_start(db).await?;
            if first.is_some_and(|f| now - f > wait) || started.elapsed() > window * 4 {
                break;
            }
        }
        w.stop().await?;
        counts.push(starts_within(db, window).await? as f64);
    }
    clear(admin, db).await?;
    r.cost(
        &format!(
            "limits: jobs started in {} s at rate {rate}/s, burst {rate} (expected {expected:.0}, ±2 %)",
            window.as_secs()
        ),
        counts,
        "jobs",
        vec![
            Target::at_least(expected * 0.98, "jobs"),
            Target::at_most(expected * 1.02, "jobs"),
        ],
    );
    Ok(())
}

/// A concurrency limit of 5 across 4 worker processes: the most running rows of the kind
/// sampled every 10 ms while they drain.
async fn concurrency_cap(
    s: &Settings,
    db: &BenchDb,
    r: &mut Report,
    admin: &Admin,
) -> anyhow::Result<()> {
    let mut maxima = Samples::default();
    let jobs = if s.quick { 500 } else { 2_000 };
    for rep in 0..s.reps {
        progress(&format!(
            "limits, repetition {}: concurrency 5 across 4 processes",
            rep + 1
        ));
        clear(admin, db).await?;
        db.reset().await?;
        db.fill(jobs).await?;
        set(
            admin,
            LimitSet {
                concurrency: Some(5),
                ..LimitSet::default()
            },
        )
        .await?;
        let mut workers = Vec::new();
        for _ in 0..4 {
            workers.push(Worker::spawn(&db.url, 16).await?);
        }
        let max = Arc::new(AtomicI64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (max, stop, pool) = (max.clone(), stop.clone(), db.pool.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM jobq.jobs WHERE kind = $1 AND state = 'running'",
                    )
                    .bind(KIND)
                    .fetch_one(&pool)
                    .await?;
                    max.fetch_max(n, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                anyhow::Ok(())
            })
        };
        for w in &mut workers {
            w.go().await?;
        }
        let started = Instant::now();
        while db.unfinished().await? && started.elapsed() < s.drain_cap {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        sampler.await??;
        for w in workers {
            w.stop().await?;
        }
        maxima.push(max.load(Ordering::Relaxed) as f64);
    }
    clear(admin, db).await?;
    r.cost(
        "limits: most running rows sampled every 10 ms, concurrency 5 across 4 processes × 16",
        maxima,
        "",
        vec![Target::at_most(5.0, "")],
    );
    Ok(())
}
