//! Shared helpers and job types for jobq's workspace-level tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Polls `check` every 20 ms until it returns `true` or `timeout` passes.
/// Returns whether it became true.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A test's hold on its handlers, given to the runtime with `.state(gate.clone())`:
/// handlers report their starts and wait until the test releases them, as a handler gets
/// any dependency (`ctx.state::<Arc<Gate>>()`), with no global state between tests.
#[derive(Debug, Default)]
pub struct Gate {
    started: AtomicU32,
    released: AtomicU32,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Arc<Gate> {
        Arc::default()
    }

    /// The gate in `ctx`'s runtime state; a permanent `no_gate` failure when the test
    /// gave none.
    pub fn of(ctx: &jobq::JobContext) -> Result<&Arc<Gate>, jobq::JobError> {
        ctx.state::<Arc<Gate>>()
            .ok_or_else(|| jobq::JobError::permanent("no_gate", "the runtime holds no Gate"))
    }

    /// Counts one more start.
    pub fn count_start(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }

    /// Records that attempt `n` started (the count is the highest attempt seen).
    pub fn start_attempt(&self, n: u32) {
        self.started.fetch_max(n, Ordering::SeqCst);
    }

    /// Starts counted (or the highest attempt recorded).
    pub fn started(&self) -> u32 {
        self.started.load(Ordering::SeqCst)
    }

    /// Lets handlers waiting for `n` (or less) go.
    pub fn release(&self, n: u32) {
        self.released.fetch_max(n, Ordering::SeqCst);
    }

    /// Whether `n` has been released.
    pub fn is_released(&self, n: u32) -> bool {
        self.released.load(Ordering::SeqCst) >= n
    }

    /// Waits until `n` is released.
    pub async fn wait(&self, n: u32) {
        while !self.is_released(n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Installs a compact tracing subscriber once (honours `RUST_LOG`, default `warn`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Starts the runtime `builder` describes (with its registrations), waits until every job
/// of `ids` is `done` or `failed` (60 s each at most, else panics), and shuts it down.
pub async fn run_until_finished(
    builder: jobq::RuntimeBuilder,
    pool: &sqlx::PgPool,
    ids: &[jobq::JobId],
) {
    let rt = builder
        .queue("default", 2)
        .poll_interval(Duration::from_millis(50))
        .build()
        .unwrap()
        .start()
        .await
        .unwrap();
    for id in ids {
        let finished = eventually(Duration::from_secs(60), || async {
            matches!(job_state(pool, *id).await.0.as_str(), "done" | "failed")
        })
        .await;
        assert!(finished, "job {id} never finished");
    }
    rt.shutdown().await;
}

/// The state and attempts of job `id`.
pub async fn job_state(pool: &sqlx::PgPool, id: jobq::JobId) -> (String, i32) {
    sqlx::query_as("SELECT state, attempts FROM jobq.jobs WHERE id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("job {id} not found: {e}"))
}

/// Worker processes a test started, SIGKILLed and reaped when dropped (a failed
/// assertion leaves no process behind).
#[derive(Debug, Default)]
pub struct Nodes(pub Vec<std::process::Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The jobs of `kind` in `state`.
pub async fn count_in_state(pool: &sqlx::PgPool, kind: &str, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE kind = $1 AND state = $2")
        .bind(kind)
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Arguments carrying one number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct N {
    /// The number.
    pub n: i64,
}

/// Installs triggers that record every violation of the job state machine's invariants in
/// `invariant_violations`: a terminal job (`done`, `failed`, `cancelled`) changing state
/// (only an operator's replay may do that, and these tests replay nothing), and
/// `attempts` exceeding `max_attempts`.
pub async fn install_invariant_checks(pool: &sqlx::PgPool) {
    sqlx::raw_sql(
        r#"
        CREATE TABLE invariant_violations (
            job_id bigint, what text, old_state text, new_state text,
            attempts int, max_attempts int, at timestamptz DEFAULT now());
        CREATE FUNCTION check_job_invariants() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'UPDATE' AND OLD.state IN ('done', 'failed', 'cancelled')
               AND NEW.state IS DISTINCT FROM OLD.state THEN
                INSERT INTO invariant_violations VALUES
                    (NEW.id, 'terminal job changed', OLD.state, NEW.state, NEW.attempts, NEW.max_attempts);
            END IF;
            IF NEW.attempts > NEW.max_attempts THEN
                INSERT INTO invariant_violations VALUES
                    (NEW.id, 'attempts exceed max_attempts', OLD.state, NEW.state, NEW.attempts, NEW.max_attempts);
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER check_job_invariants AFTER INSERT OR UPDATE ON jobq.jobs
            FOR EACH ROW EXECUTE FUNCTION check_job_invariants();
        "#,
    )
    .execute(pool)
    .await
    .unwrap_or_else(|e| panic!("installing invariant checks: {e}"));
}

/// The recorded invariant violations, formatted; empty when there are none.
pub async fn invariant_violations(pool: &sqlx::PgPool) -> Vec<String> {
    type Violation = (i64, String, Option<String>, Option<String>, i32, i32);
    let rows: Vec<Violation> = sqlx::query_as(
        "SELECT job_id, what, old_state, new_state, attempts, max_attempts FROM invariant_violations ORDER BY at",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_else(|e| panic!("reading invariant violations: {e}"));
    rows.into_iter()
        .map(|(id, what, old, new, a, m)| {
            format!("job {id}: {what} ({old:?} -> {new:?}, attempts {a}/{m})")
        })
        .collect()
}

/// Waits up to `timeout` for job `id` to reach `state`; returns whether it did.
pub async fn reaches_state(
    pool: &sqlx::PgPool,
    id: jobq::JobId,
    state: &str,
    timeout: Duration,
) -> bool {
    eventually(timeout, || async move {
        sqlx::query_scalar::<_, String>("SELECT state FROM jobq.jobs WHERE id = $1")
            .bind(id.0)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s == state)
    })
    .await
}

/// Waits up to `timeout` for every job in the table to be `done`.
pub async fn all_done(pool: &sqlx::PgPool, timeout: Duration) -> bool {
    eventually(timeout, || async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobq.jobs WHERE state <> 'done'")
            .fetch_one(pool)
            .await
            .is_ok_and(|open| open == 0)
    })
    .await
}

/// The enqueue side of `chaos_worker`'s `chaos` kind (same kind, same args): tests enqueue
/// with it; only the worker process runs the jobs.
#[derive(Debug)]
pub struct Chaos;

/// The args of a `chaos` job.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChaosArgs {
    /// The job's number, which names its effect (`effect-{n}`).
    pub n: i64,
}

impl jobq::Job for Chaos {
    const KIND: &'static str = "chaos";
    type Args = ChaosArgs;
    type Error = jobq::JobError;
    async fn run(_ctx: jobq::JobContext, _args: ChaosArgs) -> Result<(), jobq::JobError> {
        Err(jobq::JobError::permanent(
            "wrong_process",
            "chaos jobs run in chaos_worker",
        ))
    }
}

/// A `LISTEN jobq_insert` connection of its own on `pool`'s database.
pub async fn listen_for_wake_ups(
    pool: &sqlx::PgPool,
) -> anyhow::Result<sqlx::postgres::PgListener> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen("jobq_insert").await?;
    Ok(listener)
}

/// The next `jobq_insert` notification on `listener` within `within`, as (payload, pid of
/// the backend that sent it).
pub async fn next_wake_up(
    listener: &mut sqlx::postgres::PgListener,
    within: Duration,
) -> Option<(String, i32)> {
    let n = tokio::time::timeout(within, listener.recv()).await.ok()?;
    let n = n.expect("LISTEN connection failed");
    Some((n.payload().to_owned(), n.process_id() as i32))
}

/// A job nobody runs: for tests about enqueueing.
#[derive(Debug)]
pub struct Idle;

impl jobq::Job for Idle {
    const KIND: &'static str = "idle";
    type Args = N;
    type Error = jobq::JobError;
    async fn run(_ctx: jobq::JobContext, _args: N) -> Result<(), jobq::JobError> {
        Ok(())
    }
}

/// A job nobody runs, with an idempotency key (its number): for the keyed inserts.
#[derive(Debug)]
pub struct IdleKeyed;

impl jobq::Job for IdleKeyed {
    const KIND: &'static str = "idle_keyed";
    type Args = N;
    type Error = jobq::JobError;
    fn idempotency_key(args: &N) -> Option<String> {
        Some(args.n.to_string())
    }
    async fn run(_ctx: jobq::JobContext, _args: N) -> Result<(), jobq::JobError> {
        Ok(())
    }
}

/// Which insert statement [`woken_in_transaction_by`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// One job without a key.
    One,
    /// One job with an idempotency key.
    OneKeyed,
    /// A batch without keys.
    Many,
    /// A batch with idempotency keys.
    ManyKeyed,
}

/// Enqueues jobs in a transaction on `pool` through `insert` and waits (5 s at most) for
/// its wake-up; returns the pid of the backend that sent it and that of the
/// transaction's, equal when the wake-up was notified inside the transaction.
pub async fn woken_in_transaction_by(
    pool: &sqlx::PgPool,
    insert: Insert,
) -> anyhow::Result<(i32, i32)> {
    use jobq::Job;
    static KEYS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let key = || N {
        n: KEYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let mut listener = listen_for_wake_ups(pool).await?;
    // Past the cooldown of an enqueue just before (see `jobq::notify`).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut tx = pool.begin().await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await?;
    match insert {
        Insert::One => drop(Idle::enqueue(&mut tx, N { n: 0 }).await?),
        Insert::OneKeyed => drop(IdleKeyed::enqueue(&mut tx, key()).await?),
        Insert::Many => drop(Idle::enqueue_many(&mut *tx, [N { n: 0 }, N { n: 1 }]).await?),
        Insert::ManyKeyed => drop(IdleKeyed::enqueue_many(&mut *tx, [key(), key()]).await?),
    }
    tx.commit().await?;
    let (_, from) = next_wake_up(&mut listener, Duration::from_secs(5))
        .await
        .ok_or_else(|| anyhow::anyhow!("no wake-up within 5 s of the commit"))?;
    Ok((from, pid))
}

/// Waits (5 s at most) until `n` connections LISTEN on `pool`'s database; returns
/// whether they do.
pub async fn listening(pool: &sqlx::PgPool, n: i64) -> bool {
    eventually(Duration::from_secs(5), || async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .fetch_one(pool)
        .await
        .is_ok_and(|count| count == n)
    })
    .await
}
