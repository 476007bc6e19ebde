//! An isolated, migrated database per test.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::drain::Drain;
use crate::error::Error;
use crate::resolve::resolve_database_url;

/// A database created for one test, migrated with `jobq::migrate`, dropped by
/// [`close`](Self::close) — or, if the test panics first, when it is dropped.
///
/// The server is the one [`resolve_database_url`] finds: `DATABASE_URL`, the default
/// URL, or a throwaway cluster.
///
/// ```no_run
/// # async fn t() -> Result<(), jobq_testing::Error> {
/// let db = jobq_testing::TestDatabase::new().await?;
/// let pool = db.pool().clone();
/// // ... enqueue through `pool`, then:
/// let drained = db.drain().advance_clock(true).run().await?;
/// db.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin: PgConnectOptions,
    options: PgConnectOptions,
    pool: PgPool,
    dropped: bool,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// How long [`TestDatabase::close`] waits for checked-out connections.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

impl TestDatabase {
    /// Creates `jobq_test_<pid>_<n>_<random>` on the server [`resolve_database_url`]
    /// finds and migrates it. The pool holds up to 20 connections.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`] (one line, with the fix) when no server answers;
    /// [`Error::Database`] when the server refuses to create a database;
    /// [`Error::Jobq`] when migrating fails.
    pub async fn new() -> Result<TestDatabase, Error> {
        Self::with_max_connections(20).await
    }

    /// As [`new`](Self::new), with a pool of `max` connections.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub async fn with_max_connections(max: u32) -> Result<TestDatabase, Error> {
        let url = resolve_database_url().await?;
        Self::on_server(&url, max).await
    }

    /// Creates and migrates a test database on the server of `admin_url`, whose role must
    /// be allowed to create databases.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub async fn on_server(admin_url: &str, max: u32) -> Result<TestDatabase, Error> {
        let admin =
            PgConnectOptions::from_str(admin_url)?.log_statements(tracing::log::LevelFilter::Off);
        let name = format!(
            "jobq_test_{}_{}_{:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let mut conn = PgConnection::connect_with(&admin).await?;
        jobq::__testing::database_create(&mut conn, &name).await?;
        conn.close().await?;
        let options = admin.clone().database(&name);
        let db = TestDatabase {
            pool: PgPoolOptions::new()
                .max_connections(max)
                .connect_lazy_with(options.clone()),
            url: with_database(admin_url, &name),
            name,
            admin,
            options,
            dropped: false,
        };
        // From here on, Drop removes the database if anything fails.
        jobq::migrate(&db.pool).await?;
        Ok(db)
    }

    /// A connection URL for this database, for another process (a worker binary) to use.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The pool of this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection options for this database (to build another pool, as a second worker
    /// process would).
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// A new pool of `max` connections to this database.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when connecting fails.
    pub async fn new_pool(&self, max: u32) -> Result<PgPool, Error> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await?)
    }

    /// A [`Drain`] over this database's pool.
    pub fn drain(&self) -> Drain {
        Drain::new(&self.pool)
    }

    /// Closes the pool and drops the database (other pools to it are cut off). A
    /// connection still checked out of the pool is waited for up to two seconds, then cut
    /// off too.
    pub async fn close(mut self) {
        if tokio::time::timeout(CLOSE_GRACE, self.pool.close())
            .await
            .is_err()
        {
            tracing::warn!(
                database = %self.name,
                "a connection of the test database's pool is still in use; dropping the database anyway"
            );
        }
        if let Ok(mut conn) = PgConnection::connect_with(&self.admin).await {
            let _ = jobq::__testing::database_drop(&mut conn, &self.name).await;
            let _ = conn.close().await;
        }
        self.dropped = true;
    }
}

impl Drop for TestDatabase {
    /// A test that panicked before [`close`](TestDatabase::close) still leaves no database
    /// behind: drop it from a short-lived thread with its own runtime (this may run inside
    /// an async test, where blocking on the test's own runtime is not possible).
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect_with(&admin).await {
                    let _ = jobq::__testing::database_drop(&mut conn, &name).await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// `url` with its database name replaced by `database`, keeping any query string: the
/// URL of another database on the same server (for a worker process, say).
pub fn with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let root = match head[authority_start..].find('/') {
        Some(i) => &head[..authority_start + i],
        None => head,
    };
    format!("{root}/{database}{query}")
}

#[cfg(test)]
mod url_tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_and_keeps_the_query() {
        assert_eq!(
            with_database("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
        assert_eq!(
            with_database("postgres://u@h/test?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
