//! The relay: claims unpublished events, hands them to a [`Sink`], and marks them
//! published only after the sink reports the broker's acknowledgement.
//!
//! One pass holds one connection and never a transaction while it waits for the broker:
//! it takes each aggregate under a session-level advisory lock (another relay skips it),
//! reads the aggregates' rows in a statement of its own, lets the sink publish with no
//! transaction open (an open one would hold back vacuum for the whole cluster for as long
//! as the broker takes), records the outcome (published, or failed with a backoff) in
//! one autocommitted statement each, and only then releases the locks. A relay that dies
//! mid-pass — even after the broker's ack — releases its locks with its connection and
//! has changed nothing, so another pass re-sends the same events under the same ids: the
//! broker's dedupe (JetStream's `Nats-Msg-Id`) or the consumer's inbox (the AMQP
//! `message_id`) absorbs the copy. A pass that fails or is cancelled closes its connection
//! instead of returning it to the pool with locks held. Session locks need a real
//! session: a relay's pool must not go through a transaction-mode pooler.
//!
//! Order: the events of one aggregate go out in version order, one "wave" at a time
//! (the first event of every claimed aggregate, then the second, …), and a failed event
//! stops its aggregate for this pass, so a later version never overtakes an earlier one.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::OutboxEvent;
use crate::error::Error;
use crate::maintenance::{Leader, Resume, jittered};
use crate::store::{self, PublishFailure};

/// The advisory-lock key of the outbox retention's leader election ("jobqoutp" in
/// ASCII): of all relays on all nodes, only the one holding it prunes.
pub const OUTBOX_PRUNE_LOCK: i64 = 0x6a6f_6271_6f75_7470;

/// Why a sink could not publish an event. `code` is stable (`nats_stream_not_found`,
/// `amqp_nack`, …) and is stored in `outbox.last_error_code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkError {
    /// Stable, machine-readable.
    pub code: String,
    /// For people.
    pub message: String,
}

impl SinkError {
    /// An error with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> SinkError {
        SinkError {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for SinkError {}

/// Where a relay publishes: NATS JetStream ([`NatsSink`](super::NatsSink), `nats`
/// feature), RabbitMQ ([`RabbitSink`](super::RabbitSink), `rabbitmq` feature), or your
/// own.
///
/// `publish` gets events of distinct aggregates (at most one per aggregate per call) and
/// returns one result per event, in order. `Ok` must mean the broker acknowledged the
/// event durably: the relay marks it published on that word and never sends it again.
/// Use the event's `id` as the broker's message id, so a re-send after a crash can be
/// recognised downstream.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + 'static {
    /// Publishes `events`, returning one result per event, in order.
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), SinkError>>;
}

/// A relay's settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The most events one pass claims (default 200).
    pub batch: usize,
    /// How many of the oldest unpublished events a pass looks at to find aggregates no
    /// other relay holds (default 10 × `batch`).
    pub window: usize,
    /// Time between passes while the outbox is empty (default 100 ms).
    pub poll_interval: Duration,
    /// The first backoff after a failed publish (default 200 ms); it doubles per failed
    /// attempt of an event, and per pass in which nothing could be published.
    pub backoff_base: Duration,
    /// The longest backoff (default 30 s).
    pub backoff_cap: Duration,
    /// Published events are deleted this long after publication (default 7 days).
    pub retention: Duration,
    /// Time between retention passes (default 60 s).
    pub prune_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch: 200,
            window: 2000,
            poll_interval: Duration::from_millis(100),
            backoff_base: Duration::from_millis(200),
            backoff_cap: Duration::from_secs(30),
            retention: Duration::from_secs(7 * 24 * 3600),
            prune_interval: Duration::from_secs(60),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Events claimed.
    pub claimed: usize,
    /// Events the broker acknowledged, now marked published.
    pub published: usize,
    /// Events whose publish failed (recorded with a backoff).
    pub failed: usize,
    /// Events claimed but not sent because an earlier event of their aggregate failed.
    pub held_back: usize,
}

/// The connection of one pass while it holds aggregate locks: unless the pass released
/// them (`clean`), the connection is closed rather than returned to the pool, which ends
/// its session and so its locks (a failed statement, or a pass cancelled at shutdown).
struct Held<'a> {
    conn: &'a mut PoolConnection<Postgres>,
    clean: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.close_on_drop();
        }
    }
}

/// Relays the outbox to a broker. Add it to a runtime with
/// [`RuntimeBuilder::relay`](crate::RuntimeBuilder::relay); any number of relays, on any
/// number of nodes, may run at once.
#[derive(Clone)]
pub struct Relay {
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    /// Where the window of unpublished events starts: the first event of the last
    /// window, while windows read from the oldest are slow ([`Resume`]).
    window: Arc<Resume<i64>>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay to `sink`, with default settings.
    pub fn new(sink: impl Sink) -> Relay {
        Relay {
            sink: Arc::new(sink),
            config: RelayConfig::default(),
            window: Arc::default(),
        }
    }

    /// A relay to NATS JetStream: each event goes to `subject(event)`, with the event id
    /// as `Nats-Msg-Id`, and counts as published once JetStream acknowledged it. The
    /// subject must belong to a stream.
    #[cfg(feature = "nats")]
    pub fn nats(
        client: async_nats::Client,
        subject: impl Fn(&OutboxEvent) -> String + Send + Sync + 'static,
    ) -> Relay {
        Relay::new(super::NatsSink::new(client, subject))
    }

    /// A relay to RabbitMQ: each event goes to `exchange` with routing key
    /// `routing_key(event)`, persistent, `message_id` = event id, mandatory, and counts as
    /// published once the broker confirmed it (the channel is put in confirm mode).
    #[cfg(feature = "rabbitmq")]
    pub fn rabbitmq(
        channel: lapin::Channel,
        exchange: impl Into<String>,
        routing_key: impl Fn(&OutboxEvent) -> String + Send + Sync + 'static,
    ) -> Relay {
        Relay::new(super::RabbitSink::new(channel, exchange, routing_key))
    }

    /// Replaces all settings.
    pub fn config(mut self, config: RelayConfig) -> Relay {
        self.config = config;
        self
    }

    /// The most events one pass claims (and the window: ten times that).
    pub fn batch(mut self, events: usize) -> Relay {
        self.config.batch = events.max(1);
        self.config.window = self.config.batch * 10;
        self
    }

    /// Time between passes while the outbox is empty.
    pub fn poll_interval(mut self, every: Duration) -> Relay {
        self.config.poll_interval = every;
        self
    }

    /// The backoff after failed publishes: from `base`, doubling, up to `cap`.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Relay {
        self.config.backoff_base = base;
        self.config.backoff_cap = cap.max(base);
        self
    }

    /// How long published events are kept.
    pub fn retention(mut self, keep: Duration) -> Relay {
        self.config.retention = keep;
        self
    }

    /// The settings.
    pub fn settings(&self) -> &RelayConfig {
        &self.config
    }

    fn backoff_for(&self, failures: u32) -> Duration {
        let c = &self.config;
        let exp = c
            .backoff_base
            .saturating_mul(1u32 << failures.min(20))
            .min(c.backoff_cap);
        jittered(exp).min(c.backoff_cap)
    }

    /// One pass: claim, publish, record. Returns what it did.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the outbox cannot be read or written; the pass then
    /// changes nothing, and its events are sent again by a later pass.
    pub async fn run_once(&self, pool: &PgPool) -> Result<RelayReport, Error> {
        let mut conn = pool.acquire().await?;
        let mut held = Held {
            conn: &mut conn,
            clean: false,
        };
        let started = Instant::now();
        let start = self.window.start(started);
        let (keys, first) = store::outbox_lock(
            held.conn,
            self.config.window.max(self.config.batch) as i64,
            self.config.batch as i64,
            start.flatten(),
        )
        .await?;
        if start.is_none() {
            self.window.ran_full(started, started.elapsed());
        }
        self.window.reached(first);
        if keys.is_empty() {
            held.clean = true;
            return Ok(RelayReport::default());
        }
        let claimed = store::outbox_claim(held.conn, &keys, self.config.batch as i64).await?;
        let mut report = RelayReport {
            claimed: claimed.len(),
            ..RelayReport::default()
        };
        // Group by aggregate, keeping the claim's order within each.
        let mut groups: Vec<Vec<OutboxEvent>> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for e in claimed {
            let key = match &e.aggregate {
                Some(a) => format!("{}:{}", a.kind, a.id),
                None => format!("event:{}", e.id),
            };
            let i = *index.entry(key).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[i].push(e);
        }
        let mut published = Vec::new();
        let mut failures = Vec::new();
        let mut alive: Vec<bool> = vec![true; groups.len()];
        let mut by_type: HashMap<String, u64> = HashMap::new();
        let deepest = groups.iter().map(Vec::len).max().unwrap_or(0);
        for wave in 0..deepest {
            let members: Vec<usize> = (0..groups.len())
                .filter(|&g| alive[g] && groups[g].len() > wave)
                .collect();
            if members.is_empty() {
                break;
            }
            let events: Vec<OutboxEvent> =
                members.iter().map(|&g| groups[g][wave].clone()).collect();
            let results = self.sink.publish(&events).await;
            for (k, &g) in members.iter().enumerate() {
                let e = &groups[g][wave];
                let result = results.get(k).cloned().unwrap_or_else(|| {
                    Err(SinkError::new(
                        "sink_incomplete",
                        "the sink returned fewer results than events",
                    ))
                });
                match result {
                    Ok(()) => {
                        published.push(e.id);
                        *by_type.entry(e.event_type.clone()).or_default() += 1;
                    }
                    Err(err) => {
                        alive[g] = false;
                        report.held_back += groups[g].len() - wave - 1;
                        crate::metrics::outbox_failed(&err.code);
                        failures.push(PublishFailure {
                            id: e.id,
                            retry_in_secs: self.backoff_for(e.attempts.max(0) as u32).as_secs_f64(),
                            code: err.code,
                            message: err.message,
                        });
                    }
                }
            }
        }
        report.published = published.len();
        report.failed = failures.len();
        store::outbox_mark_published(held.conn, &published).await?;
        store::outbox_mark_failed(held.conn, &failures).await?;
        // Only now, with the outcome committed, may another relay take these aggregates.
        store::outbox_unlock(held.conn, &keys).await?;
        held.clean = true;
        for (t, n) in by_type {
            crate::metrics::outbox_published(&t, n);
        }
        Ok(report)
    }

    /// Records the last full window as one that took `took` (tests: a slow window
    /// without a slow table).
    #[cfg(test)]
    pub(crate) fn ran_full_window(&self, took: Duration) {
        self.window.ran_full(Instant::now(), took);
    }

    /// Deletes published events past the retention, in batches of 1,000, oldest first,
    /// each starting where the one before ended. Returns how many.
    ///
    /// # Errors
    ///
    /// [`Error::Database`].
    pub async fn prune(&self, pool: &PgPool) -> Result<u64, Error> {
        let retention = self.config.retention.as_secs_f64();
        let mut total = 0;
        let mut from = None;
        loop {
            let (n, last) = store::outbox_prune_batch(pool, retention, from, 1000).await?;
            from = last.or(from);
            total += n;
            if n < 1000 {
                return Ok(total);
            }
        }
    }

    /// Runs passes until `stop` is cancelled: at once while there is work, every
    /// `poll_interval` while the outbox is empty, with a growing backoff while nothing can
    /// be published; prunes every `prune_interval` while it leads the retention election
    /// ([`OUTBOX_PRUNE_LOCK`]: one relay in the cluster prunes); refreshes the lag gauge
    /// every 5 s.
    pub(crate) async fn run(self, pool: PgPool, stop: CancellationToken) {
        let mut idle_failures: u32 = 0;
        let mut leader = Leader::new(pool.clone(), OUTBOX_PRUNE_LOCK);
        let mut next_prune = Instant::now();
        let mut next_gauge = Instant::now();
        let mut gauged: Vec<String> = Vec::new();
        loop {
            if stop.is_cancelled() {
                break;
            }
            let now = Instant::now();
            if now >= next_prune {
                next_prune = now + jittered(self.config.prune_interval);
                if leader.check().await {
                    match self.prune(&pool).await {
                        Ok(n) if n > 0 => debug!(deleted = n, "outbox retention pass"),
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "outbox retention pass failed"),
                    }
                }
            }
            if now >= next_gauge {
                next_gauge = now + Duration::from_secs(5);
                if let Ok(lag) = store::outbox_lag(&pool).await {
                    // Types drained since the last refresh read zero, not their last lag.
                    let drained = gauged
                        .iter()
                        .filter(|t| !lag.iter().any(|l| &l.event_type == *t))
                        .map(|t| store::OutboxLag {
                            event_type: t.clone(),
                            unpublished: 0,
                            oldest_age_secs: 0.0,
                        })
                        .collect::<Vec<_>>();
                    crate::metrics::outbox_lag(&drained);
                    crate::metrics::outbox_lag(&lag);
                    gauged = lag.into_iter().map(|l| l.event_type).collect();
                }
            }
            let wait = match self.run_once(&pool).await {
                Ok(r) if r.published > 0 => {
                    idle_failures = 0;
                    None
                }
                Ok(r) if r.failed > 0 => {
                    idle_failures = idle_failures.saturating_add(1);
                    warn!(
                        failed = r.failed,
                        held_back = r.held_back,
                        "outbox relay could not publish; backing off"
                    );
                    Some(self.backoff_for(idle_failures - 1))
                }
                Ok(r) if r.claimed > 0 => None,
                Ok(_) => {
                    idle_failures = 0;
                    Some(self.config.poll_interval)
                }
                Err(e) => {
                    idle_failures = idle_failures.saturating_add(1);
                    warn!(error = %e, "outbox relay pass failed; backing off");
                    Some(self.backoff_for(idle_failures - 1))
                }
            };
            if let Some(wait) = wait {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        leader.resign().await;
    }
}
