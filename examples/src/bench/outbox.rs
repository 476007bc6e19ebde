//! The outbox rows: what `outbox::publish` adds to the transaction that enqueues, and how
//! many events per second a relay moves to each real broker (NATS JetStream on
//! `NATS_URL`, default 127.0.0.1:4222; RabbitMQ on `AMQP_URL`, default guest@127.0.0.1).
//! A broker that does not answer is reported and its rows skipped.

use std::time::Instant;

use anyhow::Context;
use jobq::Job;
use jobq::outbox::{self, Event, OutboxEvent, Relay};

use crate::report::{Report, Target};
use crate::util::{BenchDb, Noop, Samples};
use crate::{Settings, progress};

/// Aggregates the events are spread over (the relay keeps each one's order, so one
/// aggregate is relayed by one relay at a time).
const AGGREGATES: usize = 5_000;

pub(crate) async fn outbox(s: &Settings, db: &BenchDb, r: &mut Report) -> anyhow::Result<()> {
    tx_cost(s, db, r).await?;
    let events = if s.quick { 2_000 } else { 20_000 };
    for relays in [1, 4] {
        match nats_sink().await {
            Ok((client, js, stream)) => {
                let subject = format!("{stream}.all");
                let mut rates = Samples::default();
                for _ in 0..s.reps {
                    let sinks = (0..relays)
                        .map(|_| {
                            let subject = subject.clone();
                            Relay::nats(client.clone(), move |_: &OutboxEvent| subject.clone())
                        })
                        .collect();
                    rates.push(relay_rate(db, sinks, events).await?);
                }
                js.delete_stream(&stream).await?;
                r.cost(
                    &format!("outbox relay → NATS JetStream (publish ack), {relays} relay(s), {AGGREGATES} aggregates"),
                    rates,
                    "events/s",
                    vec![],
                );
            }
            Err(e) => eprintln!("  ! NATS rows skipped: {e:#}"),
        }
        match amqp_sink().await {
            Ok((conn, ch, name)) => {
                let mut rates = Samples::default();
                for _ in 0..s.reps {
                    let mut sinks = Vec::new();
                    for _ in 0..relays {
                        sinks.push(Relay::rabbitmq(
                            conn.create_channel().await?,
                            name.clone(),
                            |_: &OutboxEvent| "all".to_owned(),
                        ));
                    }
                    rates.push(relay_rate(db, sinks, events).await?);
                }
                use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
                ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                    .await?;
                r.cost(
                    &format!("outbox relay → RabbitMQ (publisher confirms), {relays} relay(s), {AGGREGATES} aggregates"),
                    rates,
                    "events/s",
                    vec![],
                );
            }
            Err(e) => eprintln!("  ! RabbitMQ rows skipped: {e:#}"),
        }
    }
    Ok(())
}

/// How the enqueueing transaction carries its event in [`tx_cost`].
#[derive(Clone, Copy, PartialEq)]
enum Carry {
    /// No event.
    Nothing,
    /// `outbox::publish`: one more statement.
    Publish,
    /// `RETURNING jobq.publish($2)` on the business row's INSERT: no statement of its own.
    RideAlong,
    /// `.publish(event)` on the enqueue: the row in a CTE of the job's insert.
    RideEnqueue,
}

/// The enqueueing transaction (a business row written, one job enqueued, commit) without
/// an event, with an `outbox::publish` in it, with the event riding along the business
/// row's INSERT, and with it riding the enqueue, in alternating rounds on one connection
/// each, so the ratios compare them under the same commit latency.
async fn tx_cost(s: &Settings, db: &BenchDb, r: &mut Report) -> anyhow::Result<()> {
    progress("outbox: cost on the enqueueing transaction");
    let pool = db.new_pool(2).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_orders;
         CREATE TABLE bench_orders (id bigserial PRIMARY KEY, amount bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;
    const CARRIES: [Carry; 4] = [
        Carry::Nothing,
        Carry::Publish,
        Carry::RideAlong,
        Carry::RideEnqueue,
    ];
    let mut samples: [Samples; 4] = Default::default();
    for _ in 0..s.reps {
        db.reset().await?;
        sqlx::raw_sql("TRUNCATE jobq.outbox; TRUNCATE bench_orders")
            .execute(&pool)
            .await?;
        let round = (s.singles / 10).max(1);
        let mut took = [0.0; 4];
        for n in 0..10 {
            for (k, carry) in CARRIES.into_iter().enumerate() {
                let start = Instant::now();
                for i in 0..round {
                    let seq = (n * round + i) as u64;
                    let event = || {
                        Event::new("order_paid", &seq)
                            .aggregate_unversioned("order", seq % AGGREGATES as u64)
                    };
                    let mut tx = pool.begin().await?;
                    if carry == Carry::RideAlong {
                        sqlx::query(
                            "INSERT INTO bench_orders (amount) VALUES ($1) RETURNING jobq.publish($2)",
                        )
                        .bind(seq as i64)
                        .bind(outbox::param(&event())?)
                        .fetch_one(&mut *tx)
                        .await?;
                    } else {
                        sqlx::query("INSERT INTO bench_orders (amount) VALUES ($1)")
                            .bind(seq as i64)
                            .execute(&mut *tx)
                            .await?;
                    }
                    if carry == Carry::RideEnqueue {
                        Noop::with(seq).publish(event()).enqueue(&mut tx).await?;
                    } else {
                        Noop::enqueue(&mut tx, seq).await?;
                    }
                    if carry == Carry::Publish {
                        outbox::publish(&mut tx, event()).await?;
                    }
                    tx.commit().await?;
                }
                took[k] += start.elapsed().as_secs_f64();
            }
        }
        for k in 0..4 {
            samples[k].push((10 * round) as f64 / took[k]);
        }
    }
    pool.close().await;
    let [plain, with, riding, enqueued] = samples;
    r.ceiling(
        "enqueue_tx",
        "enqueueing transaction: INSERT a business row + enqueue + COMMIT (1 client)",
        plain,
    );
    r.jobq(
        "  the same transaction + outbox::publish of one event",
        with,
        Some("enqueue_tx"),
        vec![Target::ratio_at_least(0.9)],
    );
    r.jobq(
        "  the same transaction, the event riding the INSERT (RETURNING jobq.publish($2))",
        riding,
        Some("enqueue_tx"),
        vec![Target::ratio_at_least(0.9)],
    );
    r.jobq(
        "  the same transaction, the event riding the enqueue (.publish(event))",
        enqueued,
        Some("enqueue_tx"),
        vec![Target::ratio_at_least(0.9)],
    );
    Ok(())
}

/// Fills the outbox with `events` events over [`AGGREGATES`] aggregates, then runs
/// `relays` side by side (each `run_once` in a loop) until none is unpublished. Returns
/// events per second.
async fn relay_rate(db: &BenchDb, relays: Vec<Relay>, events: usize) -> anyhow::Result<f64> {
    progress(&format!(
        "outbox: relaying {events} events with {} relay(s)",
        relays.len()
    ));
    let pool = db.new_pool(2 + relays.len() as u32).await?;
    sqlx::query("TRUNCATE jobq.outbox").execute(&pool).await?;
    let mut tx = pool.begin().await?;
    for chunk in (0..events).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<Event> = chunk
            .iter()
            .map(|i| Event::new("bench_event", i).aggregate_unversioned("order", i % AGGREGATES))
            .collect();
        outbox::publish_many(&mut tx, batch).await?;
    }
    tx.commit().await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for relay in relays {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let report = relay.run_once(&pool).await?;
                let left: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM jobq.outbox WHERE published_at IS NULL",
                )
                .fetch_one(&pool)
                .await?;
                if left == 0 {
                    return anyhow::Ok(());
                }
                if report.failed > 0 {
                    anyhow::bail!("the broker refused {} event(s)", report.failed);
                }
                if report.claimed == 0 {
                    // The others hold what is left.
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let rate = events as f64 / start.elapsed().as_secs_f64();
    pool.close().await;
    Ok(rate)
}

/// A JetStream stream of this run's own.
async fn nats_sink() -> anyhow::Result<(async_nats::Client, async_nats::jetstream::Context, String)>
{
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url)
        .await
        .with_context(|| format!("NATS does not answer on {url}"))?;
    let js = async_nats::jetstream::new(client.clone());
    let name = format!("JOBQ_BENCH_{}", std::process::id());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await?;
    Ok((client, js, name))
}

/// A durable exchange and queue of this run's own, bound with `#`.
async fn amqp_sink() -> anyhow::Result<(lapin::Connection, lapin::Channel, String)> {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ does not answer on {url}"))?;
    let ch = conn.create_channel().await?;
    let name = format!("jobq_bench_{}", std::process::id());
    ch.exchange_declare(
        name.as_str().into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await?;
    ch.queue_declare(
        name.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await?;
    ch.queue_bind(
        name.as_str().into(),
        name.as_str().into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    Ok((conn, ch, name))
}
