//! What the example programs share: a fresh database of their own.

use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Drops and recreates the database `name` on the server `DATABASE_URL` names — or the
/// default local one, or a throwaway cluster when PostgreSQL is installed but not running
/// (`jobq_testing::resolve_database_url`) — and returns a pool of `max` connections to it.
///
/// # Errors
///
/// When no server can be reached (one line saying how to fix it), or the database cannot
/// be created.
pub async fn fresh_database(name: &str, max: u32) -> anyhow::Result<PgPool> {
    let url = fresh_database_url(name).await?;
    let options: PgConnectOptions = url.parse()?;
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options)
        .await?)
}

/// As [`fresh_database`], returning the new database's URL (for worker processes).
///
/// # Errors
///
/// As [`fresh_database`].
pub async fn fresh_database_url(name: &str) -> anyhow::Result<String> {
    let url = jobq_testing::resolve_database_url().await?;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .with_context(|| format!("cannot reach PostgreSQL at {url}; set DATABASE_URL"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin)
        .await?;
    admin.close().await;
    Ok(jobq_testing::with_database(&url, name))
}
