//! `TestDatabase`: one isolated, migrated database per test, dropped afterwards.

use jobq_testing::TestDatabase;
use sqlx::PgPool;

async fn exists(admin: &PgPool, name: &str) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(admin)
            .await?,
    )
}

#[tokio::test]
async fn each_test_database_is_fresh_migrated_and_dropped_by_close() -> anyhow::Result<()> {
    let url = jobq_testing::resolve_database_url().await?;
    let admin = PgPool::connect(&url).await?;
    let (a, b) = (TestDatabase::new().await?, TestDatabase::new().await?);
    assert_ne!(a.name(), b.name());
    for db in [&a, &b] {
        assert!(exists(&admin, db.name()).await?);
        let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
            .fetch_one(db.pool())
            .await?;
        assert_eq!(jobs, 0);
    }
    let name = a.name().to_owned();
    a.close().await;
    assert!(!exists(&admin, &name).await?);
    b.close().await;
    Ok(())
}

#[tokio::test]
async fn a_test_database_that_is_never_closed_is_dropped_anyway() -> anyhow::Result<()> {
    let url = jobq_testing::resolve_database_url().await?;
    let admin = PgPool::connect(&url).await?;
    let db = TestDatabase::new().await?;
    let name = db.name().to_owned();
    // As when a test panics before `close`, with a connection still in use.
    let held = db.pool().acquire().await?;
    drop(db);
    assert!(!exists(&admin, &name).await?);
    drop(held);
    Ok(())
}

#[tokio::test]
async fn close_does_not_wait_forever_for_a_connection_still_in_use() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let held = db.pool().acquire().await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), db.close()).await?;
    drop(held);
    Ok(())
}
