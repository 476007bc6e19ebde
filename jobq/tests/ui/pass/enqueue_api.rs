//! The generated enqueue helpers work without `use jobq::Job`, with a transaction, a
//! pool, a connection, the builder and a batch.
use chrono::{Duration as ChronoDuration, Utc};
use jobq::{Enqueued, JobContext, JobError};
use sqlx::{PgPool, Postgres, Transaction};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Args {
    pub id: i64,
}

#[jobq::job(idempotency = id)]
async fn send(_ctx: JobContext, _args: Args) -> Result<(), JobError> {
    Ok(())
}

async fn in_tx(tx: &mut Transaction<'_, Postgres>) -> Result<Enqueued, jobq::Error> {
    Send::enqueue(&mut **tx, Args { id: 1 }).await?;
    Send::with(Args { id: 2 })
        .run_after(Utc::now() + ChronoDuration::minutes(5))
        .priority(-1)
        .queue("mail")
        .max_attempts(3)
        .idempotency_key("custom")
        .enqueue(&mut **tx)
        .await?;
    let many = Send::enqueue_many(&mut **tx, (3..10).map(|id| Args { id })).await?;
    assert!(many.len() <= 7);
    Send::enqueue(tx, Args { id: 11 }).await
}

async fn with_pool(pool: &PgPool) -> Result<(), jobq::Error> {
    Send::enqueue(pool, Args { id: 1 }).await?;
    let mut conn = pool.acquire().await?;
    Send::enqueue(&mut *conn, Args { id: 1 }).await?;
    Ok(())
}

fn assert_send<F: std::future::Future + std::marker::Send>(_: &F) {}

fn main() {
    let _ = (in_tx, with_pool);
    // The helpers' futures are Send, so they can be spawned.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let pool = PgPool::connect_lazy("postgres://localhost/none").unwrap();
    let fut = Send::enqueue(&pool, Args { id: 1 });
    assert_send(&fut);
    drop(fut);
    let fut = Send::enqueue_many(&pool, [Args { id: 1 }]);
    assert_send(&fut);
}
