//! The transactional outbox and the inbox against the real NATS JetStream (127.0.0.1:4222)
//! and RabbitMQ (127.0.0.1:5672, guest/guest): events commit with the caller's
//! transaction, reach the broker at least once and in per-aggregate order whatever the
//! number of relays, survive a broker that is down and a relay killed between the
//! broker's ack and its bookkeeping, and are applied once through the inbox.
//! Every test uses its own database, stream, exchange and queue names.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use jobq::inbox::{self, Delivery, Outcome};
use jobq::outbox::{self, Event, OutboxEvent, Relay, Uuid};
use jobq_testing::TestDatabase;
use tests::{eventually, init_tracing};

const WAIT: Duration = Duration::from_secs(60);

fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{:06x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>() & 0xff_ffff
    )
}

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into())
}

fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

async fn jetstream() -> (async_nats::Client, jetstream::Context) {
    let client = async_nats::connect(nats_url())
        .await
        .unwrap_or_else(|e| panic!("NATS does not answer on {}: {e}", nats_url()));
    let js = jetstream::new(client.clone());
    (client, js)
}

/// A stream named `name` holding subjects `name.>`.
async fn create_stream(js: &jetstream::Context, name: &str) -> stream::Stream {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("creating stream {name}: {e}"))
}

/// Subject `<stream>.<aggregate id>` for each event.
fn subject_of(stream: &str) -> impl Fn(&OutboxEvent) -> String + Send + Sync + 'static {
    let stream = stream.to_owned();
    move |e: &OutboxEvent| {
        let id = e.aggregate.as_ref().map_or("none", |a| a.id.as_str());
        format!("{stream}.{id}")
    }
}

/// One message as read back from a stream or a queue.
#[derive(Debug, Clone)]
struct Seen {
    id: Uuid,
    aggregate: Option<String>,
    version: Option<i64>,
}

fn nats_seen(h: Option<&async_nats::HeaderMap>) -> Seen {
    let get = |n: &str| h.and_then(|h| h.get(n)).map(|v| v.as_str().to_owned());
    Seen {
        id: Uuid::parse_str(&get("Nats-Msg-Id").expect("Nats-Msg-Id header")).unwrap(),
        aggregate: get(outbox::headers::AGGREGATE_ID),
        version: get(outbox::headers::AGGREGATE_VERSION).map(|v| v.parse().unwrap()),
    }
}

/// Every message in stream `name`, in stream order (waits until at least `expected`).
async fn read_stream(js: &jetstream::Context, name: &str, expected: usize) -> Vec<Seen> {
    let stream = js.get_stream(name).await.unwrap();
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        let mut got = 0;
        while let Some(m) = batch.next().await {
            let m = m.unwrap();
            seen.push(nats_seen(m.headers.as_ref()));
            got += 1;
        }
        if (seen.len() >= expected && got == 0) || tokio::time::Instant::now() > deadline {
            return seen;
        }
    }
}

async fn stream_len(js: &jetstream::Context, name: &str) -> u64 {
    let mut s = js.get_stream(name).await.unwrap();
    s.info().await.unwrap().state.messages
}

async fn unpublished(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobq.outbox WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Asserts each aggregate's versions are strictly increasing in `seen`'s order.
fn assert_per_aggregate_order(seen: &[Seen]) {
    let mut last: HashMap<&str, i64> = HashMap::new();
    for s in seen {
        if let (Some(a), Some(v)) = (s.aggregate.as_deref(), s.version)
            && let Some(prev) = last.insert(a, v)
        {
            assert!(v > prev, "aggregate {a}: version {v} arrived after {prev}");
        }
    }
}

/// `n` versioned events per aggregate `agg-0..aggs`, interleaved.
fn events(aggs: usize, per: i64) -> Vec<Event> {
    let mut out = Vec::new();
    for v in 1..=per {
        for a in 0..aggs {
            out.push(
                Event::new("order_paid", &serde_json::json!({ "a": a, "v": v })).aggregate(
                    "order",
                    format!("agg-{a}"),
                    v,
                ),
            );
        }
    }
    out
}

/// A migrated test database (and its pool), a JetStream connection, and a unique stream
/// name (with the stream, when asked).
type Nats = (
    TestDatabase,
    sqlx::PgPool,
    async_nats::Client,
    jetstream::Context,
    String,
    Option<stream::Stream>,
);

async fn nats_fixture(prefix: &str, with_stream: bool) -> anyhow::Result<Nats> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let (client, js) = jetstream().await;
    let name = unique(prefix);
    let stream = match with_stream {
        true => Some(create_stream(&js, &name).await),
        false => None,
    };
    Ok((db, pool, client, js, name, stream))
}

async fn finish(db: TestDatabase, js: &jetstream::Context, name: &str) {
    let _ = js.delete_stream(name).await;
    db.close().await;
}

async fn drain_relay(relay: &Relay, pool: &sqlx::PgPool) {
    let ok = eventually(WAIT, || async {
        relay.run_once(pool).await.unwrap();
        unpublished(pool).await == 0
    })
    .await;
    assert!(ok, "the outbox did not drain");
}

#[tokio::test]
async fn a_rolled_back_transaction_publishes_nothing() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_rollback", true).await?;

    let mut tx = pool.begin().await?;
    outbox::publish(&mut tx, Event::new("gone", &1).aggregate("order", 1, 1)).await?;
    tx.rollback().await?;
    let mut tx = pool.begin().await?;
    let kept = outbox::publish(&mut tx, Event::new("kept", &2).aggregate("order", 1, 1)).await?;
    tx.commit().await?;

    let relay = Relay::nats(client, subject_of(&name));
    drain_relay(&relay, &pool).await;
    let seen = read_stream(&js, &name, 1).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].id, kept);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.outbox")
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 1);
    finish(db, &js, &name).await;
    Ok(())
}

#[tokio::test]
async fn the_runtime_relays_to_jetstream_with_the_event_id_as_msg_id() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_runtime", true).await?;

    let mut tx = pool.begin().await?;
    let ids = outbox::publish_many(&mut tx, events(5, 10)).await?;
    let loose = outbox::publish(
        &mut tx,
        Event::new("note", &serde_json::json!({"x": 1})).header("traceparent", "00-abc-def-01"),
    )
    .await?;
    tx.commit().await?;

    let handle = jobq::Runtime::builder(pool.clone())
        .auto_register(false)
        .relay(Relay::nats(client, subject_of(&name)))
        .build()?
        .start()
        .await?;
    assert!(
        eventually(WAIT, || async { unpublished(&pool).await == 0 }).await,
        "the runtime's relay did not drain the outbox"
    );
    handle.shutdown().await;

    let seen = read_stream(&js, &name, 51).await;
    assert_eq!(seen.len(), 51);
    let got: HashSet<Uuid> = seen.iter().map(|s| s.id).collect();
    let want: HashSet<Uuid> = ids.iter().copied().chain([loose]).collect();
    assert_eq!(got, want, "every event once, under its own id");
    assert_per_aggregate_order(&seen);

    // Headers given at publish time travel with the message.
    let stream = js.get_stream(&name).await?;
    let last = stream
        .get_last_raw_message_by_subject(&format!("{name}.none"))
        .await?;
    assert_eq!(
        last.headers.get("traceparent").map(|v| v.as_str()),
        Some("00-abc-def-01")
    );
    assert_eq!(
        last.headers
            .get(outbox::headers::EVENT_TYPE)
            .map(|v| v.as_str()),
        Some("note")
    );
    finish(db, &js, &name).await;
    Ok(())
}

#[tokio::test]
async fn several_relays_keep_per_aggregate_order() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_order", true).await?;

    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(
            jobq::Runtime::builder(pool.clone())
                .auto_register(false)
                .relay(Relay::nats(client.clone(), subject_of(&name)).batch(40))
                .relay(Relay::nats(client.clone(), subject_of(&name)).batch(40))
                .build()?
                .start()
                .await?,
        );
    }
    // Producers write while the relays run: each transaction appends the next versions
    // of one aggregate.
    const AGGS: i64 = 12;
    const PER: i64 = 100;
    let mut writers = Vec::new();
    for a in 0..AGGS {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            for chunk in 0..(PER / 5) {
                let mut tx = pool.begin().await.unwrap();
                let evs = (1..=5).map(|i| {
                    let v = chunk * 5 + i;
                    Event::new("order_changed", &v).aggregate("order", format!("agg-{a}"), v)
                });
                outbox::publish_many(&mut tx, evs).await.unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await?;
    }
    let total = (AGGS * PER) as usize;
    assert!(
        eventually(WAIT, || async { unpublished(&pool).await == 0 }).await,
        "six relays did not drain the outbox"
    );
    for h in handles {
        h.shutdown().await;
    }
    let seen = read_stream(&js, &name, total).await;
    assert_eq!(seen.len(), total, "each event exactly once");
    assert_per_aggregate_order(&seen);
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for s in &seen {
        per.entry(s.aggregate.clone().unwrap())
            .or_default()
            .push(s.version.unwrap());
    }
    for (a, vs) in per {
        assert_eq!(vs, (1..=PER).collect::<Vec<_>>(), "aggregate {a}");
    }
    finish(db, &js, &name).await;
    Ok(())
}

#[tokio::test]
async fn a_broker_that_is_down_grows_the_outbox_and_loses_nothing() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_down", false).await?;
    // No stream yet: JetStream refuses every publish to these subjects.
    let handle = jobq::Runtime::builder(pool.clone())
        .auto_register(false)
        .relay(
            Relay::nats(client, subject_of(&name))
                .backoff(Duration::from_millis(50), Duration::from_millis(500)),
        )
        .build()?
        .start()
        .await?;
    let mut tx = pool.begin().await?;
    outbox::publish_many(&mut tx, events(10, 30)).await?;
    tx.commit().await?;

    // The relay tries, fails with a classified code, and backs off; nothing is marked.
    let failing = eventually(WAIT, || async {
        let failed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobq.outbox WHERE attempts >= 2 AND last_error_code LIKE 'nats_%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        failed >= 10
    })
    .await;
    let states: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT attempts, last_error_code, last_error FROM jobq.outbox ORDER BY attempts DESC LIMIT 3",
    )
    .fetch_all(&pool)
    .await?;
    assert!(
        failing,
        "publishes to a missing stream were not recorded as failures: {states:?}"
    );
    let codes = outbox::failure_codes(&pool).await?;
    assert!(!codes.is_empty(), "{codes:?}");
    assert!(codes.iter().all(|f| f.events > 0), "{codes:?}");
    // The outbox keeps growing while the broker is down.
    let mut tx = pool.begin().await?;
    outbox::publish_many(&mut tx, events(10, 60).into_iter().skip(300)).await?;
    tx.commit().await?;
    assert_eq!(unpublished(&pool).await, 600);
    let lag = outbox::lag(&pool).await?;
    assert_eq!(lag.len(), 1);
    assert_eq!(lag[0].unpublished, 600);

    // The broker comes back: everything drains, in order, once.
    create_stream(&js, &name).await;
    assert!(
        eventually(WAIT, || async { unpublished(&pool).await == 0 }).await,
        "the outbox did not drain after the broker came back"
    );
    handle.shutdown().await;
    let seen = read_stream(&js, &name, 600).await;
    assert_eq!(seen.len(), 600);
    assert_eq!(seen.iter().map(|s| s.id).collect::<HashSet<_>>().len(), 600);
    assert_per_aggregate_order(&seen);
    assert!(outbox::failure_codes(&pool).await?.is_empty());
    finish(db, &js, &name).await;
    Ok(())
}

/// Applies one delivery through the inbox with a side effect (a row in `applied`) in the
/// same transaction, then acknowledges it.
async fn consume_nats(pool: &sqlx::PgPool, consumer: &str, msg: &jetstream::Message) -> Outcome {
    let delivery = Delivery::from_nats(consumer, msg).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let outcome = inbox::apply(&mut tx, &delivery).await.unwrap();
    if outcome.is_new() {
        let (_, agg, version) = delivery.aggregate_version().unwrap();
        sqlx::query("INSERT INTO applied (event_id, aggregate, version) VALUES ($1, $2, $3)")
            .bind(delivery.event_id())
            .bind(agg)
            .bind(version)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    inbox::commit_and_ack_nats(tx, msg).await.unwrap();
    outcome
}

async fn create_applied(pool: &sqlx::PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE applied (n bigserial PRIMARY KEY, event_id uuid NOT NULL,
                               aggregate text, version bigint)",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_relay_killed_between_ack_and_bookkeeping_loses_and_doubles_nothing() -> anyhow::Result<()>
{
    let (db, pool, _, js, name, stream) = nats_fixture("ob_kill", true).await?;
    let stream = stream.unwrap();
    create_applied(&pool).await;

    const AGGS: usize = 250;
    const PER: i64 = 40;
    const TOTAL: usize = AGGS * PER as usize;
    const KILLS: u32 = 20;
    for chunk in events(AGGS, PER).chunks(1000) {
        let mut tx = pool.begin().await?;
        outbox::publish_many(&mut tx, chunk.to_vec()).await?;
        tx.commit().await?;
    }

    // The consumer: the inbox and the side effect in one transaction, then the ack.
    let durable = unique("inbox");
    let pull: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(durable.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await?;
    let consumer_pool = pool.clone();
    let consuming = tokio::spawn(async move {
        let mut messages = pull.messages().await.unwrap();
        while let Some(m) = messages.next().await {
            let m = m.unwrap();
            consume_nats(&consumer_pool, &durable, &m).await;
        }
    });

    // The relay process, killed right after the broker acked a batch, 20 times.
    let done = Arc::new(AtomicBool::new(false));
    let current: Arc<Mutex<Option<std::process::Child>>> = Arc::new(Mutex::new(None));
    let driver = {
        let (done, current, url, name) = (
            done.clone(),
            current.clone(),
            db.url().to_owned(),
            name.clone(),
        );
        std::thread::spawn(move || -> u32 {
            let mut kills = 0;
            let mut acks = 0u32;
            while !done.load(Ordering::SeqCst) {
                let mut child = Command::new(env!("CARGO_BIN_EXE_outbox_relay"))
                    .env("DATABASE_URL", &url)
                    .env("NATS_URL", nats_url())
                    .env("OUTBOX_SUBJECT", &name)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawning outbox_relay");
                let out = BufReader::new(child.stdout.take().unwrap());
                let mut input = child.stdin.take().unwrap();
                *current.lock().unwrap() = Some(child);
                for line in out.lines() {
                    let Ok(line) = line else { break };
                    let acked: usize = line
                        .strip_prefix("ACKED ")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    if acked > 0 {
                        acks += 1;
                    }
                    if acked > 0 && kills < KILLS && acks.is_multiple_of(2) {
                        kills += 1;
                        if let Some(c) = current.lock().unwrap().as_mut() {
                            let _ = c.kill(); // SIGKILL
                            let _ = c.wait();
                        }
                        break;
                    }
                    if writeln!(input, "go").is_err() {
                        break;
                    }
                }
                if let Some(mut c) = current.lock().unwrap().take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            kills
        })
    };

    let drained = eventually(Duration::from_secs(300), || async {
        let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied")
            .fetch_one(&pool)
            .await
            .unwrap();
        unpublished(&pool).await == 0 && applied as usize >= TOTAL
    })
    .await;
    done.store(true, Ordering::SeqCst);
    if let Some(c) = current.lock().unwrap().as_mut() {
        let _ = c.kill();
    }
    let kills = driver.join().unwrap();
    consuming.abort();
    assert!(drained, "not every event was relayed and applied");
    assert_eq!(
        kills, KILLS,
        "the relay was killed after an ack {KILLS} times"
    );

    // At least once to the broker (each id is in the stream), the re-sends absorbed by
    // the Nats-Msg-Id dedupe window.
    let seen = read_stream(&js, &name, TOTAL).await;
    let ids: HashSet<Uuid> = seen.iter().map(|s| s.id).collect();
    assert_eq!(ids.len(), TOTAL);
    assert_eq!(stream_len(&js, &name).await, TOTAL as u64);
    assert_per_aggregate_order(&seen);
    // Exactly once at the consumer, in version order per aggregate.
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate, version FROM applied ORDER BY n")
            .fetch_all(&pool)
            .await?;
    assert_eq!(rows.len(), TOTAL);
    let mut next: HashMap<String, i64> = HashMap::new();
    for (a, v) in rows {
        let want = next.entry(a.clone()).or_insert(1);
        assert_eq!(v, *want, "aggregate {a} applied out of order");
        *want += 1;
    }
    let inbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.inbox")
        .fetch_one(&pool)
        .await?;
    assert_eq!(inbox_rows as usize, TOTAL);
    finish(db, &js, &name).await;
    Ok(())
}

#[tokio::test]
async fn the_inbox_rejects_a_replayed_message_and_an_older_version() -> anyhow::Result<()> {
    let (db, pool, client, js, name, stream) = nats_fixture("ob_inbox", true).await?;
    let stream = stream.unwrap();
    create_applied(&pool).await;

    let mut tx = pool.begin().await?;
    outbox::publish_many(
        &mut tx,
        (1..=3).map(|v| Event::new("order_changed", &v).aggregate("order", "o-1", v)),
    )
    .await?;
    tx.commit().await?;
    drain_relay(&Relay::nats(client, subject_of(&name)), &pool).await;

    let pull: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let mut batch = pull.fetch().max_messages(3).messages().await?;
    let mut msgs = Vec::new();
    while let Some(m) = batch.next().await {
        msgs.push(m.map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    assert_eq!(msgs.len(), 3);
    let c = "billing";
    // Version 1, then version 3: both new (versions need not be consecutive).
    assert_eq!(consume_nats(&pool, c, &msgs[0]).await, Outcome::New);
    assert_eq!(consume_nats(&pool, c, &msgs[2]).await, Outcome::New);
    // The same JetStream message again: a duplicate.
    assert_eq!(consume_nats(&pool, c, &msgs[2]).await, Outcome::Duplicate);
    // Version 2 after version 3 applied: stale, in the same statement.
    assert_eq!(
        consume_nats(&pool, c, &msgs[1]).await,
        Outcome::Stale { applied: 3 }
    );
    // Another consumer applies independently.
    assert_eq!(consume_nats(&pool, "search", &msgs[1]).await, Outcome::New);
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied")
        .fetch_one(&pool)
        .await?;
    assert_eq!(applied, 3, "two for billing, one for search");

    // An inbox row in a rolled-back transaction is forgotten with it.
    let fresh = Delivery::new(c, Uuid::now_v7()).aggregate("order", "o-2", 1);
    let mut tx = pool.begin().await?;
    assert_eq!(inbox::apply(&mut tx, &fresh).await?, Outcome::New);
    tx.rollback().await?;
    let mut tx = pool.begin().await?;
    assert_eq!(inbox::apply(&mut tx, &fresh).await?, Outcome::New);
    assert_eq!(inbox::apply(&mut tx, &fresh).await?, Outcome::Duplicate);
    tx.commit().await?;
    // An event without an aggregate is deduplicated by id alone.
    let plain = Delivery::new(c, Uuid::now_v7());
    let mut conn = pool.acquire().await?;
    assert_eq!(inbox::apply(&mut conn, &plain).await?, Outcome::New);
    assert_eq!(inbox::apply(&mut conn, &plain).await?, Outcome::Duplicate);
    drop(conn);
    finish(db, &js, &name).await;
    Ok(())
}

async fn amqp_channel() -> lapin::Channel {
    let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ does not answer on {}: {e}", amqp_url()));
    conn.create_channel().await.unwrap()
}

/// A topic exchange and a queue bound to it with `#` (when `bind`).
async fn amqp_setup(ch: &lapin::Channel, exchange: &str, queue: &str, bind: bool) {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    ch.exchange_declare(
        exchange.into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    if bind {
        ch.queue_bind(
            queue.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
}

async fn amqp_cleanup(ch: &lapin::Channel, exchange: &str, queue: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let _ = ch
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
}

type Consumed = (Outcome, Uuid, Option<u8>, Option<String>, Option<i64>);

fn amqp_seen(got: &[Consumed]) -> Vec<Seen> {
    got.iter()
        .map(|g| Seen {
            id: g.1,
            aggregate: g.3.clone(),
            version: g.4,
        })
        .collect()
}

fn routing(e: &OutboxEvent) -> String {
    format!(
        "{}.{}",
        e.event_type,
        e.aggregate.as_ref().map_or("none", |a| a.id.as_str())
    )
}

/// Consumes `n` deliveries from `queue`, applying each through the inbox (consumer
/// `consumer`) with the side effect, acknowledging after the commit. Returns the
/// deliveries' (outcome, message_id, delivery mode, version) in order.
async fn consume_amqp(
    pool: &sqlx::PgPool,
    ch: &lapin::Channel,
    queue: &str,
    consumer: &str,
    n: usize,
) -> Vec<Consumed> {
    use lapin::options::BasicConsumeOptions;
    let mut deliveries = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let d = tokio::time::timeout(WAIT, deliveries.next())
            .await
            .expect("no delivery within the deadline")
            .unwrap()
            .unwrap();
        let delivery = Delivery::from_amqp(consumer, &d).unwrap();
        let mut tx = pool.begin().await.unwrap();
        let outcome = inbox::apply(&mut tx, &delivery).await.unwrap();
        let agg = delivery.aggregate_version();
        if outcome.is_new() {
            sqlx::query("INSERT INTO applied (event_id, aggregate, version) VALUES ($1, $2, $3)")
                .bind(delivery.event_id())
                .bind(agg.map(|a| a.1))
                .bind(agg.and_then(|a| a.2))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        let mode = *d.properties.delivery_mode();
        out.push((
            outcome,
            delivery.event_id(),
            mode,
            agg.map(|a| a.1.to_owned()),
            agg.and_then(|a| a.2),
        ));
        inbox::commit_and_ack_amqp(tx, &d).await.unwrap();
    }
    out
}

#[tokio::test]
async fn rabbitmq_confirms_persistent_messages_and_a_resend_is_a_duplicate() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    create_applied(&pool).await;
    let (exchange, queue) = (unique("ob_x"), unique("ob_q"));
    let setup = amqp_channel().await;
    amqp_setup(&setup, &exchange, &queue, true).await;

    let mut tx = pool.begin().await?;
    let ids = outbox::publish_many(&mut tx, events(4, 25)).await?;
    tx.commit().await?;
    let handle = jobq::Runtime::builder(pool.clone())
        .auto_register(false)
        .relay(Relay::rabbitmq(
            amqp_channel().await,
            exchange.clone(),
            routing,
        ))
        .relay(Relay::rabbitmq(amqp_channel().await, exchange.clone(), routing).batch(7))
        .build()?
        .start()
        .await?;
    let got = consume_amqp(&pool, &setup, &queue, "billing", 100).await;
    assert!(eventually(WAIT, || async { unpublished(&pool).await == 0 }).await);
    assert!(got.iter().all(|g| g.0 == Outcome::New));
    assert!(got.iter().all(|g| g.2 == Some(2)), "persistent delivery");
    assert_eq!(
        got.iter().map(|g| g.1).collect::<HashSet<_>>(),
        ids.iter().copied().collect::<HashSet<_>>(),
        "message_id is the event id"
    );
    let seen = amqp_seen(&got);
    assert_per_aggregate_order(&seen);

    // A re-send (an operator's audited replay) carries the same message_id: the inbox
    // drops it.
    outbox::replay(&pool, ids[0], "ops@example", Some("consumer lost it")).await?;
    let again = consume_amqp(&pool, &setup, &queue, "billing", 1).await;
    assert_eq!(again[0].1, ids[0]);
    assert_eq!(again[0].0, Outcome::Duplicate);
    let audit: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.job_audit WHERE action = 'outbox_replay'
         AND actor = 'ops@example' AND detail->>'event_id' = $1",
    )
    .bind(ids[0].to_string())
    .fetch_one(&pool)
    .await?;
    assert_eq!(audit, 1);
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM applied")
        .fetch_one(&pool)
        .await?;
    assert_eq!(applied, 100);
    handle.shutdown().await;
    amqp_cleanup(&setup, &exchange, &queue).await;
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn rabbitmq_unroutable_events_wait_in_the_outbox_until_a_queue_is_bound() -> anyhow::Result<()>
{
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    create_applied(&pool).await;
    let (exchange, queue) = (unique("ob_x"), unique("ob_q"));
    let setup = amqp_channel().await;
    amqp_setup(&setup, &exchange, &queue, false).await;
    let relay = Relay::rabbitmq(amqp_channel().await, exchange.clone(), routing)
        .backoff(Duration::from_millis(20), Duration::from_millis(200));

    let mut tx = pool.begin().await?;
    outbox::publish_many(&mut tx, events(3, 4)).await?;
    tx.commit().await?;
    let report = relay.run_once(&pool).await?;
    assert_eq!(report.published, 0);
    assert_eq!(report.failed, 3, "the first event of each aggregate");
    assert_eq!(
        report.held_back, 9,
        "later versions are not sent past a failure"
    );
    assert_eq!(unpublished(&pool).await, 12);
    let stuck = outbox::stuck(&pool, Duration::from_secs(3600), 100).await?;
    assert_eq!(stuck.len(), 3);
    assert!(
        stuck
            .iter()
            .all(|s| s.last_error_code.as_deref() == Some("amqp_unroutable")),
        "{stuck:?}"
    );

    // Bind a queue: the same events go out, in order, nothing lost.
    use lapin::options::QueueBindOptions;
    setup
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await?;
    drain_relay(&relay, &pool).await;
    let got = consume_amqp(&pool, &setup, &queue, "billing", 12).await;
    let seen = amqp_seen(&got);
    assert_per_aggregate_order(&seen);
    assert_eq!(seen.iter().map(|s| s.id).collect::<HashSet<_>>().len(), 12);
    amqp_cleanup(&setup, &exchange, &queue).await;
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn published_events_are_pruned_after_the_retention() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_prune", true).await?;
    let mut tx = pool.begin().await?;
    let ids = outbox::publish_many(&mut tx, events(2, 2)).await?;
    tx.commit().await?;
    let relay = Relay::nats(client, subject_of(&name)).retention(Duration::from_secs(24 * 3600));
    drain_relay(&relay, &pool).await;
    // Two published long ago, two recently; one more unpublished and old.
    sqlx::query(
        "UPDATE jobq.outbox SET published_at = now() - interval '2 days' WHERE id = ANY($1)",
    )
    .bind(&ids[..2])
    .execute(&pool)
    .await?;
    let mut tx = pool.begin().await?;
    outbox::publish(&mut tx, Event::new("late", &0)).await?;
    tx.commit().await?;
    sqlx::query(
        "UPDATE jobq.outbox SET created_at = now() - interval '3 days' WHERE published_at IS NULL",
    )
    .execute(&pool)
    .await?;
    assert_eq!(relay.prune(&pool).await?, 2);
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM jobq.outbox WHERE published_at IS NOT NULL")
            .fetch_all(&pool)
            .await?;
    assert_eq!(
        left.into_iter().collect::<HashSet<_>>(),
        ids[2..].iter().copied().collect()
    );
    assert_eq!(
        unpublished(&pool).await,
        1,
        "unpublished events are never pruned"
    );
    finish(db, &js, &name).await;
    Ok(())
}

#[tokio::test]
async fn bad_events_are_rejected_with_a_code_and_write_nothing() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let cases = [
        (Event::new("", &1), "invalid_event"),
        (Event::new("x".repeat(201), &1), "invalid_event"),
        (Event::new("ok", &"\u{0}"), "nul_in_payload"),
        (Event::new("ok", &1).aggregate("", 1, 1), "invalid_event"),
        (
            Event::new("ok", &1).header("Nats-Msg-Id", "x"),
            "invalid_event",
        ),
        (Event::new("ok", &1).header("a", "b\nc"), "invalid_event"),
        (
            Event::new("ok", &"x".repeat(jobq::MAX_PAYLOAD_BYTES + 1)),
            "payload_too_large",
        ),
    ];
    for (event, code) in cases {
        let mut tx = pool.begin().await?;
        let good = Event::new("fine", &1);
        let err = outbox::publish_many(&mut tx, [good, event])
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        tx.commit().await?;
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.outbox")
        .fetch_one(pool)
        .await?;
    assert_eq!(rows, 0, "a batch with a bad event writes nothing");
    db.close().await;
    Ok(())
}

/// The outbox row of event `id`, as the columns a publish writes.
async fn outbox_row(pool: &sqlx::PgPool, id: Uuid) -> Option<serde_json::Value> {
    sqlx::query_scalar(
        "SELECT jsonb_build_object('event_type', event_type, 'aggregate_type', aggregate_type,
                'aggregate_id', aggregate_id, 'aggregate_version', aggregate_version,
                'agg_key', agg_key, 'payload', payload, 'headers', headers,
                'published_at', published_at, 'attempts', attempts)
         FROM jobq.outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_event_rides_along_a_statement_and_commits_or_rolls_back_with_it() -> anyhow::Result<()>
{
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, paid bool NOT NULL DEFAULT false);
         INSERT INTO orders (id) VALUES (1), (2)",
    )
    .execute(&pool)
    .await?;
    let paid = |v: i64| {
        Event::new("order_paid", &serde_json::json!({ "order_id": 1, "v": v }))
            .aggregate("order", 1, v)
            .header("traceparent", "00-abc-def-01")
    };
    const RIDE: &str = "UPDATE orders SET paid = true WHERE id = $1 RETURNING jobq.publish($2)";

    // Rolled back: the event goes with the change.
    let gone = paid(1);
    let mut tx = pool.begin().await?;
    let id: Uuid = sqlx::query_scalar(RIDE)
        .bind(1_i64)
        .bind(outbox::param(&gone)?)
        .fetch_one(&mut *tx)
        .await?;
    assert_eq!(id, gone.id());
    tx.rollback().await?;
    assert_eq!(outbox_row(&pool, gone.id()).await, None);

    // A statement that matches no row publishes nothing.
    let none = paid(1);
    let mut tx = pool.begin().await?;
    let got: Option<Uuid> = sqlx::query_scalar(RIDE)
        .bind(99_i64)
        .bind(outbox::param(&none)?)
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    assert_eq!(got, None);
    assert_eq!(outbox_row(&pool, none.id()).await, None);

    // Committed: the same row `publish` writes, with its trace headers.
    let ridden = paid(2);
    let mut tx = pool.begin().await?;
    sqlx::query_scalar::<_, Uuid>(RIDE)
        .bind(1_i64)
        .bind(outbox::param(&ridden)?)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut tx = pool.begin().await?;
    let plain = outbox::publish(&mut tx, paid(2)).await?;
    tx.commit().await?;
    let (a, b) = (
        outbox_row(&pool, ridden.id()).await.unwrap(),
        outbox_row(&pool, plain).await.unwrap(),
    );
    assert_eq!(a, b, "publish and the ride-along form write the same row");
    assert_eq!(a["headers"]["traceparent"], "00-abc-def-01");
    assert_eq!(a["agg_key"], "order:1");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn bad_events_through_the_sql_function_get_a_classified_error() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    // Rejected in Rust, before the statement is sent.
    let err = outbox::param(&Event::new(" ", &1)).unwrap_err();
    assert_eq!(err.code(), "invalid_event");
    let err = outbox::param(&Event::new("ok", &1).header("Jobq-Event-Type", "x")).unwrap_err();
    assert_eq!(err.code(), "invalid_event");

    // Written by hand in SQL: rejected by jobq.publish with a code.
    let big = format!(
        r#"{{"type":"big","payload":"{}"}}"#,
        "x".repeat(jobq::MAX_PAYLOAD_BYTES)
    );
    let cases = [
        (r#"{"type":"","payload":1}"#.to_owned(), "invalid_event"),
        (r#"{"payload":1}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t"}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"id":"nope"}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"id":"0190a5e8-0000-7000-8000-00000000000g"}"#.to_owned(), "invalid_event"),
        // 32 digits would read as a UUID; an id must be a JSON string.
        (r#"{"type":"t","payload":1,"id":12345678123456781234567812345678}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"aggregate_type":"order"}"#.to_owned(), "invalid_event"),
        (
            r#"{"type":"t","payload":1,"aggregate_type":"o","aggregate_id":"1","aggregate_version":1.5}"#
                .to_owned(),
            "invalid_event",
        ),
        (r#"{"type":"t","payload":1,"headers":{"a:b":"c"}}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"headers":{"nats-msg-id":"c"}}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"headers":{"a":"b\nc"}}"#.to_owned(), "invalid_event"),
        (r#"{"type":"t","payload":1,"headers":{"a":1}}"#.to_owned(), "invalid_event"),
        (big, "payload_too_large"),
    ];
    for (json, code) in &cases {
        let mut tx = pool.begin().await?;
        let err = sqlx::query("SELECT jobq.publish($1::jsonb)")
            .bind(json)
            .execute(&mut *tx)
            .await
            .unwrap_err();
        let classified = outbox::rejection(&err).unwrap_or_else(|| panic!("{json}: {err}"));
        assert_eq!(classified.code(), *code, "{json}: {classified}");
        tx.rollback().await?;
    }
    // Other database errors are not the function's, not even a bad UUID elsewhere.
    let err = sqlx::query("SELECT 1/0").execute(&pool).await.unwrap_err();
    assert!(outbox::rejection(&err).is_none());
    let err = sqlx::query("SELECT 'nope'::uuid")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(outbox::rejection(&err).is_none());
    // A row written straight into the table keeps the table's rules (migration 0013
    // moved the event type's to a domain).
    for event_type in ["", &"x".repeat(201)] {
        let err = sqlx::query(
            "INSERT INTO jobq.outbox (id, event_type, agg_key, payload)
             VALUES (gen_random_uuid(), $1, 'k', '1')",
        )
        .bind(event_type)
        .execute(&pool)
        .await
        .unwrap_err();
        let code = err
            .as_database_error()
            .and_then(|e| e.code().map(|c| c.into_owned()));
        assert_eq!(code.as_deref(), Some("23514"), "{err}");
    }

    // A hand-written event without an id gets a UUIDv7; versions and ids may be numbers.
    let id: Uuid = sqlx::query_scalar(
        r#"SELECT jobq.publish('{"type":"t","payload":{"x":1},"aggregate_type":"order",
                                "aggregate_id":7,"aggregate_version":3}')"#,
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(id.get_version_num(), 7);
    let row = outbox_row(&pool, id).await.unwrap();
    assert_eq!(row["agg_key"], "order:7");
    assert_eq!(row["aggregate_version"], 3);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.outbox")
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 1, "rejected events write nothing");
    db.close().await;
    Ok(())
}

/// Advisory locks held by sessions of this test's database.
async fn advisory_locks(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND a.datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A sink that reports when it is called, then waits until released, then acks all.
struct Blocking {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl outbox::Sink for Blocking {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), outbox::SinkError>> {
        self.entered.notify_one();
        self.release.notified().await;
        events.iter().map(|_| Ok(())).collect()
    }
}

#[tokio::test]
async fn a_relay_holds_no_transaction_open_while_it_waits_for_the_broker() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let mut tx = pool.begin().await?;
    outbox::publish_many(&mut tx, events(3, 2)).await?;
    tx.commit().await?;

    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    // One event of each aggregate per pass, so the sink is called once.
    let relay = Relay::new(Blocking {
        entered: entered.clone(),
        release: release.clone(),
    })
    .batch(3);
    let pass = tokio::spawn({
        let pool = pool.clone();
        async move { relay.run_once(&pool).await }
    });
    entered.notified().await;

    // The sink is waiting for the "broker": no session of this database is inside a
    // transaction, yet the relay still holds its three aggregates.
    let in_tx: Vec<(i32, String)> = sqlx::query_as(
        "SELECT pid, coalesce(query, '') FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state IN ('idle in transaction', 'idle in transaction (aborted)')",
    )
    .fetch_all(&pool)
    .await?;
    assert!(
        in_tx.is_empty(),
        "sessions idle in a transaction: {in_tx:?}"
    );
    let xmin_held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND backend_type = 'client backend' AND backend_xmin IS NOT NULL",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(xmin_held, 0, "no session holds back the xmin horizon");
    let locks = advisory_locks(&pool).await;
    assert_eq!(locks, 3, "one lock per aggregate in the pass");
    // Another relay meanwhile finds nothing it may take.
    let other = Relay::new(Blocking {
        entered: Arc::new(tokio::sync::Notify::new()),
        release: Arc::new(tokio::sync::Notify::new()),
    });
    assert_eq!(other.run_once(&pool).await?.claimed, 0);

    release.notify_one();
    let report = pass.await??;
    assert_eq!((report.claimed, report.published), (3, 3));
    let locks = advisory_locks(&pool).await;
    assert_eq!(locks, 0, "the pass released its aggregates");
    assert_eq!(unpublished(&pool).await, 3, "the second versions are left");
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn old_inbox_rows_are_pruned_and_stale_versions_stay_rejected() -> anyhow::Result<()> {
    use jobq::maintenance::{Pruner, PrunerConfig};
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    // Five events of one aggregate and three without one, applied by "billing".
    let versioned: Vec<Delivery> = (1..=5)
        .map(|v| Delivery::new("billing", Uuid::now_v7()).aggregate("order", "1", v))
        .collect();
    let loose: Vec<Delivery> = (0..3)
        .map(|_| Delivery::new("billing", Uuid::now_v7()))
        .collect();
    for d in versioned.iter().chain(&loose) {
        let mut tx = pool.begin().await?;
        assert_eq!(inbox::apply(&mut tx, d).await?, Outcome::New);
        tx.commit().await?;
    }
    // All but the last loose one were applied 40 days ago.
    sqlx::query(
        "UPDATE jobq.inbox SET applied_at = now() - interval '40 days' WHERE event_id <> $1",
    )
    .bind(loose[2].event_id())
    .execute(&pool)
    .await?;

    let pruner = Pruner::new(
        pool.clone(),
        PrunerConfig {
            batch: 3,
            ..PrunerConfig::default()
        },
    );
    assert_eq!(pruner.dry_run(None).await?.inbox, 7);
    let report = pruner.run_once().await?;
    assert_eq!(report.inbox, 7, "in batches of 3: 3, 3, 1");
    // A pass that deleted only inbox rows is audited, with its count.
    let audited: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT detail FROM jobq.job_audit WHERE action = 'prune' ORDER BY id")
            .fetch_all(&pool)
            .await?;
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["inbox"], 7, "{audited:?}");
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM jobq.inbox")
        .fetch_all(&pool)
        .await?;
    assert_eq!(left, vec![loose[2].event_id()], "recent rows stay");

    // The aggregate's last applied version survives: a redelivered old version is
    // still rejected (as stale now, no longer as a duplicate by id); a new one applies.
    let mut tx = pool.begin().await?;
    assert_eq!(
        inbox::apply(&mut tx, &versioned[4]).await?,
        Outcome::Stale { applied: 5 }
    );
    assert_eq!(
        inbox::apply(&mut tx, &versioned[1]).await?,
        Outcome::Stale { applied: 5 }
    );
    let next = Delivery::new("billing", Uuid::now_v7()).aggregate("order", "1", 6);
    assert_eq!(inbox::apply(&mut tx, &next).await?, Outcome::New);
    // The recent loose event is still a duplicate.
    assert_eq!(inbox::apply(&mut tx, &loose[2]).await?, Outcome::Duplicate);
    tx.commit().await?;
    db.close().await;
    Ok(())
}

/// A sink that refuses every event, with a code chosen by the event's aggregate.
struct Refusing;

#[async_trait::async_trait]
impl outbox::Sink for Refusing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), outbox::SinkError>> {
        events
            .iter()
            .map(|e| {
                let code = match e.aggregate.as_ref().map(|a| a.id.as_str()) {
                    Some("agg-0") => "broker_full",
                    _ => "broker_refused",
                };
                Err(outbox::SinkError::new(code, "no"))
            })
            .collect()
    }
}

#[tokio::test]
async fn stats_count_publish_failures_by_code() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let mut tx = pool.begin().await?;
    outbox::publish_many(&mut tx, events(3, 2)).await?;
    tx.commit().await?;
    let report = Relay::new(Refusing).run_once(&pool).await?;
    // The first event of each aggregate fails; the second waits behind it.
    assert_eq!((report.failed, report.held_back), (3, 3));
    let s = jobq::stats::stats(&pool).await?;
    assert_eq!(
        s.outbox.failures,
        vec![
            outbox::PublishFailures {
                code: "broker_refused".into(),
                events: 2
            },
            outbox::PublishFailures {
                code: "broker_full".into(),
                events: 1
            },
        ]
    );
    assert_eq!(s.outbox.lag.iter().map(|l| l.unpublished).sum::<i64>(), 6);
    let json = serde_json::to_value(&s.outbox)?;
    assert_eq!(json["failures"][0]["code"], "broker_refused");
    assert_eq!(json["failures"][0]["events"], 2);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn one_relay_in_the_cluster_prunes_the_outbox() -> anyhow::Result<()> {
    let (db, pool, client, js, name, _) = nats_fixture("ob_prune_leader", true).await?;
    let mut handles = Vec::new();
    for _ in 0..2 {
        handles.push(
            jobq::Runtime::builder(pool.clone())
                .auto_register(false)
                .relay(Relay::nats(client.clone(), subject_of(&name)))
                .relay(Relay::nats(client.clone(), subject_of(&name)))
                .build()?
                .start()
                .await?,
        );
    }
    // Four relays, each running its first retention check at start: one holds the
    // retention lock, the others stay followers.
    let (hi, lo) = (
        (outbox::OUTBOX_PRUNE_LOCK >> 32) as u32 as i64,
        outbox::OUTBOX_PRUNE_LOCK as u32 as i64,
    );
    let holders = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND classid::bigint = $1 AND objid::bigint = $2
               AND objsubid = 1 AND granted
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .bind(hi)
        .bind(lo)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert!(
        eventually(WAIT, || async { holders().await == 1 }).await,
        "no relay leads the outbox retention"
    );
    for h in handles {
        h.shutdown().await;
    }
    assert_eq!(holders().await, 0, "the leader resigned at shutdown");
    finish(db, &js, &name).await;
    Ok(())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Paid {
    order: i64,
}

#[jobq::job(kind = "outbox_invoice")]
async fn outbox_invoice(_args: Paid) -> Result<(), jobq::JobError> {
    Ok(())
}

#[jobq::job(kind = "outbox_keyed_invoice", idempotency = order)]
async fn outbox_keyed_invoice(_args: Paid) -> Result<(), jobq::JobError> {
    Ok(())
}

#[jobq::job(kind = "outbox_ordered_invoice", ordering = order)]
async fn outbox_ordered_invoice(_args: Paid) -> Result<(), jobq::JobError> {
    Ok(())
}

/// The event types in the outbox, in insertion order, and the number of jobs.
async fn outbox_and_jobs(pool: &sqlx::PgPool) -> (Vec<String>, i64) {
    let types = sqlx::query_scalar("SELECT event_type::text FROM jobq.outbox ORDER BY seq")
        .fetch_all(pool)
        .await
        .unwrap();
    let jobs = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
        .fetch_one(pool)
        .await
        .unwrap();
    (types, jobs)
}

#[tokio::test]
async fn an_event_rides_the_enqueue_and_stands_or_falls_with_the_job() -> anyhow::Result<()> {
    use jobq::Job;
    let db = TestDatabase::new().await?;
    let pool = db.pool().clone();
    let paid = |n: i64| Event::new(format!("paid_{n}"), &n).aggregate("order", n, 1);

    // Rolled back: neither the job nor the event.
    let mut tx = pool.begin().await?;
    OutboxInvoice::with(Paid { order: 0 })
        .publish(paid(0))
        .enqueue(&mut tx)
        .await?;
    tx.rollback().await?;
    assert_eq!(outbox_and_jobs(&pool).await, (vec![], 0));

    // Committed, in the caller's transaction: the same row `publish` writes.
    let ridden = paid(1).header("traceparent", "00-abc-def-01");
    let mut tx = pool.begin().await?;
    OutboxInvoice::with(Paid { order: 1 })
        .publish(ridden.clone())
        .enqueue(&mut tx)
        .await?;
    let plain = outbox::publish(&mut tx, paid(1).header("traceparent", "00-abc-def-01")).await?;
    tx.commit().await?;
    let (a, b) = (
        outbox_row(&pool, ridden.id()).await.unwrap(),
        outbox_row(&pool, plain).await.unwrap(),
    );
    assert_eq!(a, b, "the enqueue's event and publish's are the same row");
    assert_eq!(a["agg_key"], "order:1");
    assert_eq!(a["headers"]["traceparent"], "00-abc-def-01");

    // On the pool (no transaction of the caller's), with no aggregate; a keyed job's
    // duplicate still writes its event; an ordered job and two events take the savepoint
    // path; so does a batch.
    OutboxInvoice::with(Paid { order: 2 })
        .publish(Event::new("loose", &2))
        .enqueue(&pool)
        .await?;
    let first = OutboxKeyedInvoice::with(Paid { order: 3 })
        .publish(paid(3))
        .enqueue(&pool)
        .await?;
    let again = OutboxKeyedInvoice::with(Paid { order: 3 })
        .publish(paid(4))
        .enqueue(&pool)
        .await?;
    assert!(!first.duplicate && again.duplicate && first.id == again.id);
    OutboxOrderedInvoice::with(Paid { order: 5 })
        .publish(paid(5))
        .enqueue(&pool)
        .await?;
    OutboxInvoice::with(Paid { order: 6 })
        .publish(paid(6))
        .publish(paid(7))
        .enqueue(&pool)
        .await?;
    OutboxInvoice::enqueue_many_with(
        &pool,
        [
            OutboxInvoice::with(Paid { order: 8 }).publish(paid(8)),
            OutboxInvoice::with(Paid { order: 9 }),
            OutboxInvoice::with(Paid { order: 10 }).publish(paid(10)),
        ],
    )
    .await?;
    let (types, jobs) = outbox_and_jobs(&pool).await;
    assert_eq!(
        types,
        [
            "paid_1", "paid_1", "loose", "paid_3", "paid_4", "paid_5", "paid_6", "paid_7",
            "paid_8", "paid_10"
        ]
    );
    assert_eq!(jobs, 8);
    let loose: String =
        sqlx::query_scalar("SELECT agg_key FROM jobq.outbox WHERE event_type::text = 'loose'")
            .fetch_one(&pool)
            .await?;
    assert!(loose.starts_with("event:"), "{loose}");

    // A bad event: classified, and the job is not written either.
    let err = OutboxInvoice::with(Paid { order: 11 })
        .publish(Event::new("", &11))
        .enqueue(&pool)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_event");
    let err = OutboxInvoice::with(Paid { order: 11 })
        .publish(Event::new("ok", &11).header("tenant", "a\u{0}b"))
        .enqueue(&pool)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_event");

    // A job the database refuses takes its event with it, on every path: one statement,
    // and the savepoint (on the pool, and inside a caller's transaction that goes on).
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (NEW.payload->>'order')::int8 >= 100 THEN RAISE EXCEPTION 'refused'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON jobq.jobs FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .execute(&pool)
    .await?;
    assert!(
        OutboxInvoice::with(Paid { order: 100 })
            .publish(paid(100))
            .enqueue(&pool)
            .await
            .is_err()
    );
    assert!(
        OutboxOrderedInvoice::with(Paid { order: 101 })
            .publish(paid(101))
            .enqueue(&pool)
            .await
            .is_err()
    );
    let mut tx = pool.begin().await?;
    assert!(
        OutboxInvoice::with(Paid { order: 102 })
            .publish(paid(102))
            .publish(paid(103))
            .enqueue(&mut tx)
            .await
            .is_err()
    );
    OutboxInvoice::with(Paid { order: 12 })
        .publish(paid(12))
        .enqueue(&mut tx)
        .await?;
    tx.commit().await?;
    let (types, jobs) = outbox_and_jobs(&pool).await;
    assert_eq!(types.len(), 11, "{types:?}");
    assert_eq!(types.last().map(String::as_str), Some("paid_12"));
    assert_eq!(jobs, 9);
    db.close().await;
    Ok(())
}
