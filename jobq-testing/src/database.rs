//! An isolated, migrated database per test.

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// The server tests use when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// A database created for one test, migrated with `jobq::migrate`, dropped by
/// [`close`](Self::close).
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    admin: PgConnectOptions,
    options: PgConnectOptions,
    pool: PgPool,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDatabase {
    /// Creates `jobq_test_<pid>_<n>_<random>` on the server of `DATABASE_URL` and
    /// migrates it. The pool holds up to 20 connections.
    ///
    /// # Errors
    ///
    /// [`jobq::Error::Database`] when the server cannot be reached or refuses to create a
    /// database; [`jobq::Error::Migrate`] when migrating fails.
    pub async fn new() -> Result<TestDatabase, jobq::Error> {
        Self::with_max_connections(20).await
    }

    /// As [`new`](Self::new), with a pool of `max` connections.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub async fn with_max_connections(max: u32) -> Result<TestDatabase, jobq::Error> {
        let url = database_url();
        let admin =
            PgConnectOptions::from_str(&url)?.log_statements(tracing::log::LevelFilter::Off);
        let name = format!(
            "jobq_test_{}_{}_{:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        );
        let mut conn = PgConnection::connect_with(&admin).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .connect_with(options.clone())
            .await?;
        jobq::migrate(&pool).await?;
        Ok(TestDatabase {
            name,
            admin,
            options,
            pool,
        })
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
    /// [`jobq::Error::Database`] when connecting fails.
    pub async fn new_pool(&self, max: u32) -> Result<PgPool, jobq::Error> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await?)
    }

    /// Closes the pool and drops the database (other pools to it are cut off).
    pub async fn close(self) {
        self.pool.close().await;
        if let Ok(mut conn) = PgConnection::connect_with(&self.admin).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
            let _ = conn.close().await;
        }
    }
}
