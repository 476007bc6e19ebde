//! The NATS JetStream sink (`nats` feature): publish with `Nats-Msg-Id` = event id, then
//! wait for JetStream's publish ack. Publishes of one call are pipelined: all are sent,
//! then every ack is awaited.

use std::fmt;
use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;

use super::relay::{Sink, SinkError};
use super::{OutboxEvent, headers};

type SubjectFn = dyn Fn(&OutboxEvent) -> String + Send + Sync;

/// Publishes outbox events to NATS JetStream.
#[derive(Clone)]
pub struct NatsSink {
    js: async_nats::jetstream::Context,
    subject: Arc<SubjectFn>,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink").finish_non_exhaustive()
    }
}

impl NatsSink {
    /// A sink publishing each event to `subject(event)` through `client`'s JetStream.
    pub fn new(
        client: async_nats::Client,
        subject: impl Fn(&OutboxEvent) -> String + Send + Sync + 'static,
    ) -> NatsSink {
        NatsSink {
            js: async_nats::jetstream::new(client),
            subject: Arc::new(subject),
        }
    }

    /// The headers of `e`'s message: the event id as `Nats-Msg-Id`, its type and
    /// aggregate, and the headers given at publish time.
    pub fn headers(e: &OutboxEvent) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in &e.headers {
            h.insert(k.as_str(), v.as_str());
        }
        h.insert(
            async_nats::header::NATS_MESSAGE_ID,
            e.id.to_string().as_str(),
        );
        h.insert(headers::EVENT_TYPE, e.event_type.as_str());
        if let Some(a) = &e.aggregate {
            h.insert(headers::AGGREGATE_TYPE, a.kind.as_str());
            h.insert(headers::AGGREGATE_ID, a.id.as_str());
            if let Some(v) = a.version {
                h.insert(headers::AGGREGATE_VERSION, v.to_string().as_str());
            }
        }
        h
    }
}

fn code(kind: PublishErrorKind) -> &'static str {
    match kind {
        PublishErrorKind::StreamNotFound => "nats_stream_not_found",
        PublishErrorKind::TimedOut => "nats_timed_out",
        PublishErrorKind::BrokenPipe => "nats_broken_pipe",
        PublishErrorKind::MaxPayloadExceeded => "nats_max_payload",
        PublishErrorKind::MaxAckPending => "nats_max_ack_pending",
        _ => "nats_publish",
    }
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), SinkError>> {
        let mut pending = Vec::with_capacity(events.len());
        for e in events {
            let sent = self
                .js
                .publish_with_headers(
                    (self.subject)(e),
                    Self::headers(e),
                    e.payload.clone().into_bytes().into(),
                )
                .await;
            pending.push(sent);
        }
        let mut results = Vec::with_capacity(events.len());
        for sent in pending {
            let acked = match sent {
                Ok(ack) => ack.await.map(drop),
                Err(e) => Err(e),
            };
            results.push(acked.map_err(|e| SinkError::new(code(e.kind()), e.to_string())));
        }
        results
    }
}
