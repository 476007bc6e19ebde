//! Leader election: a session-level advisory lock held on a dedicated connection.
//!
//! Whoever holds the lock leads; the lock lives exactly as long as the connection, so a
//! leader whose process dies (or whose connection is cut) is replaced by whichever node
//! tries next. Each [`Leader::check`] pings the held connection; a failed ping means the
//! lock is gone, and the node becomes a follower until it wins the lock again.

use sqlx::{Connection, PgConnection, PgPool};
use tracing::{info, warn};

use crate::store;

/// One node's side of a leader election for one advisory-lock key.
#[derive(Debug)]
pub struct Leader {
    pool: PgPool,
    key: i64,
    held: Option<PgConnection>,
}

impl Leader {
    /// An election over `pool` for advisory-lock `key` (one key per service).
    pub fn new(pool: PgPool, key: i64) -> Self {
        Leader {
            pool,
            key,
            held: None,
        }
    }

    /// Whether this node leads now: keeps the lock if it holds it and its connection is
    /// alive, else tries to take it (never waits for it).
    pub async fn check(&mut self) -> bool {
        if let Some(conn) = self.held.as_mut() {
            if store::connection_ping(conn).await.is_ok() {
                return true;
            }
            warn!(
                key = self.key,
                "lost the leader connection; leadership released"
            );
            self.held = None;
        }
        let mut conn = match self.pool.acquire().await {
            // A dedicated connection, out of the pool: the lock lives as long as it does.
            Ok(c) => c.detach(),
            Err(e) => {
                warn!(key = self.key, error = %e, "leader election: cannot connect");
                return false;
            }
        };
        match store::advisory_lock_try(&mut conn, self.key).await {
            Ok(true) => {
                info!(key = self.key, "became leader");
                self.held = Some(conn);
                true
            }
            Ok(false) => {
                let _ = conn.close().await;
                false
            }
            Err(e) => {
                warn!(key = self.key, error = %e, "leader election failed");
                false
            }
        }
    }

    /// Whether this node held the lock at its last check.
    pub fn is_leader(&self) -> bool {
        self.held.is_some()
    }

    /// Gives the lock up (and closes its connection).
    pub async fn resign(&mut self) {
        if let Some(mut conn) = self.held.take() {
            let _ = store::advisory_unlock(&mut conn, self.key).await;
            let _ = conn.close().await;
            info!(key = self.key, "resigned leadership");
        }
    }

    #[doc(hidden)]
    /// The backend process id of the held connection (for tests that cut it off).
    ///
    /// # Errors
    ///
    /// [`crate::Error::Database`] when the connection fails, [`crate::Error::Config`]
    /// when this node does not lead.
    pub async fn backend_pid(&mut self) -> Result<i32, crate::Error> {
        match self.held.as_mut() {
            Some(conn) => store::connection_backend_pid(conn).await,
            None => Err(crate::Error::Config("not the leader".into())),
        }
    }
}
