//! The inbox: a consumer applies each event once, in its own transaction.
//!
//! The protocol: validate the delivery ([`Delivery::from_nats`], [`Delivery::from_amqp`]),
//! open a transaction, [`apply`] it — which records `(consumer, event_id)` and, for a
//! versioned aggregate, raises the last applied version in one statement — do the effect
//! (or enqueue a job) in the same transaction when it is [`Outcome::New`], commit, and
//! only then acknowledge the delivery ([`commit_and_ack_nats`], [`commit_and_ack_amqp`]).
//! A crash before the commit leaves nothing and the broker redelivers; a crash after it
//! redelivers an event the inbox now calls [`Outcome::Duplicate`].
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool, delivery: jobq::inbox::Delivery) -> Result<(), jobq::Error> {
//! let mut tx = pool.begin().await?;
//! if jobq::inbox::apply(&mut tx, &delivery).await?.is_new() {
//!     // the effect, in `tx`: update a read model, enqueue a job, ...
//! }
//! tx.commit().await?; // then acknowledge the delivery
//! # Ok(()) }
//! ```

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::TxConn;
use crate::error::Error;
use crate::store;

/// What [`apply`] made of a delivery.
pub use crate::store::InboxOutcome as Outcome;

impl Outcome {
    /// Whether the event is new to this consumer: apply its effect.
    pub fn is_new(&self) -> bool {
        matches!(self, Outcome::New)
    }
}

/// A delivery as the inbox sees it: which consumer, which event, and the event's
/// aggregate and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    consumer: String,
    event_id: Uuid,
    event_type: Option<String>,
    aggregate: Option<(String, String, Option<i64>)>,
}

fn bad(message: impl Into<String>) -> Error {
    Error::invalid("invalid_delivery", message)
}

fn parse_id(text: Option<&str>, from: &str) -> Result<Uuid, Error> {
    let text = text.ok_or_else(|| bad(format!("the delivery has no {from}")))?;
    Uuid::parse_str(text.trim())
        .map_err(|e| bad(format!("the delivery's {from} {text:?} is not a UUID: {e}")))
}

impl Delivery {
    /// Event `event_id` delivered to `consumer` (a stable name per consuming service).
    pub fn new(consumer: impl Into<String>, event_id: Uuid) -> Delivery {
        Delivery {
            consumer: consumer.into(),
            event_id,
            event_type: None,
            aggregate: None,
        }
    }

    /// The event's aggregate and version: the inbox rejects a version at or below the
    /// last one this consumer applied for the aggregate.
    pub fn aggregate(
        mut self,
        kind: impl Into<String>,
        id: impl Into<String>,
        version: i64,
    ) -> Delivery {
        self.aggregate = Some((kind.into(), id.into(), Some(version)));
        self
    }

    /// The consumer.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// The event id.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// The event type, when the delivery carried it.
    pub fn event_type(&self) -> Option<&str> {
        self.event_type.as_deref()
    }

    /// The aggregate's type and id and the event's version, when it carried them.
    pub fn aggregate_version(&self) -> Option<(&str, &str, Option<i64>)> {
        self.aggregate
            .as_ref()
            .map(|(k, i, v)| (k.as_str(), i.as_str(), *v))
    }

    /// A delivery from any broker: `message_id` is the event id the relay set, `header`
    /// reads the `Jobq-*` headers (see [`headers`](super::headers)) by name. For sinks of
    /// your own; [`from_nats`](Self::from_nats) and [`from_amqp`](Self::from_amqp) call it.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] (`invalid_delivery`) when the id is missing or not a UUID, or
    /// the version is not a number.
    pub fn from_headers(
        consumer: impl Into<String>,
        message_id: Option<&str>,
        header: impl Fn(&str) -> Option<String>,
    ) -> Result<Delivery, Error> {
        let id = parse_id(message_id, "message id")?;
        Delivery::new(consumer, id).with_headers(header)
    }

    fn with_headers(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Delivery, Error> {
        use super::headers::*;
        self.event_type = get(EVENT_TYPE);
        if let (Some(kind), Some(id)) = (get(AGGREGATE_TYPE), get(AGGREGATE_ID)) {
            let version = match get(AGGREGATE_VERSION) {
                Some(v) => Some(v.trim().parse::<i64>().map_err(|e| {
                    bad(format!(
                        "the delivery's {AGGREGATE_VERSION} {v:?} is not a number: {e}"
                    ))
                })?),
                None => None,
            };
            self.aggregate = Some((kind, id, version));
        }
        Ok(self)
    }

    /// A JetStream message the relay published: the event id from `Nats-Msg-Id`, the
    /// type and aggregate from the `Jobq-*` headers.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with code `invalid_delivery` when the message has no event id
    /// or a malformed version: acknowledge or terminate it, it will never apply.
    #[cfg(feature = "nats")]
    pub fn from_nats(
        consumer: impl Into<String>,
        msg: &async_nats::Message,
    ) -> Result<Delivery, Error> {
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let id = parse_id(
            header(async_nats::header::NATS_MESSAGE_ID.as_ref()).as_deref(),
            "Nats-Msg-Id header",
        )?;
        Delivery::new(consumer, id).with_headers(header)
    }

    /// An AMQP delivery the relay published: the event id from `message_id`, the type
    /// and aggregate from the `Jobq-*` headers.
    ///
    /// # Errors
    ///
    /// As [`Delivery::from_nats`].
    #[cfg(feature = "rabbitmq")]
    pub fn from_amqp(
        consumer: impl Into<String>,
        d: &lapin::message::Delivery,
    ) -> Result<Delivery, Error> {
        use lapin::types::AMQPValue;
        let id = parse_id(
            d.properties.message_id().as_ref().map(|s| s.as_str()),
            "message_id",
        )?;
        let table = d.properties.headers().clone().unwrap_or_default();
        let header = move |name: &str| {
            table.inner().get(name).and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
                AMQPValue::LongLongInt(n) => Some(n.to_string()),
                AMQPValue::LongInt(n) => Some(n.to_string()),
                _ => None,
            })
        };
        Delivery::new(consumer, id).with_headers(header)
    }
}

/// Records `delivery` in `jobq.inbox` in the caller's transaction and says whether it is
/// new; with a version, also rejects a version at or below the last one applied for its
/// aggregate ([`Outcome::Stale`]), in the same statement. A concurrent transaction
/// applying the same event makes this wait for it, then report it.
///
/// # Errors
///
/// [`Error::Database`].
pub async fn apply<'c>(conn: impl Into<TxConn<'c>>, delivery: &Delivery) -> Result<Outcome, Error> {
    let agg = delivery
        .aggregate
        .as_ref()
        .map(|(k, i, v)| (k.as_str(), i.as_str(), *v));
    store::inbox_apply(conn.into().0, &delivery.consumer, delivery.event_id, agg).await
}

/// Commits `tx`, then acknowledges `msg` to JetStream: the order that makes a crash
/// cost a redelivery (absorbed by the inbox), never a lost effect.
///
/// # Errors
///
/// [`Error::Database`] when the commit fails (the message is not acknowledged and will be
/// redelivered); [`Error::Broker`] (`nats_ack`) when the acknowledgement fails after the
/// commit (the redelivery will be a [`Outcome::Duplicate`]).
#[cfg(feature = "nats")]
pub async fn commit_and_ack_nats(
    tx: Transaction<'_, Postgres>,
    msg: &async_nats::jetstream::Message,
) -> Result<(), Error> {
    tx.commit().await?;
    msg.ack().await.map_err(|e| Error::Broker {
        code: "nats_ack",
        message: e.to_string(),
    })
}

/// Commits `tx`, then acknowledges `delivery` to RabbitMQ.
///
/// # Errors
///
/// As [`commit_and_ack_nats`], with code `amqp_ack`.
#[cfg(feature = "rabbitmq")]
pub async fn commit_and_ack_amqp(
    tx: Transaction<'_, Postgres>,
    delivery: &lapin::message::Delivery,
) -> Result<(), Error> {
    tx.commit().await?;
    delivery
        .ack(lapin::options::BasicAckOptions::default())
        .await
        .map(drop)
        .map_err(|e| Error::Broker {
            code: "amqp_ack",
            message: e.to_string(),
        })
}
