//! The transactional outbox: events written in the caller's transaction, relayed to a
//! broker by the runtime, applied once by consumers through the [`inbox`].
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
//! use jobq::outbox::{self, Event};
//!
//! let mut tx = pool.begin().await?;
//! // ... the business change ...
//! let payload = serde_json::json!({ "order_id": 123, "amount": 990 });
//! outbox::publish(&mut tx, Event::new("order_paid", &payload).aggregate("order", 123, 7)).await?;
//! tx.commit().await?; // the event exists exactly when this commits
//! # Ok(()) }
//! ```
//!
//! An event that goes out with a job rides the job's insert statement:
//! `SendInvoice::with(args).publish(event).enqueue(&mut tx)` (see
//! [`EnqueueBuilder::publish`](crate::EnqueueBuilder::publish)).
//!
//! Guarantees: an event reaches the broker at least once after its transaction commits
//! (the relay marks it published only after the broker's acknowledgement, and re-sends
//! under the same message id otherwise); events of one aggregate reach it in version
//! order, whatever the number of relays (one relay holds an aggregate at a time); and a
//! consumer that calls [`inbox::apply`] in its own transaction applies each event once.

pub mod inbox;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use sqlx::PgConnection;
use sqlx::pool::PoolConnection;
use sqlx::{Postgres, Transaction};

use crate::error::Error;
use crate::job::MAX_PAYLOAD_BYTES;
use crate::store;

#[cfg(feature = "nats")]
pub use nats::NatsSink;
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::RabbitSink;
pub use relay::{OUTBOX_PRUNE_LOCK, Relay, RelayConfig, RelayReport, Sink, SinkError};
pub use store::{Aggregate, EventParam, OutboxEvent, OutboxLag, PublishFailures, StuckEvent};
pub use uuid::Uuid;

/// The longest event type accepted.
pub const MAX_EVENT_TYPE_LEN: usize = 200;

/// Header names the relay sets on every message (NATS headers, AMQP headers), read back
/// by [`inbox::Delivery`]. The event id travels as `Nats-Msg-Id` / the AMQP `message_id`.
pub mod headers {
    /// The event type.
    pub const EVENT_TYPE: &str = "Jobq-Event-Type";
    /// The aggregate's type.
    pub const AGGREGATE_TYPE: &str = "Jobq-Aggregate-Type";
    /// The aggregate's id.
    pub const AGGREGATE_ID: &str = "Jobq-Aggregate-Id";
    /// The aggregate's version after this event.
    pub const AGGREGATE_VERSION: &str = "Jobq-Aggregate-Version";
}

/// An event to publish: a type, a JSON payload, an optional aggregate with its version,
/// and headers. Its id is a UUIDv7 made at construction.
#[derive(Debug, Clone)]
#[must_use = "an Event does nothing until it is published"]
pub struct Event {
    id: Uuid,
    event_type: String,
    payload: Result<String, String>,
    aggregate: Option<(String, String, Option<i64>)>,
    headers: BTreeMap<String, String>,
}

impl Event {
    /// An event of type `event_type` whose payload is `payload` as JSON. With the `otel`
    /// feature its headers start with the current span's W3C trace context
    /// (`traceparent`, `tracestate`), which [`Event::header`] may override.
    pub fn new<T: Serialize + ?Sized>(event_type: impl Into<String>, payload: &T) -> Event {
        Event {
            id: Uuid::now_v7(),
            event_type: event_type.into(),
            payload: serde_json::to_string(payload).map_err(|e| e.to_string()),
            aggregate: None,
            headers: crate::trace::capture().into_iter().flatten().collect(),
        }
    }

    /// The aggregate this event belongs to and the version it brings it to. Events of one
    /// aggregate are relayed in version order, and a consumer's inbox rejects a version
    /// at or below the last one it applied.
    pub fn aggregate(
        mut self,
        kind: impl Into<String>,
        id: impl fmt::Display,
        version: i64,
    ) -> Event {
        self.aggregate = Some((kind.into(), id.to_string(), Some(version)));
        self
    }

    /// The aggregate, without a version: ordered by insertion within the aggregate, and
    /// deduplicated by event id only at the consumer.
    pub fn aggregate_unversioned(
        mut self,
        kind: impl Into<String>,
        id: impl fmt::Display,
    ) -> Event {
        self.aggregate = Some((kind.into(), id.to_string(), None));
        self
    }

    /// A header carried to the broker (trace context such as `traceparent`, a tenant).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Event {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The event's id (UUIDv7): its message id at the broker and its key in the inbox.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    pub(crate) fn validate(self) -> Result<store::NewEvent, Error> {
        let bad = |message: String| Error::invalid("invalid_event", message);
        let t = &self.event_type;
        if t.trim().is_empty() || t.len() > MAX_EVENT_TYPE_LEN || t.contains('\0') {
            return Err(bad(format!(
                "event type must be 1 to {MAX_EVENT_TYPE_LEN} bytes, not blank, without NUL, got {:?}",
                t
            )));
        }
        let payload = self.payload.map_err(|e| {
            Error::invalid(
                "event_payload_not_serializable",
                format!("payload of event `{t}` could not be serialized: {e}"),
            )
        })?;
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::invalid(
                "payload_too_large",
                format!(
                    "payload of event `{t}` is {} bytes; the limit is {MAX_PAYLOAD_BYTES} bytes",
                    payload.len()
                ),
            ));
        }
        if store::has_escaped_nul(&payload) {
            return Err(Error::invalid(
                "nul_in_payload",
                format!(
                    "payload of event `{t}` contains a NUL character, which jsonb cannot store"
                ),
            ));
        }
        if let Some((kind, id, _)) = &self.aggregate
            && (kind.is_empty()
                || id.is_empty()
                || kind.len() > 200
                || id.len() > 500
                || kind.contains('\0')
                || id.contains('\0'))
        {
            return Err(bad(format!(
                "aggregate type (1 to 200 bytes) and id (1 to 500 bytes) must not be empty or hold NUL, got {kind:?} {id:?}"
            )));
        }
        for (k, v) in &self.headers {
            let name_ok = !k.is_empty()
                && k.bytes().all(|b| b.is_ascii_graphic() && b != b':')
                && !k.to_ascii_lowercase().starts_with("jobq-")
                && !k.eq_ignore_ascii_case("nats-msg-id");
            if !name_ok || v.contains(['\r', '\n', '\0']) {
                return Err(bad(format!(
                    "header {k:?} is not allowed: names are visible ASCII without ':', not `Jobq-*` or `Nats-Msg-Id`; values have no line breaks or NUL"
                )));
            }
        }
        let headers = if self.headers.is_empty() {
            None
        } else {
            Some(
                serde_json::to_string(&self.headers)
                    .map_err(|e| bad(format!("headers of event `{t}`: {e}")))?,
            )
        };
        let (aggregate_type, aggregate_id, aggregate_version) = match self.aggregate {
            Some((k, i, v)) => (Some(k), Some(i), v),
            None => (None, None, None),
        };
        Ok(store::NewEvent {
            id: self.id,
            event_type: self.event_type,
            aggregate_type,
            aggregate_id,
            aggregate_version,
            payload,
            headers,
        })
    }
}

/// `event` as a parameter for `jobq.publish(event jsonb)`, so a statement the caller
/// sends anyway writes the event too, with no round trip of its own:
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), jobq::Error> {
/// use jobq::outbox::{self, Event};
///
/// let event = Event::new("order_paid", &serde_json::json!({ "order_id": 123 }))
///     .aggregate("order", 123, 7);
/// let mut tx = pool.begin().await?;
/// let id: outbox::Uuid =
///     sqlx::query_scalar("UPDATE orders SET paid = true WHERE id = $1 RETURNING jobq.publish($2)")
///         .bind(123_i64)
///         .bind(outbox::param(&event)?)
///         .fetch_one(&mut *tx)
///         .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// The row is the one [`publish`] writes (with a plain `INSERT` of the same columns),
/// with the same trace headers. The event exists only if the statement returns a row for
/// it and the transaction commits: an `UPDATE … RETURNING` that matches no row publishes
/// nothing. An event that goes out with a job can ride the enqueue instead
/// ([`EnqueueBuilder::publish`](crate::EnqueueBuilder::publish)), with no SQL to write.
///
/// # Errors
///
/// [`Error::Invalid`], as [`publish`]. `jobq.publish` checks the same rules again for
/// events written by hand in SQL; [`rejection`] classifies its errors.
pub fn param(event: &Event) -> Result<EventParam, Error> {
    Ok(event.clone().validate()?.to_param())
}

/// The classified error behind `err` when `jobq.publish` rejected an event (SQLSTATE
/// 22023, schema `jobq`, the code as the constraint name): [`Error::Invalid`] with code
/// `invalid_event` or `payload_too_large`. `None` for any other error.
pub fn rejection(err: &sqlx::Error) -> Option<Error> {
    store::publish_rejection(err)
}

/// A typed event: its type declared once, its aggregate read from its fields.
/// `#[derive(jobq::Event)]` writes it; anything implementing it can be passed to
/// [`publish`].
pub trait EventData: Serialize {
    /// The event type, `order_paid`.
    const EVENT_TYPE: &'static str;

    /// The aggregate (type, id, version) this value belongs to, if any.
    fn aggregate(&self) -> Option<(&'static str, String, i64)> {
        None
    }

    /// This value as an [`Event`].
    fn to_event(&self) -> Event {
        let e = Event::new(Self::EVENT_TYPE, self);
        match self.aggregate() {
            Some((kind, id, version)) => e.aggregate(kind, id, version),
            None => e,
        }
    }
}

/// What [`publish`] accepts: an [`Event`], or a value whose type implements
/// [`EventData`] (by `#[derive(jobq::Event)]`).
pub trait IntoEvent {
    /// The event.
    fn into_event(self) -> Event;
}

impl IntoEvent for Event {
    fn into_event(self) -> Event {
        self
    }
}

impl<T: EventData> IntoEvent for &T {
    fn into_event(self) -> Event {
        self.to_event()
    }
}

/// A connection inside the caller's transaction: `&mut tx`, or `&mut PgConnection` /
/// `&mut PoolConnection` on which the caller opened one. Not a pool: an event written
/// outside the business change's transaction would lose the outbox's guarantee.
#[derive(Debug)]
pub struct TxConn<'c>(&'c mut PgConnection);

impl<'c> From<&'c mut Transaction<'_, Postgres>> for TxConn<'c> {
    fn from(tx: &'c mut Transaction<'_, Postgres>) -> Self {
        TxConn(&mut *tx)
    }
}

impl<'c> From<&'c mut PgConnection> for TxConn<'c> {
    fn from(conn: &'c mut PgConnection) -> Self {
        TxConn(conn)
    }
}

impl<'c> From<&'c mut PoolConnection<Postgres>> for TxConn<'c> {
    fn from(conn: &'c mut PoolConnection<Postgres>) -> Self {
        TxConn(&mut *conn)
    }
}

/// Writes `event` to `jobq.outbox` in the caller's transaction; the runtime's relay
/// publishes it after the transaction commits. Returns the event id.
///
/// # Errors
///
/// [`Error::Invalid`] (codes `invalid_event`, `event_payload_not_serializable`,
/// `payload_too_large`, `nul_in_payload`) before anything reaches the database;
/// [`Error::Database`] when the insert fails.
pub async fn publish<'c>(
    conn: impl Into<TxConn<'c>>,
    event: impl IntoEvent,
) -> Result<Uuid, Error> {
    let e = event.into_event().validate()?;
    store::outbox_insert(conn.into().0, std::slice::from_ref(&e)).await?;
    Ok(e.id)
}

/// Writes every event in one statement, in order, in the caller's transaction. Returns
/// their ids in order.
///
/// # Errors
///
/// As [`publish`]; nothing is written when any event is rejected.
pub async fn publish_many<'c, I>(conn: impl Into<TxConn<'c>>, events: I) -> Result<Vec<Uuid>, Error>
where
    I: IntoIterator,
    I::Item: IntoEvent,
{
    let rows = events
        .into_iter()
        .map(|e| e.into_event().validate())
        .collect::<Result<Vec<_>, _>>()?;
    let ids = rows.iter().map(|r| r.id).collect();
    store::outbox_insert(conn.into().0, &rows).await?;
    Ok(ids)
}

/// The outbox in [`stats`](crate::stats::Stats): lag per event type and publish failures.
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Unpublished events per event type, oldest first.
    pub lag: Vec<OutboxLag>,
    /// Unpublished events whose last publish failed, by error code, most first.
    pub failures: Vec<PublishFailures>,
}

/// [`OutboxStats`] now.
///
/// # Errors
///
/// [`Error::Database`].
pub async fn stats(pool: &sqlx::PgPool) -> Result<OutboxStats, Error> {
    Ok(OutboxStats {
        lag: lag(pool).await?,
        failures: failure_codes(pool).await?,
    })
}

/// Unpublished events per event type: how many, and the oldest one's age (what
/// `jobq status` shows as outbox lag).
///
/// # Errors
///
/// [`Error::Database`].
pub async fn lag(pool: &sqlx::PgPool) -> Result<Vec<OutboxLag>, Error> {
    store::outbox_lag(pool).await
}

/// Unpublished events whose last publish failed, counted by error code.
///
/// # Errors
///
/// [`Error::Database`].
pub async fn failure_codes(pool: &sqlx::PgPool) -> Result<Vec<PublishFailures>, Error> {
    store::outbox_failure_codes(pool).await
}

/// Stuck events: unpublished and older than `older_than`, or with a failed publish,
/// oldest first, at most `limit` (what `jobq outbox` lists).
///
/// # Errors
///
/// [`Error::Database`].
pub async fn stuck(
    pool: &sqlx::PgPool,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<Vec<StuckEvent>, Error> {
    store::outbox_stuck(pool, older_than.as_secs_f64(), limit).await
}

/// Replays event `id`: marks it unpublished and due now, so a relay sends it again (under
/// the same id), and writes an `outbox_replay` row to `jobq.job_audit` with `actor` and
/// `reason` in the same statement.
///
/// # Errors
///
/// [`Error::NotFound`] when no such event exists (it may have been pruned);
/// [`Error::Database`].
pub async fn replay(
    pool: &sqlx::PgPool,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    if store::outbox_replay(&mut conn, id, actor, reason).await? {
        Ok(())
    } else {
        Err(Error::NotFound {
            what: "event",
            name: id.to_string(),
        })
    }
}
