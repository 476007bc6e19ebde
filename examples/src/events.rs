//! Events with the transactional outbox and the inbox, through a real broker.
//!
//! The shop marks orders paid: each payment updates the order row and publishes an
//! `order_paid` event in the same transaction (`jobq::outbox::publish`). The runtime's
//! relay sends the events to the broker and marks them published only after the broker
//! acknowledged them. A billing consumer reads them back, applies each once through the
//! inbox (`jobq::inbox::apply`) and, in the same transaction, enqueues a `send_receipt`
//! job; it acknowledges the delivery only after that transaction committed. Then the
//! awkward cases: with NATS, the consumer "dies" between its commit and its ack, JetStream
//! delivers the event again and the inbox calls it a duplicate; an operator's re-send
//! (`jobq::outbox::replay`) carries the same `Nats-Msg-Id`, which JetStream's dedupe
//! window drops. With RabbitMQ, which has no such window, the re-send is delivered and the
//! inbox calls it a duplicate. Either way no second receipt goes out.
//!
//! ```text
//! cargo run -p examples --bin events -- nats       # NATS JetStream on 127.0.0.1:4222 (NATS_URL)
//! cargo run -p examples --bin events -- rabbitmq   # RabbitMQ on 127.0.0.1:5672 (AMQP_URL)
//! ```
//!
//! It uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and creates
//! its own database `jobq_events_example`; on the broker, a stream `JOBQ_EXAMPLE` (NATS)
//! or an exchange and queue `jobq_example` (RabbitMQ), deleted at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use jobq::inbox::{self, Delivery, Outcome};
use jobq::outbox::{self, Relay};
use jobq::{JobContext, JobError, Runtime};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

const ORDERS: i64 = 10;
const NAME: &str = "jobq_example";
const STREAM: &str = "JOBQ_EXAMPLE";

/// The event: its type and aggregate are declared once, here.
#[derive(Debug, Serialize, jobq::Event)]
#[event(type = "order_paid", aggregate = order_id, version = version)]
pub struct OrderPaid {
    /// The order (the aggregate's id).
    pub order_id: i64,
    /// The order's version after the payment.
    pub version: i64,
    /// What was paid.
    pub amount_cents: i64,
}

/// The receipt job the consumer enqueues for each new event.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReceiptArgs {
    /// The order.
    pub order_id: i64,
}

#[jobq::job(kind = "example_send_receipt", idempotency = order_id)]
async fn send_receipt(ctx: JobContext, args: ReceiptArgs) -> Result<(), JobError> {
    let sent = ctx
        .state::<Arc<AtomicU64>>()
        .ok_or_else(|| JobError::permanent("no_state", "the runtime holds no receipt counter"))?;
    sent.fetch_add(1, Ordering::Relaxed);
    tracing::info!(order_id = args.order_id, "receipt sent");
    Ok(())
}

/// Marks order `id` paid and publishes its event, in one transaction.
async fn pay(pool: &PgPool, id: i64, amount_cents: i64) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let version: i64 = sqlx::query_scalar(
        "UPDATE orders SET status = 'paid', version = version + 1 WHERE id = $1 RETURNING version",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    let event = OrderPaid {
        order_id: id,
        version,
        amount_cents,
    };
    outbox::publish(&mut tx, &event).await?;
    tx.commit().await?;
    Ok(())
}

/// What the consumer saw.
#[derive(Debug, Default)]
struct Tally {
    new: u64,
    duplicate: u64,
    stale: u64,
}

impl Tally {
    fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::New => self.new += 1,
            Outcome::Duplicate => self.duplicate += 1,
            Outcome::Stale { .. } => self.stale += 1,
        }
    }
}

/// The consumer's transaction: the inbox row and the job commit together.
async fn apply(
    pool: &PgPool,
    delivery: &Delivery,
) -> anyhow::Result<(Outcome, sqlx::Transaction<'static, sqlx::Postgres>)> {
    let mut tx = pool.begin().await?;
    let outcome = inbox::apply(&mut tx, delivery).await?;
    if outcome.is_new() {
        let (_, order, _) = delivery.aggregate_version().context("an order event")?;
        SendReceipt::enqueue(
            &mut tx,
            ReceiptArgs {
                order_id: order.parse()?,
            },
        )
        .await?;
    }
    Ok((outcome, tx))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,events=info".into()),
        )
        .init();
    let broker = std::env::args().nth(1).unwrap_or_else(|| "nats".to_owned());
    let pool = examples::fresh_database("jobq_events_example", 10).await?;
    jobq::migrate(&pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, version bigint NOT NULL);
         INSERT INTO orders SELECT g, 'open', 0 FROM generate_series(1, 10) g;",
    )
    .execute(&pool)
    .await?;

    let sent = Arc::new(AtomicU64::new(0));
    let tally = match broker.as_str() {
        "nats" => run_nats(&pool, &sent).await?,
        "rabbitmq" => run_rabbitmq(&pool, &sent).await?,
        other => bail!("unknown broker `{other}`: nats or rabbitmq"),
    };
    println!(
        "{broker}: {} events applied once, {} duplicate(s) and {} stale delivery(ies) rejected by the inbox, {} receipts sent",
        tally.new,
        tally.duplicate,
        tally.stale,
        sent.load(Ordering::Relaxed)
    );
    if tally.new != ORDERS as u64 || sent.load(Ordering::Relaxed) != ORDERS as u64 {
        bail!("expected {ORDERS} events and receipts");
    }
    Ok(())
}

/// The runtime with the relay `relay`, serving the receipt job.
async fn start(
    pool: &PgPool,
    relay: Relay,
    sent: &Arc<AtomicU64>,
) -> anyhow::Result<jobq::RuntimeHandle> {
    Ok(Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<SendReceipt>()
        .state(sent.clone())
        .relay(relay.poll_interval(Duration::from_millis(50)))
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?)
}

/// Pays every order.
async fn pay_all(pool: &PgPool) -> anyhow::Result<()> {
    for id in 1..=ORDERS {
        pay(pool, id, 1_000 + id).await?;
    }
    Ok(())
}

/// Sends the first event again, as an operator would after a relay crash.
async fn replay_first(pool: &PgPool) -> anyhow::Result<()> {
    let id: outbox::Uuid = sqlx::query_scalar("SELECT id FROM jobq.outbox ORDER BY id LIMIT 1")
        .fetch_one(pool)
        .await?;
    outbox::replay(
        pool,
        id,
        "example",
        Some("show that the inbox absorbs a re-send"),
    )
    .await?;
    Ok(())
}

async fn run_nats(pool: &PgPool, sent: &Arc<AtomicU64>) -> anyhow::Result<Tally> {
    use async_nats::jetstream::{self, consumer, stream};
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url)
        .await
        .with_context(|| format!("NATS does not answer on {url}"))?;
    let js = jetstream::new(client.clone());
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_owned(),
            subjects: vec!["example.orders.>".to_owned()],
            ..Default::default()
        })
        .await?;
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await?;
    let relay = Relay::nats(client, |e| {
        let order = e.aggregate.as_ref().map_or("none", |a| a.id.as_str());
        format!("example.orders.{order}")
    });
    let runtime = start(pool, relay, sent).await?;
    pay_all(pool).await?;

    let mut tally = Tally::default();
    let mut messages = consumer.messages().await?;
    let mut acked_first = false;
    while tally.new < ORDERS as u64 || tally.duplicate == 0 {
        let msg = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .context("no event within 30 s")?
            .context("the subscription ended")??;
        let delivery = Delivery::from_nats("billing", &msg)?;
        let (outcome, tx) = apply(pool, &delivery).await?;
        tally.count(&outcome);
        if !acked_first {
            // As if the consumer died after its commit and before its ack: JetStream
            // delivers the event again after `ack_wait`, and the inbox calls it a duplicate.
            tx.commit().await?;
            acked_first = true;
            continue;
        }
        inbox::commit_and_ack_nats(tx, &msg).await?; // only after the commit
    }
    // An operator's re-send goes out under the same `Nats-Msg-Id`: JetStream's dedupe
    // window drops it, so the stream still holds one message per event.
    replay_first(pool).await?;
    while !outbox::stuck(pool, Duration::ZERO, 1).await?.is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = js.get_stream(STREAM).await?.info().await?.state.messages;
    println!(
        "nats: the replayed event was sent again; the stream holds {held} messages for {ORDERS} events"
    );
    wait_for_receipts(sent).await?;
    runtime.shutdown().await;
    js.delete_stream(STREAM).await?;
    Ok(tally)
}

async fn run_rabbitmq(pool: &PgPool, sent: &Arc<AtomicU64>) -> anyhow::Result<Tally> {
    use lapin::options::{
        BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::FieldTable;
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ does not answer on {url}"))?;
    let ch = conn.create_channel().await?;
    ch.exchange_declare(
        NAME.into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(NAME.into(), durable, FieldTable::default())
        .await?;
    ch.queue_bind(
        NAME.into(),
        NAME.into(),
        "order_paid.#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let relay = Relay::rabbitmq(conn.create_channel().await?, NAME, |e| {
        let order = e.aggregate.as_ref().map_or("none", |a| a.id.as_str());
        format!("{}.{order}", e.event_type)
    });
    let runtime = start(pool, relay, sent).await?;
    pay_all(pool).await?;

    let mut deliveries = ch
        .basic_consume(
            NAME.into(),
            "billing".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut tally = Tally::default();
    let mut replayed = false;
    while tally.new < ORDERS as u64 || tally.duplicate == 0 {
        let d = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
            .await
            .context("no event within 30 s")?
            .context("the consumer ended")??;
        let delivery = Delivery::from_amqp("billing", &d)?;
        let (outcome, tx) = apply(pool, &delivery).await?;
        tally.count(&outcome);
        inbox::commit_and_ack_amqp(tx, &d).await?; // only after the commit
        if tally.new == ORDERS as u64 && !replayed {
            replay_first(pool).await?;
            replayed = true;
        }
    }
    wait_for_receipts(sent).await?;
    runtime.shutdown().await;
    ch.queue_delete(NAME.into(), QueueDeleteOptions::default())
        .await?;
    ch.exchange_delete(NAME.into(), ExchangeDeleteOptions::default())
        .await?;
    Ok(tally)
}

async fn wait_for_receipts(sent: &AtomicU64) -> anyhow::Result<()> {
    for _ in 0..600 {
        if sent.load(Ordering::Relaxed) >= ORDERS as u64 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the receipts were not all sent within 30 s")
}
