//! Connections a busy runtime keeps checked out between its statements. Checking a
//! connection out of an sqlx pool and back in costs a round trip each way (a ping on
//! release, and one on acquire unless the pool has `test_before_acquire(false)`), as much
//! as a small claim or completion itself; the producer and the completer, which issue
//! statement after statement while a queue is busy, keep theirs and give them back to the
//! pool when they go idle.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

/// How long a runtime task keeps spare connections once it has nothing to do.
pub(crate) const LINGER: Duration = Duration::from_millis(10);

/// Connections checked out of `pool` and kept for the next statement.
#[derive(Debug, Clone)]
pub(crate) struct Spares {
    pool: PgPool,
    idle: Arc<Mutex<Vec<PoolConnection<Postgres>>>>,
}

impl Spares {
    pub(crate) fn new(pool: PgPool) -> Self {
        Spares {
            pool,
            idle: Arc::default(),
        }
    }

    /// A kept connection, or a new one from the pool.
    pub(crate) async fn take(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        let kept = self.lock().pop();
        match kept {
            Some(conn) => Ok(conn),
            None => self.pool.acquire().await,
        }
    }

    /// Keeps `conn` for the next statement. Only a connection whose last statement
    /// succeeded comes back here; one that failed is dropped, and the pool checks it.
    pub(crate) fn keep(&self, conn: PoolConnection<Postgres>) {
        self.lock().push(conn);
    }

    /// Gives every kept connection back to the pool.
    pub(crate) fn release(&self) {
        let kept = std::mem::take(&mut *self.lock());
        drop(kept);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PoolConnection<Postgres>>> {
        // A Vec of connections has no invariant a panic could break halfway.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
