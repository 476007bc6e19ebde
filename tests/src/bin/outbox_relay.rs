//! A relay process for the outbox kill test: relays `DATABASE_URL`'s outbox to NATS
//! (`NATS_URL`, subject `<OUTBOX_SUBJECT>.<aggregate id>`), and after every batch the
//! broker acknowledged — before the relay's own bookkeeping — prints `ACKED <n>` and
//! waits for a line on stdin. The test answers or SIGKILLs it right there.

use std::io::{BufRead, Write};
use std::time::Duration;

use jobq::outbox::{NatsSink, OutboxEvent, Relay, Sink, SinkError};

struct Pausing(NatsSink);

#[async_trait::async_trait]
impl Sink for Pausing {
    async fn publish(&self, events: &[OutboxEvent]) -> Vec<Result<(), SinkError>> {
        let results = self.0.publish(events).await;
        let acked = results.iter().filter(|r| r.is_ok()).count();
        // Block this thread on purpose: the relay must not reach its bookkeeping until
        // the test has decided whether to kill the process here.
        tokio::task::block_in_place(|| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "ACKED {acked}");
            let _ = out.flush();
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        });
        results
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into());
    let prefix = std::env::var("OUTBOX_SUBJECT")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    let client = async_nats::connect(nats).await?;
    let sink = NatsSink::new(client, move |e: &OutboxEvent| {
        let id = e.aggregate.as_ref().map_or("none", |a| a.id.as_str());
        format!("{prefix}.{id}")
    });
    let relay = Relay::new(Pausing(sink)).batch(250);
    loop {
        let report = relay.run_once(&pool).await?;
        if report.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
