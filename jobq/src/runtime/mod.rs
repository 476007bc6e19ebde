//! The runtime: [`Runtime::builder`] configures queues and job types; [`Runtime::start`]
//! runs one producer per queue (claims for its free slots, and a few jobs ahead while
//! handlers are fast), an executor task per attempt, a batching completer, a heartbeat
//! for leases, the LISTEN wake-up and the reaper; [`RuntimeHandle::shutdown`] stops them
//! gracefully.

mod completer;
mod executor;
mod lease;
mod producer;

pub use executor::{AttemptOutcome, run_attempt, run_attempt_versioned};

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::context::State;
use crate::error::Error;
use crate::job::Job;
use crate::maintenance::{
    Periodic, Promoter, PromoterConfig, Pruner, PrunerConfig, Reaper, ReaperConfig, Schedule,
    Scheduler, SchedulerConfig, Sweeper, SweeperConfig, WorkerPresence, WorkerPresenceConfig,
};
use crate::notify::{self, Wakers};
use crate::registry::{JobHandler, Registry, registered_jobs};

use completer::Completer;
use lease::RunningSet;

/// Concurrency of a queue the builder adds on its own (`default`, and each registered
/// kind's queue) when no queue is configured explicitly.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// How many jobs a queue may claim ahead of its free slots unless
/// [`RuntimeBuilder::prefetch`] says otherwise; it reaches that many only while its
/// handlers return at 6,400 a second or more (64 within 10 ms).
pub const DEFAULT_PREFETCH: usize = 64;

/// Builds a [`Runtime`]. Start from [`Runtime::builder`].
#[derive(Debug)]
#[must_use = "a RuntimeBuilder does nothing until `.build()`"]
pub struct RuntimeBuilder {
    pool: PgPool,
    queues: BTreeMap<String, usize>,
    queue_limits: BTreeMap<String, u32>,
    prefetch: usize,
    handlers: Vec<JobHandler>,
    auto_register: bool,
    poll_interval: Duration,
    heartbeat_interval: Option<Duration>,
    shutdown_timeout: Duration,
    reaper: Option<ReaperConfig>,
    promoter: Option<PromoterConfig>,
    listen: bool,
    worker_id: Option<String>,
    state: State,
    pruner: Option<PrunerConfig>,
    presence: Option<WorkerPresenceConfig>,
    periodic: Vec<Result<Periodic, Error>>,
    scheduler: Option<SchedulerConfig>,
    relays: Vec<crate::outbox::Relay>,
}

impl RuntimeBuilder {
    /// Enqueues a `J` with `args` at every slot of `schedule`, exactly once per slot
    /// across all nodes (see [`Schedule`]); for schedules known only at run time, several
    /// per kind with names of their own. Also serves `J`.
    pub fn periodic<J: Job>(mut self, schedule: Schedule, args: J::Args) -> Self {
        self.handlers.push(JobHandler::of::<J>());
        self.periodic
            .push(crate::registry::scheduler_entry::<J>(schedule, args));
        self
    }

    /// The scheduler's settings (periodic slots, expiry of jobs past their maximum age);
    /// `None` runs no scheduler in this runtime (another node must).
    pub fn scheduler(mut self, config: Option<SchedulerConfig>) -> Self {
        self.scheduler = config;
        self
    }

    /// Hands `value` to every attempt; a handler reads it with
    /// [`JobContext::state::<T>()`](crate::JobContext::state). One value per type; a
    /// second call with the same type replaces the first.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// Serves `queue` with up to `concurrency` attempts at once. Once any queue is named,
    /// only the named queues are served.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        self.queues.insert(queue.into(), concurrency);
        self
    }

    /// Caps `queue` at `limit` running jobs across every node (a row of `jobq.limits`
    /// written at start; an operator's `jobq limit set --queue` overrides it). Each
    /// process's own concurrency for the queue ([`queue`](Self::queue)) stays as it is.
    pub fn queue_limit(mut self, queue: impl Into<String>, limit: u32) -> Self {
        self.queue_limits.insert(queue.into(), limit);
        self
    }

    /// The most jobs each queue claims ahead of its free slots (default
    /// [`DEFAULT_PREFETCH`]; 0 claims only for free slots).
    ///
    /// Claiming ahead keeps claims and completions batched in a process with few slots.
    /// A queue claims ahead only as many jobs as it expects to start within about 10 ms
    /// at the rate its handlers return, so a job claimed ahead is expected to wait about
    /// that long in one worker while another may sit idle. Slow handlers get few or none:
    /// with 16 slots, handlers of 100 ms get one job ahead, handlers of a second none.
    /// Jobs claimed ahead take slots in claim order, are `running` in the table with this
    /// worker's lease, kept alive by the heartbeat; a graceful shutdown hands them back
    /// without counting an attempt, and after a crash the reaper returns them when their
    /// leases expire, like running attempts.
    pub fn prefetch(mut self, jobs: usize) -> Self {
        self.prefetch = jobs;
        self
    }

    /// Serves job type `J`, in addition to the types `#[jobq::job]` registered.
    pub fn register<J: Job>(mut self) -> Self {
        self.handlers.push(JobHandler::of::<J>());
        self
    }

    /// Whether to serve every `#[jobq::job]` type linked into the binary (default `true`).
    /// With `false`, only types passed to [`register`](Self::register) are served.
    pub fn auto_register(mut self, yes: bool) -> Self {
        self.auto_register = yes;
        self
    }

    /// How often an idle producer looks for due jobs without a notification (default 1 s).
    /// This bounds the latency of a job whose wake-up was lost and of a retry whose
    /// backoff ends.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// How often running attempts' leases are extended (default: a third of the shortest
    /// lease among the served kinds).
    pub fn heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat_interval = Some(every);
        self
    }

    /// How long [`RuntimeHandle::shutdown`] lets running attempts finish before it
    /// interrupts them and hands their jobs back (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The reaper's settings; `None` runs no reaper in this runtime (another node must).
    pub fn reaper(mut self, config: Option<ReaperConfig>) -> Self {
        self.reaper = config;
        self
    }

    /// The promoter's settings; `None` runs no promoter in this runtime (another node
    /// must, or scheduled jobs and retries never become due).
    pub fn promoter(mut self, config: Option<PromoterConfig>) -> Self {
        self.promoter = config;
        self
    }

    /// The pruner's retention policy; `None` runs no pruner in this runtime. Every
    /// runtime may run one: only the elected leader prunes.
    pub fn pruner(mut self, config: Option<PrunerConfig>) -> Self {
        self.pruner = config;
        self
    }

    /// Worker presence (this runtime's row in `jobq.workers`, which stats read to tell
    /// running against capacity and unserved kinds, and the queue gauges); `None` runs
    /// none.
    pub fn worker_presence(mut self, config: Option<WorkerPresenceConfig>) -> Self {
        self.presence = config;
        self
    }

    /// The former name of [`RuntimeBuilder::worker_presence`].
    #[deprecated(since = "0.2.0", note = "renamed worker_presence")]
    pub fn worker_heartbeat(self, config: Option<WorkerPresenceConfig>) -> Self {
        self.worker_presence(config)
    }

    /// Whether to LISTEN for enqueue notifications (default `true`); without it, jobs are
    /// found by polling only.
    pub fn listen(mut self, yes: bool) -> Self {
        self.listen = yes;
        self
    }

    /// The name stored in `jobs.locked_by` (default: host, process id and a random tag).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Relays the outbox to a broker with `relay` (several calls run several relays; each
    /// aggregate is relayed by one of them at a time, here or on other nodes). A runtime
    /// with a relay may serve no job types.
    pub fn relay(mut self, relay: crate::outbox::Relay) -> Self {
        self.relays.push(relay);
        self
    }

    /// Checks the configuration and collects the job types.
    ///
    /// # Errors
    ///
    /// [`Error::DuplicateKind`] when two types claim one kind, [`Error::Config`] when no
    /// job type is registered or a queue has no capacity, [`Error::Invalid`] for a bad
    /// queue or kind name.
    pub fn build(self) -> Result<Runtime, Error> {
        let mut registry = Registry::default();
        if self.auto_register {
            for h in registered_jobs() {
                registry.add(h)?;
            }
        }
        for h in self.handlers {
            registry.add(h)?;
        }
        if registry.is_empty() && self.relays.is_empty() {
            return Err(Error::Config(
                "no job types registered: annotate a handler with #[jobq::job] or call .register::<J>()".into(),
            ));
        }
        let mut queues = self.queues;
        if queues.is_empty() {
            queues.insert("default".to_owned(), DEFAULT_CONCURRENCY);
            for h in registry.handlers() {
                queues.insert(h.queue().to_owned(), DEFAULT_CONCURRENCY);
            }
        }
        for (name, limit) in &self.queue_limits {
            crate::store::validate_name("queue", name, crate::job::MAX_QUEUE_LEN)?;
            if *limit == 0 {
                return Err(Error::Config(format!(
                    "queue `{name}` has a limit of 0; give it at least 1 (pause a queue with `jobq pause`)"
                )));
            }
        }
        for (name, concurrency) in &queues {
            crate::store::validate_name("queue", name, crate::job::MAX_QUEUE_LEN)?;
            if *concurrency == 0 {
                return Err(Error::Config(format!(
                    "queue `{name}` has concurrency 0; give it at least 1"
                )));
            }
        }
        let shortest_lease = registry
            .handlers()
            .map(JobHandler::lease)
            .min()
            .unwrap_or(Duration::from_secs(60));
        if shortest_lease < crate::MIN_LEASE {
            return Err(Error::Config(format!(
                "a lease of {shortest_lease:?} is too short to be kept alive by heartbeats; use at least {:?}",
                crate::MIN_LEASE
            )));
        }
        let heartbeat = self
            .heartbeat_interval
            .unwrap_or(shortest_lease / 3)
            .max(Duration::from_millis(50));
        let worker_id = self.worker_id.unwrap_or_else(default_worker_id);
        // One connection more per outbox relay: each holds one for its pass.
        let own = own_pool(
            &self.pool,
            queues.len() + OWN_SERVICE_CONNECTIONS + self.relays.len(),
            &[],
        );
        let limited = limited_pool(&self.pool, queues.len());
        let periodic = crate::registry::scheduler_entries(&registry, self.periodic)?;
        let scheduler = Scheduler::new(
            own.clone(),
            self.scheduler.clone().unwrap_or_default(),
            periodic,
        )?;
        let limits = crate::flow::limits::LimitCache::new(
            registry
                .handlers()
                .map(|h| (h.kind().to_owned(), h.limits())),
            queues
                .keys()
                .map(|q| (q.clone(), self.queue_limits.get(q).copied())),
            self.poll_interval,
        );
        let (kinds, lease_secs) = registry
            .handlers()
            .map(|h| (h.kind().to_owned(), h.lease().as_secs_f64()))
            .unzip();
        Ok(Runtime {
            config: Arc::new(Config {
                pool: self.pool,
                own,
                limited,
                registry,
                queues,
                prefetch: self.prefetch,
                kinds,
                lease_secs,
                worker_id,
                poll_interval: self.poll_interval,
                heartbeat_interval: heartbeat,
                shutdown_timeout: self.shutdown_timeout,
                reaper: self.reaper,
                promoter: self.promoter,
                listen: self.listen,
                state: self.state,
                pruner: self.pruner,
                presence: self.presence,
                scheduler: self.scheduler.map(|_| scheduler.clone()),
                schedules: scheduler,
                relays: self.relays,
                limits,
            }),
        })
    }
}

/// Connections of jobq's own pool besides one per queue's producer: up to four
/// overlapping completer flushes, the LISTEN connection, the leader's, and one each for
/// the reaper and the worker registry.
const OWN_SERVICE_CONNECTIONS: usize = 8;

/// How long a session of jobq's own may sit idle inside a transaction, or run one
/// statement, before the server ends it: a stuck session of jobq's can never hold a row
/// lock or a connection for longer.
const OWN_SESSION_TIMEOUT: &str = "30s";

/// jobq's own pool: `size` connections opened lazily with the application pool's connect
/// options. Claims, outcomes, heartbeats, the reaper, the pruner and the worker registry
/// use it, so none of them ever waits for a connection a handler or the application
/// holds, leaks, or leaves idle in a transaction (sqlx's pool serves waiters first come,
/// first served, and its `begin` is not cancel-safe: launchbadge/sqlx#4393). Its sessions
/// set `idle_in_transaction_session_timeout` and `statement_timeout`. No idle timeout or
/// lifetime, so no maintenance task is spawned and `build` needs no tokio runtime; no
/// test before a check-out, which would cost a round trip per statement (a broken
/// connection fails its statement, which is retried).
/// `settings`: more settings its sessions start with.
fn own_pool(app: &PgPool, size: usize, settings: &[(&str, &str)]) -> PgPool {
    let options = (*app.connect_options())
        .clone()
        .options([
            ("idle_in_transaction_session_timeout", OWN_SESSION_TIMEOUT),
            ("statement_timeout", OWN_SESSION_TIMEOUT),
        ])
        .options(settings.iter().copied());
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(size).unwrap_or(u32::MAX))
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false)
        .connect_lazy_with(options)
}

/// The settings of the sessions that claim jobs of limited kinds and queues (a pool of
/// one connection per queue, opened when a limited claim first runs). Their statements
/// are planned once per session, not once per claim: planning the limited claim cost
/// more than running it (0.75 ms against 1 ms for 100 jobs), and PostgreSQL keeps
/// planning it afresh because its parameters change the estimates. A plan made once is
/// made on the table as it is then, so index scans are required where the table has
/// one: a plan made on an empty `jobq.jobs` would otherwise scan the whole table on
/// every claim once it holds rows.
const LIMITED_CLAIM_SETTINGS: &[(&str, &str)] = &[
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
];

/// The pool of limited claims: `size` connections as [`own_pool`]'s, with
/// [`LIMITED_CLAIM_SETTINGS`].
pub(crate) fn limited_pool(app: &PgPool, size: usize) -> PgPool {
    own_pool(app, size, LIMITED_CLAIM_SETTINGS)
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    format!(
        "{host}:{}:{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Everything the runtime's tasks share, fixed at build time.
#[derive(Debug)]
pub(crate) struct Config {
    /// The application's pool: handed to handlers, never used for jobq's own writes.
    pub(crate) pool: PgPool,
    /// jobq's own connections (see [`own_pool`]).
    pub(crate) own: PgPool,
    /// The connections that claim within limits ([`limited_pool`]).
    pub(crate) limited: PgPool,
    pub(crate) registry: Registry,
    pub(crate) queues: BTreeMap<String, usize>,
    pub(crate) prefetch: usize,
    /// Served kinds and their leases in seconds, in the same order (claim parameters).
    pub(crate) kinds: Vec<String>,
    pub(crate) lease_secs: Vec<f64>,
    pub(crate) worker_id: String,
    pub(crate) poll_interval: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) reaper: Option<ReaperConfig>,
    pub(crate) promoter: Option<PromoterConfig>,
    pub(crate) listen: bool,
    pub(crate) state: State,
    pub(crate) pruner: Option<PrunerConfig>,
    pub(crate) presence: Option<WorkerPresenceConfig>,
    /// The scheduler this runtime runs, if any.
    pub(crate) scheduler: Option<Scheduler>,
    /// The scheduler over its schedules, run or not (for [`Runtime::scheduler`]).
    pub(crate) schedules: Scheduler,
    pub(crate) relays: Vec<crate::outbox::Relay>,
    /// The concurrency and rate limits in force, as last read.
    pub(crate) limits: crate::flow::limits::LimitCache,
}

/// A configured runtime, not yet running.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// jobq::Runtime::builder(pool)
///     .queue("default", 16)
///     .build()?
///     .run_until(tokio::signal::ctrl_c())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Runtime {
    config: Arc<Config>,
}

impl Runtime {
    /// A builder with defaults: every `#[jobq::job]` type in the binary, queue `default`
    /// and each type's queue at [`DEFAULT_CONCURRENCY`], 1 s polling, LISTEN on, reaper
    /// on, promoter on (1 s), pruner on (leader-elected; 7 days for done jobs, 30 for failed and cancelled),
    /// worker heartbeat on, 30 s shutdown timeout.
    pub fn builder(pool: PgPool) -> RuntimeBuilder {
        RuntimeBuilder {
            pool,
            queues: BTreeMap::new(),
            queue_limits: BTreeMap::new(),
            prefetch: DEFAULT_PREFETCH,
            handlers: Vec::new(),
            auto_register: true,
            poll_interval: Duration::from_secs(1),
            heartbeat_interval: None,
            shutdown_timeout: Duration::from_secs(30),
            reaper: Some(ReaperConfig::default()),
            promoter: Some(PromoterConfig::default()),
            listen: true,
            worker_id: None,
            state: State::default(),
            pruner: Some(PrunerConfig::default()),
            presence: Some(WorkerPresenceConfig::default()),
            periodic: Vec::new(),
            scheduler: Some(SchedulerConfig::default()),
            relays: Vec::new(),
        }
    }

    /// Its scheduler (periodic schedules and expiry), for passes at a chosen time in tests
    /// and tools: `rt.scheduler().run_once_at(Some(t))`.
    pub fn scheduler(&self) -> Scheduler {
        self.config.schedules.clone()
    }

    /// The kinds this runtime serves.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.config.kinds.iter().map(String::as_str)
    }

    /// The queues it serves, with their concurrency.
    pub fn queues(&self) -> impl Iterator<Item = (&str, usize)> {
        self.config.queues.iter().map(|(q, c)| (q.as_str(), *c))
    }

    /// The name it writes to `jobs.locked_by`.
    pub fn worker_id(&self) -> &str {
        &self.config.worker_id
    }

    /// Starts serving in the background of the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the heartbeat's thread cannot be started.
    pub async fn start(self) -> Result<RuntimeHandle, Error> {
        let config = self.config;
        info!(
            worker = %config.worker_id,
            kinds = ?config.kinds,
            queues = ?config.queues,
            "jobq runtime starting"
        );
        let stop_claiming = CancellationToken::new();
        let stop_services = CancellationToken::new();
        let running = RunningSet::default();
        let max_backlog = config.queues.values().sum::<usize>().max(1) * BACKLOG_ROUNDS;
        let rewinds = Arc::new(producer::Rewinds::default());
        let (completer, completer_task) = Completer::spawn(
            config.own.clone(),
            max_backlog,
            running.clone(),
            rewinds.clone(),
        );
        let wakers = Arc::new(Wakers::new(config.queues.keys().map(String::as_str)));
        let attempts = TaskTracker::new();
        let mut services = Vec::new();

        let mut producers = Vec::new();
        for (queue, concurrency) in &config.queues {
            let p = producer::Producer {
                config: config.clone(),
                queue: queue.clone(),
                concurrency: *concurrency,
                prefetch: config.prefetch,
                wake: wakers.get(queue).unwrap_or_default(),
                running: running.clone(),
                completer: completer.clone(),
                attempts: attempts.clone(),
                rewinds: rewinds.clone(),
            };
            producers.push(tokio::spawn(p.run(stop_claiming.clone())));
        }
        services.push(lease::spawn_heartbeat(
            &config.own,
            running.clone(),
            config.heartbeat_interval,
            stop_services.clone(),
        )?);
        if config.listen {
            services.push(tokio::spawn(notify::listen(
                config.own.clone(),
                wakers.clone(),
                stop_services.clone(),
            )));
        }
        if let Some(rc) = config.reaper.clone() {
            let reaper = Reaper::new(config.own.clone(), rc);
            services.push(tokio::spawn(reaper.run(stop_services.clone())));
            // Ordering's safety net runs wherever the reaper does.
            let sweeper = Sweeper::new(config.own.clone(), SweeperConfig::default());
            services.push(tokio::spawn(sweeper.run(stop_services.clone())));
        }
        if let Some(scheduler) = config.scheduler.clone() {
            scheduler.register().await?;
            services.push(tokio::spawn(scheduler.run(stop_services.clone())));
        }
        if let Some(pc) = config.promoter.clone() {
            let promoter = Promoter::new(config.own.clone(), pc);
            services.push(tokio::spawn(promoter.run(stop_services.clone())));
        }
        if let Some(pc) = config.pruner.clone() {
            let pruner = Pruner::new(config.own.clone(), pc);
            services.push(tokio::spawn(pruner.run(stop_services.clone())));
        }
        if let Some(hc) = config.presence.clone() {
            let leases = config
                .lease_secs
                .iter()
                .map(|s| Duration::from_secs_f64(*s));
            let beat = WorkerPresence::new(
                config.own.clone(),
                config.worker_id.clone(),
                config.queues.iter().map(|(q, c)| (q.as_str(), *c)),
                config.kinds.iter().map(String::as_str).zip(leases),
                hc,
            );
            services.push(tokio::spawn(beat.run(stop_services.clone())));
        }
        for relay in &config.relays {
            services.push(tokio::spawn(
                relay.clone().run(config.own.clone(), stop_services.clone()),
            ));
        }
        Ok(RuntimeHandle {
            config,
            stop_claiming,
            stop_services,
            producers,
            services,
            attempts,
            running,
            completer: Some(completer),
            completer_task,
        })
    }

    /// Starts, runs until `signal` resolves (for example `tokio::signal::ctrl_c()`), then
    /// shuts down gracefully.
    ///
    /// # Errors
    ///
    /// As [`Runtime::start`].
    pub async fn run_until<F: Future>(self, signal: F) -> Result<ShutdownReport, Error> {
        let handle = self.start().await?;
        signal.await;
        info!("shutdown signal received");
        Ok(handle.shutdown().await)
    }

    /// Runs every due job of the served kinds on the current task, one at a time, through
    /// the same execution path and the same fenced writes as the running runtime, until
    /// no due job is left (or after 100,000 attempts, so a handler that keeps enqueueing
    /// due jobs cannot make it run forever). `now` replaces the database's clock for "due" and for the
    /// written times (`None`: the database's clock). For tests; `jobq-testing` builds its
    /// `drain` on it.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the database cannot be reached.
    pub async fn drain(&self, now: Option<DateTime<Utc>>) -> Result<DrainReport, Error> {
        producer::drain(&self.config, now).await
    }
}

/// What [`Runtime::drain`] did.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    /// Every attempt it ran, in order.
    pub attempts: Vec<DrainedAttempt>,
}

impl DrainReport {
    fn count(&self, state: &str) -> usize {
        self.attempts
            .iter()
            .filter(|a| a.state.as_deref() == Some(state))
            .count()
    }

    /// Attempts that left their job `done`.
    pub fn done(&self) -> usize {
        self.count("done")
    }

    /// Attempts that left their job waiting for a retry (`scheduled` for its backoff, or
    /// `pending` when it has none).
    pub fn retried(&self) -> usize {
        self.count("scheduled") + self.count("pending")
    }

    /// Attempts that left their job `failed`.
    pub fn failed(&self) -> usize {
        self.count("failed")
    }

    /// Attempts that left their job `cancelled`.
    pub fn cancelled(&self) -> usize {
        self.count("cancelled")
    }
}

/// One attempt run by [`Runtime::drain`].
#[derive(Debug, Clone)]
pub struct DrainedAttempt {
    /// The job's id.
    pub id: crate::JobId,
    /// Its kind.
    pub kind: String,
    /// The attempt number.
    pub attempt: u32,
    /// How the attempt ended.
    pub outcome: AttemptOutcome,
    /// The job's state after the write (`done`, `pending`, `failed`, `cancelled`), or
    /// `None` if the write did not apply.
    pub state: Option<String>,
}

/// How many rounds of all its slots a runtime's finished attempts may wait for their
/// outcomes to commit while the slots are already reused (see `Completer::has_room`).
/// One round would keep a small runtime's claiming and committing in lockstep. A crash re-runs at most that many finished
/// attempts whose outcomes had not committed, after their leases expire.
const BACKLOG_ROUNDS: usize = 4;

/// A running runtime. Dropping it does not stop it; call [`shutdown`](Self::shutdown).
#[derive(Debug)]
pub struct RuntimeHandle {
    config: Arc<Config>,
    stop_claiming: CancellationToken,
    stop_services: CancellationToken,
    producers: Vec<JoinHandle<()>>,
    services: Vec<JoinHandle<()>>,
    attempts: TaskTracker,
    running: RunningSet,
    completer: Option<Completer>,
    completer_task: JoinHandle<()>,
}

/// What a graceful shutdown did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Jobs handed back to `pending`: attempts still running at the deadline, and jobs
    /// claimed ahead that were waiting for a slot when claiming stopped.
    pub handed_back: usize,
}

impl RuntimeHandle {
    /// The worker id this runtime writes to `jobs.locked_by`.
    pub fn worker_id(&self) -> &str {
        &self.config.worker_id
    }

    /// How many attempts are running now (their handlers started; jobs claimed ahead and
    /// waiting for a slot are not counted).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Stops claiming, lets running attempts finish until the shutdown timeout, then
    /// interrupts the rest and hands their jobs back to `pending` at once (the interrupted
    /// attempt does not count), writes every outcome, and stops the services.
    pub async fn shutdown(mut self) -> ShutdownReport {
        self.stop_claiming.cancel();
        for p in self.producers.drain(..) {
            let _ = p.await;
        }
        self.attempts.close();
        let mut report = ShutdownReport::default();
        if tokio::time::timeout(self.config.shutdown_timeout, self.attempts.wait())
            .await
            .is_err()
        {
            let left = self.running.snapshot();
            warn!(
                running = left.len(),
                "shutdown timeout reached; interrupting running attempts and handing their jobs back"
            );
            for (_, r) in left {
                r.cancel.cancel();
                r.signals.raise(lease::Signals::INTERRUPT);
            }
            self.attempts.wait().await;
        }
        // Every hand-back is counted once written, and the attempts that handed a job back
        // waited for that: jobs claimed ahead and handed back as claiming stopped too,
        // when every running attempt finished in time.
        report.handed_back = self.running.handed_back();
        // Every attempt has ended; the completer writes the outcomes it still holds and
        // ends, while the heartbeat keeps their leases.
        drop(self.completer.take());
        let _ = (&mut self.completer_task).await;
        self.stop_services.cancel();
        for s in self.services.drain(..) {
            let _ = s.await;
        }
        info!(worker = %self.config.worker_id, handed_back = report.handed_back, "jobq runtime stopped");
        report
    }
}
