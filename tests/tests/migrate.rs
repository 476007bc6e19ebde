//! `jobq::migrate` is idempotent, safe to call from many processes at once, and lives
//! beside an application's own `sqlx::migrate!` without either reporting the other's
//! versions missing.

use jobq_testing::TestDatabase;

async fn reset(pool: &sqlx::PgPool) {
    sqlx::raw_sql(
        "DROP SCHEMA jobq CASCADE; DROP TABLE IF EXISTS _sqlx_migrations, invoices, customers;",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn jobq_versions(pool: &sqlx::PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM jobq.schema_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn migrate_twice_is_a_no_op() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    jobq::migrate(db.pool()).await?;
    jobq::migrate(db.pool()).await?;
    let all: Vec<i64> = jobq::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(jobq_versions(db.pool()).await, all);
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn concurrent_migrations_apply_once() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    reset(db.pool()).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let pool = db.pool().clone();
        tasks.push(tokio::spawn(async move { jobq::migrate(&pool).await }));
    }
    for t in tasks {
        t.await??;
    }
    assert_eq!(jobq_versions(db.pool()).await.len(), jobq::MIGRATIONS.len());
    db.close().await;
    Ok(())
}

#[tokio::test]
async fn app_migrations_before_and_after_jobq() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let app = sqlx::migrate!("./app_migrations");

    // The application first, then jobq, then both again.
    reset(pool).await;
    app.run(pool).await?;
    jobq::migrate(pool).await?;
    app.run(pool).await?;
    jobq::migrate(pool).await?;

    // jobq first, then the application, then both again.
    reset(pool).await;
    jobq::migrate(pool).await?;
    app.run(pool).await?;
    jobq::migrate(pool).await?;
    app.run(pool).await?;

    // jobq wrote nothing to sqlx's table, and the app's tables exist.
    let app_versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(pool)
            .await?;
    assert_eq!(app_versions, vec![1, 2]);
    sqlx::query("INSERT INTO invoices (id, status) VALUES (1, 'new')")
        .execute(pool)
        .await?;
    db.close().await;
    Ok(())
}
