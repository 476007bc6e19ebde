//! Every SQL statement jobq-testing issues, one function each, named `noun_verb`.
//!
//! jobq's own `store` owns the statements of the runtime (claim, complete, fail); what is
//! here only creates and drops test databases.

use sqlx::PgConnection;

/// Creates database `name` (a name this crate generated: `[a-z0-9_]` only).
pub(crate) async fn database_create(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(conn)
        .await?;
    Ok(())
}

/// Drops database `name`, cutting off the sessions still connected to it.
pub(crate) async fn database_drop(conn: &mut PgConnection, name: &str) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(conn)
    .await?;
    Ok(())
}

/// One round trip that proves the server answers.
pub(crate) async fn server_ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query("SELECT 1").execute(conn).await?;
    Ok(())
}
