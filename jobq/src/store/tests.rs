//! Fencing at the statement level: every write of an attempt changes nothing once the
//! attempt no longer holds its job.

use super::*;
use crate::error::Disposition;

async fn running_job(conn: &mut sqlx::PgConnection, attempts: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, lease_gen, locked_until, locked_by)
         VALUES ('k', '{}', 'running', $1, $1, now() + interval '1 minute', 'w') RETURNING id",
    )
    .bind(attempts)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

async fn state(conn: &mut sqlx::PgConnection, id: i64) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT state, attempts, last_error_code FROM jobq.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn stale_writes_change_nothing() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    // The job is on attempt 2; attempt 1 is stale.
    let id = running_job(&mut conn, 2).await;

    let r = job_complete_many(&mut conn, &[(id, 1)], None)
        .await
        .unwrap();
    assert_eq!(r, vec![FenceResult::Stale]);
    let failed = job_fail(
        &mut conn,
        &FailParams {
            id,
            fence: 1,
            disposition: Disposition::Permanent,
            code: "x",
            message: "stale",
            retry_in_secs: None,
            now: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(failed, None);
    assert!(!job_hand_back(&mut conn, id, 1).await.unwrap());
    assert!(!job_complete_in_tx(&mut conn, id, 1).await.unwrap());
    assert!(!lease_extend_one(&mut conn, id, 1, 60.0).await.unwrap());
    assert!(!job_fence_check(&mut conn, id, 1).await.unwrap());
    let leases = lease_extend_many(
        &mut conn,
        &[LeaseRenewal {
            id,
            fence: 1,
            lease_secs: 60.0,
        }],
    )
    .await
    .unwrap();
    assert_eq!(leases, vec![LeaseStatus::Lost]);
    assert_eq!(state(&mut conn, id).await, ("running".into(), 2, None));

    // The current attempt's write applies, once.
    let r = job_complete_many(&mut conn, &[(id, 2), (id, 2)], None)
        .await
        .unwrap();
    assert_eq!(r[0], FenceResult::Applied);
    assert_eq!(state(&mut conn, id).await, ("done".into(), 2, None));
    // After completion, a late failure of the same attempt changes nothing either.
    let failed = job_fail(
        &mut conn,
        &FailParams {
            id,
            fence: 2,
            disposition: Disposition::Retryable,
            code: "late",
            message: "late",
            retry_in_secs: Some(0.0),
            now: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(failed, None);
    assert_eq!(state(&mut conn, id).await, ("done".into(), 2, None));
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn completion_reports_a_job_completed_in_its_own_transaction() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let id = running_job(&mut conn, 1).await;
    assert!(job_complete_in_tx(&mut conn, id, 1).await.unwrap());
    let r = job_complete_many(&mut conn, &[(id, 1)], None)
        .await
        .unwrap();
    assert_eq!(r, vec![FenceResult::AlreadyDone]);
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn heartbeat_skips_a_row_locked_by_the_handlers_transaction() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let id = running_job(&mut conn, 1).await;
    let mut handler_tx = db.pool().begin().await.unwrap();
    sqlx::query("UPDATE jobq.jobs SET priority = 1 WHERE id = $1")
        .bind(id)
        .execute(&mut *handler_tx)
        .await
        .unwrap();
    let renewal = [LeaseRenewal {
        id,
        fence: 1,
        lease_secs: 60.0,
    }];
    // Does not wait for the handler's transaction, and does not call the lease lost.
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        lease_extend_many(&mut conn, &renewal),
    )
    .await
    .expect("heartbeat must not block on a locked row")
    .unwrap();
    assert_eq!(r, vec![LeaseStatus::Busy]);
    handler_tx.rollback().await.unwrap();
    let r = lease_extend_many(&mut conn, &renewal).await.unwrap();
    assert_eq!(
        r,
        vec![LeaseStatus::Extended {
            cancel_requested: false
        }]
    );
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn reaper_leaves_a_job_completed_after_its_lease_expired() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, lease_gen, locked_until, locked_by)
         VALUES ('k', '{}', 'running', 1, 1, now() - interval '1 second', 'w') RETURNING id",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    // The attempt completes (its lease expired, but nobody took the job yet) ...
    let r = job_complete_many(&mut conn, &[(id, 1)], None)
        .await
        .unwrap();
    assert_eq!(r, vec![FenceResult::Applied]);
    // ... so the reaper, re-checking state on the row, leaves it (River #1302).
    let report = job_reap(&mut conn, 100, None).await.unwrap();
    assert_eq!(report, ReapReport::default());
    assert_eq!(state(&mut conn, id).await, ("done".into(), 1, None));
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn the_fence_check_locks_the_job_row_until_its_transaction_ends() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let id = running_job(&mut conn, 1).await;
    let mut handler_tx = db.pool().begin().await.unwrap();
    assert!(job_fence_check(&mut handler_tx, id, 1).await.unwrap());
    // A rescue (the reaper's or a claim's row lock) cannot take the row meanwhile.
    assert_eq!(lockable(&mut conn, id).await.unwrap(), None);
    handler_tx.rollback().await.unwrap();
    assert_eq!(lockable(&mut conn, id).await.unwrap(), Some(id));
    drop(conn);
    db.close().await;
}

/// The job row if no other transaction holds a lock on it.
async fn lockable(conn: &mut sqlx::PgConnection, id: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM jobq.jobs WHERE id = $1 FOR UPDATE SKIP LOCKED")
        .bind(id)
        .fetch_optional(conn)
        .await
}
