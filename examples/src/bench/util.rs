//! Shared pieces: the no-op job, the bench database, PostgreSQL cost counters, and
//! median-of-repetitions bookkeeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use jobq::{Job, JobContext, JobError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// The kind every bench job has.
pub(crate) const KIND: &str = "bench_noop";

/// A job that does nothing, except record its start time when a [`Starts`] recorder is
/// in the runtime's state (the latency run).
#[derive(Debug)]
pub(crate) struct Noop;

impl Job for Noop {
    const KIND: &'static str = KIND;
    type Args = u64;
    type Error = JobError;

    async fn run(ctx: JobContext, seq: u64) -> Result<(), JobError> {
        if let Some(starts) = ctx.state::<std::sync::Arc<Starts>>() {
            starts.record(seq);
        }
        Ok(())
    }
}

/// Handler start times by sequence number (latency run).
#[derive(Debug)]
pub(crate) struct Starts {
    pub(crate) epoch: Instant,
    pub(crate) at: Mutex<Vec<Option<Duration>>>,
}

impl Starts {
    pub(crate) fn new(n: usize) -> Starts {
        Starts {
            epoch: Instant::now(),
            at: Mutex::new(vec![None; n]),
        }
    }

    fn record(&self, seq: u64) {
        let now = self.epoch.elapsed();
        if let Ok(mut at) = self.at.lock()
            && let Some(slot) = usize::try_from(seq).ok().and_then(|i| at.get_mut(i))
        {
            slot.get_or_insert(now);
        }
    }
}

/// The bench database: created fresh at start, its tables reset between repetitions.
#[derive(Debug, Clone)]
pub(crate) struct BenchDb {
    pub(crate) options: PgConnectOptions,
    pub(crate) url: String,
    pub(crate) pool: PgPool,
}

/// The bench database's name: one per run (`jobq_bench_<pid>`), so runs by several
/// people on one server do not drop each other's database.
fn db_name() -> String {
    format!("jobq_bench_{}", std::process::id())
}

impl BenchDb {
    pub(crate) async fn create() -> anyhow::Result<BenchDb> {
        let db_url = examples::fresh_database_url(&db_name()).await?;
        let options: PgConnectOptions = db_url.parse()?;
        let options = options.log_statements(tracing::log::LevelFilter::Off);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
            .await?;
        jobq::migrate(&pool).await?;
        Ok(BenchDb {
            options,
            url: db_url,
            pool,
        })
    }

    /// Drops the bench database (its pool closed first), from the server's `postgres`
    /// database.
    pub(crate) async fn drop_database(&self) -> anyhow::Result<()> {
        let name = self.options.get_database().unwrap_or_default().to_owned();
        let mut conn =
            PgConnection::connect_with(&self.options.clone().database("postgres")).await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        conn.close().await?;
        Ok(())
    }

    /// A pool of `max` connections to the bench database.
    pub(crate) async fn new_pool(&self, max: u32) -> anyhow::Result<PgPool> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            .min_connections(max.min(4))
            .connect_with(self.options.clone())
            .await?)
    }

    /// A pool of `max` connections, all of them open before it is returned.
    pub(crate) async fn warm_pool(&self, max: u32) -> anyhow::Result<PgPool> {
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .min_connections(max)
            .connect_with(self.options.clone())
            .await?;
        let mut held = Vec::new();
        for _ in 0..max {
            held.push(pool.acquire().await?);
        }
        drop(held);
        Ok(pool)
    }

    /// One connection outside any pool (a raw-SQL client).
    pub(crate) async fn connect(&self) -> anyhow::Result<PgConnection> {
        Ok(PgConnection::connect_with(&self.options).await?)
    }

    /// Empties the job table (the repetition's reset).
    pub(crate) async fn reset(&self) -> anyhow::Result<()> {
        sqlx::query("TRUNCATE jobq.jobs RESTART IDENTITY")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Inserts `n` due no-op jobs with one set-based statement (not measured).
    pub(crate) async fn fill(&self, n: usize) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO jobq.jobs (kind, queue, payload)
             SELECT $1, 'default', '0'::jsonb FROM generate_series(1, $2)",
        )
        .bind(KIND)
        .bind(i64::try_from(n)?)
        .execute(&self.pool)
        .await?;
        sqlx::query("ANALYZE jobq.jobs").execute(&self.pool).await?;
        self.checkpoint().await
    }

    /// Starts the next measurement on a fresh checkpoint cycle. A checkpoint begins every
    /// ~0.5 GB of WAL (the default `max_wal_size`), and one that starts during a
    /// measurement makes every page it then touches first write a full-page image; the
    /// fills (a gigabyte of WAL for the dirty table's) put that start at a random point
    /// of one run and not of the other it is paired with. A role that may not
    /// `CHECKPOINT` is told once and measured without.
    pub(crate) async fn checkpoint(&self) -> anyhow::Result<()> {
        static REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if let Err(e) = sqlx::query("CHECKPOINT").execute(&self.pool).await
            && !REFUSED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            crate::progress(&format!("CHECKPOINT refused ({e}): runs start mid-cycle"));
        }
        Ok(())
    }

    /// Whether any bench job is still pending (or waiting behind its ordering key's
    /// predecessor), or any job running: polled every 10 ms beside the drain it times,
    /// so it reads a few index pages whatever the table holds. Each question reads its
    /// partial index from the end the drain reaches last (a drain claims pending jobs
    /// from the front, and leases' dead entries pile up at the low end), as a scalar
    /// subquery: the planner drops the `ORDER BY` of an `EXISTS`. The form before
    /// (plain `EXISTS`) got a sequential scan as its generic plan, which on the dirty
    /// table read through 2.2 million other rows each time.
    pub(crate) async fn unfinished(&self) -> anyhow::Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT (SELECT true FROM jobq.jobs
                     WHERE state = 'pending' AND queue = 'default' AND kind = $1
                       AND blocked_by IS NULL
                     ORDER BY priority DESC, run_after DESC, id DESC LIMIT 1) IS NOT NULL
                 OR (SELECT true FROM jobq.jobs WHERE state = 'running'
                     ORDER BY locked_until DESC LIMIT 1) IS NOT NULL
                 OR EXISTS (SELECT 1 FROM jobq.jobs
                            WHERE state = 'pending' AND queue = 'default'
                              AND blocked_by IS NOT NULL)",
        )
        .bind(KIND)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Bench jobs (of [`KIND`]) in `state`.
    pub(crate) async fn count_state(&self, state: &str) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = $1 AND kind = $2")
                .bind(state)
                .bind(KIND)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Commits of the bench database and the server's WAL position, read on a fresh
    /// connection so the statistics other backends flushed are visible.
    pub(crate) async fn counters(&self) -> anyhow::Result<Counters> {
        let mut conn = self.connect().await?;
        let (commits, wal_bytes): (i64, f64) = sqlx::query_as(
            "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await?;
        let dead: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables
             WHERE schemaname = 'jobq' AND relname = 'jobs'",
        )
        .fetch_one(&mut conn)
        .await?;
        conn.close().await?;
        Ok(Counters {
            commits,
            wal_bytes,
            dead_tuples: dead,
        })
    }

    /// Makes this session's and exited backends' statistics visible: flush ours, and give
    /// exiting backends a moment to flush theirs.
    pub(crate) async fn settle_stats(&self) -> anyhow::Result<()> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// PostgreSQL's cost counters at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) commits: i64,
    pub(crate) wal_bytes: f64,
    pub(crate) dead_tuples: i64,
}

/// The repetitions of one figure.
#[derive(Debug, Clone, Default)]
pub(crate) struct Samples(pub(crate) Vec<f64>);

impl Samples {
    pub(crate) fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    pub(crate) fn median(&self) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let m = v.len() / 2;
        if !v.len().is_multiple_of(2) {
            v[m]
        } else {
            (v[m - 1] + v[m]) / 2.0
        }
    }

    pub(crate) fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }

    pub(crate) fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
}

/// The `q`-quantile (0..=1) of sorted `v`, nearest rank.
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// CPU time this process has used, user and system, all threads (`/proc/self/stat`, in
/// clock ticks of 10 ms).
pub(crate) fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The fields after the command name: utime and stime are the 12th and 13th.
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let utime: u64 = rest.get(11)?.parse().ok()?;
            let stime: u64 = rest.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Peak resident set size of this process in KiB (`VmHWM`).
pub(crate) fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
