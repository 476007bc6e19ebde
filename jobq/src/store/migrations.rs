//! jobq's own migration bookkeeping, `jobq.schema_migrations` (never sqlx's
//! `_sqlx_migrations`), for `jobq::migrate`.

use sqlx::PgConnection;

use crate::error::Error;

/// An advisory-lock key only jobq's migrations use ("jobq" in ASCII).
const MIGRATE_LOCK: i64 = 0x6a6f_6271;

/// Takes the migration lock for the rest of the transaction `conn` is in, creates the
/// schema and the bookkeeping table if missing, and returns the versions applied.
pub(crate) async fn migrations_begin(conn: &mut PgConnection) -> Result<Vec<i64>, Error> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS jobq;
         CREATE TABLE IF NOT EXISTS jobq.schema_migrations (
             version    bigint      PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .execute(&mut *conn)
    .await?;
    Ok(
        sqlx::query_scalar("SELECT version FROM jobq.schema_migrations")
            .fetch_all(&mut *conn)
            .await?,
    )
}

/// Runs migration `version` (`sql`, several statements) and records it. A failing
/// statement comes back as [`Error::Migrate`].
pub(crate) async fn migration_apply(
    conn: &mut PgConnection,
    version: i64,
    name: &'static str,
    sql: &'static str,
) -> Result<(), Error> {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .map_err(|source| Error::Migrate {
            version,
            name,
            source,
        })?;
    sqlx::query("INSERT INTO jobq.schema_migrations (version, name) VALUES ($1, $2)")
        .bind(version)
        .bind(name)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
