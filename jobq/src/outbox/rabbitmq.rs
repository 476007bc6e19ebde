//! The RabbitMQ sink (`rabbitmq` feature): publisher confirms on the channel, each event
//! persistent (delivery mode 2), mandatory, `message_id` = event id, `type` = event type,
//! the aggregate in headers. Publishes of one call are pipelined, then every confirm is
//! awaited; a nack, an unroutable return or a channel error is a failure.

use std::fmt;
use std::sync::Arc;

use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tokio::sync::OnceCell;

use super::relay::{Sink, SinkError};
use super::{OutboxEvent, headers};

type RoutingFn = dyn Fn(&OutboxEvent) -> String + Send + Sync;

/// Publishes outbox events to a RabbitMQ exchange with publisher confirms.
#[derive(Clone)]
pub struct RabbitSink {
    channel: Channel,
    exchange: String,
    routing_key: Arc<RoutingFn>,
    mandatory: bool,
    confirming: Arc<OnceCell<()>>,
}

impl fmt::Debug for RabbitSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSink")
            .field("exchange", &self.exchange)
            .field("mandatory", &self.mandatory)
            .finish_non_exhaustive()
    }
}

impl RabbitSink {
    /// A sink publishing to `exchange` with routing key `routing_key(event)` on `channel`,
    /// which it puts in confirm mode before its first publish.
    pub fn new(
        channel: Channel,
        exchange: impl Into<String>,
        routing_key: impl Fn(&OutboxEvent) -> String + Send + Sync + 'static,
    ) -> RabbitSink {
        RabbitSink {
            channel,
            exchange: exchange.into(),
            routing_key: Arc::new(routing_key),
            mandatory: true,
            confirming: Arc::new(OnceCell::new()),
        }
    }

    /// Whether an event no queue is bound to receive counts as a failure (default
    /// `true`: it stays in the outbox until a queue is bound, rather than being dropped by
    /// the exchange).
    pub fn mandatory(mut self, yes: bool) -> RabbitSink {
        self.mandatory = yes;
        self
    }

    /// The AMQP properties of `e`'s message.
    pub fn properties(e: &OutboxEvent) -> BasicProperties {
        let mut h = FieldTable::default();
        for (k, v) in &e.headers {
            h.insert(k.as_str().into(), AMQPValue::LongString(v.as_str().into()));
        }
        h.insert(
            headers::EVENT_TYPE.into(),
            AMQPValue::LongString(e.event_type.as_str().into()),
        );
        if let Some(a) = &e.aggregate {
            h.insert(
                headers::AGGREGATE_TYPE.into(),
                AMQPValue::LongString(a.kind.as_str().into()),
            );
            h.insert(
                headers::AGGREGATE_ID.into(),
                AMQPValue::LongString(a.id.as_str().into()),
            );
            if let Some(v) = a.version {
                h.insert(headers::AGGREGATE_VERSION.into(), AMQPValue::LongLongInt(v));
            }
        }
        BasicProperties::default()
            .with_message_id(e.id.to_string().into())
            .with_type(e.event_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(h)
    }
}

fn amqp_error(e: lapin::Error) -> SinkError {
    SinkError::new("amqp_error", e.to_string())
}

#[async_trait::async_trait]
impl Sink for RabbitSink {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), SinkError>> {
        let confirming = self
            .confirming
            .get_or_try_init(|| async {
                self.channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
            })
            .await;
        if let Err(e) = confirming {
            let err = amqp_error(e);
            return events.iter().map(|_| Err(err.clone())).collect();
        }
        let options = BasicPublishOptions {
            mandatory: self.mandatory,
            ..BasicPublishOptions::default()
        };
        let mut pending = Vec::with_capacity(events.len());
        for e in events {
            let sent = self
                .channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    (self.routing_key)(e).into(),
                    options,
                    e.payload.as_bytes(),
                    Self::properties(e),
                )
                .await;
            pending.push(sent);
        }
        let mut results = Vec::with_capacity(events.len());
        for sent in pending {
            let confirmed = match sent {
                Ok(confirm) => confirm.await.map_err(amqp_error),
                Err(e) => Err(amqp_error(e)),
            };
            results.push(match confirmed {
                Ok(Confirmation::Ack(None)) => Ok(()),
                Ok(Confirmation::Ack(Some(returned))) => Err(SinkError::new(
                    "amqp_unroutable",
                    format!(
                        "no queue is bound for routing key `{}` on exchange `{}`",
                        returned.delivery.routing_key, self.exchange
                    ),
                )),
                Ok(Confirmation::Nack(_)) => Err(SinkError::new(
                    "amqp_nack",
                    "the broker refused the message",
                )),
                Ok(Confirmation::NotRequested) => Err(SinkError::new(
                    "amqp_unconfirmed",
                    "publisher confirms are not enabled on the channel",
                )),
                Err(e) => Err(e),
            });
        }
        results
    }
}
