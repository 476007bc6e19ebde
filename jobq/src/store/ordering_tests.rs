//! Per-key ordering at the statement level: enqueue chains, the claim skips waiting jobs,
//! the end of a job releases the next, failures park, replay, cancel and unpark release.

use super::*;
use sqlx::PgConnection;

use crate::error::Disposition;
use crate::ids::JobId;

fn job(kind: &str, scope: Option<&str>, key: Option<&str>) -> NewJob {
    NewJob {
        kind: kind.into(),
        queue: "default".into(),
        payload: "{}".into(),
        priority: 0,
        max_attempts: 3,
        run_after: None,
        delay_secs: None,
        idempotency_key: None,
        time: Default::default(),
        trace_context: None,
        ordering: key.map(|k| NewOrdering {
            scope: scope.unwrap_or(kind).into(),
            key: k.into(),
        }),
    }
}

async fn enqueue(conn: &mut PgConnection, j: NewJob) -> i64 {
    job_insert(conn, &j, Wake::default(), &[])
        .await
        .unwrap()
        .0
        .id
        .0
}

async fn claim(conn: &mut PgConnection, kinds: &[&str]) -> Vec<(i64, i64)> {
    let kinds: Vec<String> = kinds.iter().map(|k| (*k).to_owned()).collect();
    let leases = vec![60.0; kinds.len()];
    let mut got: Vec<(i64, i64)> = job_claim(
        conn,
        &ClaimParams {
            queue: "default",
            kinds: &kinds,
            lease_secs: &leases,
            limit: 100,
            worker: "w",
            now: None,
            after: None,
        },
    )
    .await
    .unwrap()
    .into_iter()
    .map(|c| (c.id, c.fence))
    .collect();
    got.sort_unstable();
    got
}

fn ids(claimed: &[(i64, i64)]) -> Vec<i64> {
    claimed.iter().map(|c| c.0).collect()
}

async fn fail(conn: &mut PgConnection, (id, fence): (i64, i64), d: Disposition) -> String {
    job_fail(
        conn,
        &FailParams {
            id,
            fence,
            disposition: d,
            code: "boom",
            message: "boom",
            // As `retry::next_state` decides for a job with attempts left.
            retry_in_secs: (d == Disposition::Retryable).then_some(0.0),
            now: None,
        },
    )
    .await
    .unwrap()
    .unwrap()
}

async fn done(conn: &mut PgConnection, fence: (i64, i64)) {
    let r = job_complete_many(conn, &[fence], None).await.unwrap();
    assert_eq!(r, vec![FenceResult::Applied]);
}

const OPERATOR: Actor<'static> = Actor {
    name: "alice",
    reason: Some("fixed"),
};

#[tokio::test]
async fn jobs_of_a_key_run_one_at_a_time_in_id_order() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a3 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let b1 = enqueue(&mut conn, job("k", None, Some("B"))).await;
    let u = enqueue(&mut conn, job("k", None, None)).await;

    let first = claim(&mut conn, &["k"]).await;
    assert_eq!(
        ids(&first),
        vec![a1, b1, u],
        "one job per key, unordered all"
    );
    assert!(claim(&mut conn, &["k"]).await.is_empty());
    done(&mut conn, first[0]).await;
    let second = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&second), vec![a2]);
    done(&mut conn, second[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a3]);
}

#[tokio::test]
async fn a_retry_keeps_its_place() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let _a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(
        fail(&mut conn, c[0], Disposition::Retryable).await,
        "pending"
    );
    let again = claim(&mut conn, &["k"]).await;
    assert_eq!(
        ids(&again),
        vec![a1],
        "the retry runs before the next job of its key"
    );
}

#[tokio::test]
async fn a_failed_job_parks_its_key_until_it_is_replayed() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a3 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(
        fail(&mut conn, c[0], Disposition::Permanent).await,
        "failed"
    );
    let b1 = enqueue(&mut conn, job("k", None, Some("B"))).await;
    let a4 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    assert_eq!(
        ids(&claim(&mut conn, &["k"]).await),
        vec![b1],
        "A is parked"
    );

    let counts = ordering_parked_counts(&mut conn).await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!((counts[0].kind.as_str(), counts[0].parked), ("k", 3));
    let keys = ordering_parked_keys(&mut conn, 10).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0].key.as_str(), keys[0].blocker, keys[0].parked),
        ("A", a1, 3)
    );
    for id in [a2, a3, a4] {
        let row = job_get(&mut conn, id).await.unwrap().unwrap();
        assert_eq!(row.parked_behind, Some(JobId(a1)), "job {id}");
    }

    let replayed = job_replay_many(&mut conn, &[a1], OPERATOR).await.unwrap();
    assert_eq!(replayed.len(), 1);
    ordering_settle(&mut conn, &[a1]).await.unwrap();
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&c), vec![a1], "the replayed job runs first");
    assert!(
        ordering_parked_keys(&mut conn, 10)
            .await
            .unwrap()
            .is_empty()
    );
    done(&mut conn, c[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
}

#[tokio::test]
async fn lease_expiry_on_the_last_attempt_parks_the_key() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let mut one = job("k", None, Some("A"));
    one.max_attempts = 1;
    let _a1 = enqueue(&mut conn, one).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    claim(&mut conn, &["k"]).await;
    let later = chrono::Utc::now() + chrono::Duration::minutes(5);
    let r = job_reap(&mut conn, 100, Some(later)).await.unwrap();
    assert_eq!(r.failed, 1);
    assert!(claim(&mut conn, &["k"]).await.is_empty());
    let row = job_get(&mut conn, a2).await.unwrap().unwrap();
    assert!(row.parked_behind.is_some());
}

#[tokio::test]
async fn cancelling_the_blocker_or_a_waiting_job_releases_the_next() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a3 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a4 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    fail(&mut conn, c[0], Disposition::Permanent).await;
    // Cancelling the failed blocker lets the rest proceed.
    let t = job_cancel(&mut conn, a1, OPERATOR).await.unwrap().unwrap();
    assert_eq!(t.after, "cancelled");
    ordering_settle(&mut conn, &[a1]).await.unwrap();
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&c), vec![a2]);
    // Cancelling a waiting job in the middle: the one after it is next.
    job_cancel(&mut conn, a3, OPERATOR).await.unwrap().unwrap();
    ordering_settle(&mut conn, &[a3]).await.unwrap();
    assert!(claim(&mut conn, &["k"]).await.is_empty(), "a2 still runs");
    done(&mut conn, c[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a4]);
}

#[tokio::test]
async fn a_cancel_requested_while_running_releases_the_next_when_the_attempt_ends() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    let t = job_cancel(&mut conn, a1, OPERATOR).await.unwrap().unwrap();
    assert_eq!(t.after, "running");
    assert_eq!(
        fail(&mut conn, c[0], Disposition::Retryable).await,
        "cancelled"
    );
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
}

#[tokio::test]
async fn unpark_skips_the_failed_jobs_keeps_them_failed_and_audits() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    fail(&mut conn, c[0], Disposition::Permanent).await;
    let none = ordering_unpark(&mut conn, Some("other"), "A", OPERATOR)
        .await
        .unwrap();
    assert!(none.skipped.is_empty(), "another scope is untouched");

    let u = ordering_unpark(&mut conn, None, "A", OPERATOR)
        .await
        .unwrap();
    assert_eq!((u.skipped.clone(), u.released), (vec![a1], 1));
    let row = job_get(&mut conn, a1).await.unwrap().unwrap();
    assert_eq!(row.state, "failed");
    assert!(row.ordering_skipped);
    let audit: (String, String, Option<String>) =
        sqlx::query_as("SELECT action, actor, reason FROM jobq.job_audit WHERE job_id = $1")
            .bind(a1)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(
        audit,
        ("unpark".into(), "alice".into(), Some("fixed".into()))
    );
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&c), vec![a2]);
    // A job enqueued after the unpark waits behind a2, not behind the skipped a1.
    let a3 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    done(&mut conn, c[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a3]);
}

#[tokio::test]
async fn a_named_scope_serializes_every_kind_in_it() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let x1 = enqueue(&mut conn, job("x", Some("billing"), Some("7"))).await;
    let y1 = enqueue(&mut conn, job("y", Some("billing"), Some("7"))).await;
    // The default scope is the kind: the same key in two kinds runs in parallel.
    let x2 = enqueue(&mut conn, job("x", None, Some("7"))).await;
    let y2 = enqueue(&mut conn, job("y", None, Some("7"))).await;
    let c = claim(&mut conn, &["x", "y"]).await;
    assert_eq!(ids(&c), vec![x1, x2, y2]);
    done(&mut conn, c[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["x", "y"]).await), vec![y1]);
}

#[tokio::test]
async fn a_batch_chains_its_jobs_of_one_key_in_input_order() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let batch = [
        job("k", None, Some("A")),
        job("k", None, Some("A")),
        job("k", None, Some("B")),
        job("k", None, Some("A")),
    ];
    let (e, _) = job_insert_many(&mut conn, &batch, Wake::default())
        .await
        .unwrap();
    let e: Vec<i64> = e.iter().map(|e| e.id.0).collect();
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&c), vec![e[0], e[2]]);
    done(&mut conn, c[0]).await;
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![e[1]]);
}

#[tokio::test]
async fn repeatable_read_is_refused() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    let e = job_insert(&mut tx, &job("k", None, Some("A")), Wake::default(), &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), "ordering_isolation");
}

#[tokio::test]
async fn an_invalid_key_is_refused_with_a_code() {
    let mut j = job("k", None, Some(""));
    assert_eq!(j.validate().unwrap_err().code(), "invalid_ordering_key");
    j.ordering = Some(NewOrdering {
        scope: "k".into(),
        key: "a\0b".into(),
    });
    assert_eq!(j.validate().unwrap_err().code(), "invalid_ordering_key");
}

/// The race the key lock closes: an enqueue whose transaction saw the head running (and
/// chained behind it) commits only after the head completed. The completion's settle
/// cannot take the key's lock while the enqueue is open; it tries again until the
/// enqueue has committed, then sees its job.
#[tokio::test]
async fn an_enqueue_still_open_when_the_head_completes_is_released() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let head = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&head), vec![a1]);

    let mut enq = db.pool().acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *enq).await.unwrap();
    let a2 = enqueue(&mut tx, job("k", None, Some("A"))).await;
    // The head's completion commits (the completer's first statement)...
    sqlx::query("UPDATE jobq.jobs SET state = 'done', finished_at = now(), locked_until = NULL WHERE id = $1")
        .bind(a1)
        .execute(&mut *conn)
        .await
        .unwrap();
    // ... and its settle starts while the enqueue is still open.
    let mut settler = db.pool().acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *settler)
        .await
        .unwrap();
    let settling = tokio::spawn(async move {
        ordering_settle_within(
            &mut settler,
            &[a1],
            std::time::Duration::from_secs(600),
            None,
        )
        .await
        .unwrap()
    });
    // Its first try at the key's lock has failed once it sits in its transaction.
    loop {
        let trying: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1
                 AND state = 'idle in transaction' AND query LIKE '%pg_try_advisory_xact_lock%')",
        )
        .bind(pid)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if trying {
            break;
        }
        assert!(
            !settling.is_finished(),
            "the settle did not wait for the enqueue's open transaction"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!settling.is_finished());
    tx.commit().await.unwrap();
    assert_eq!(
        settling.await.unwrap(),
        1,
        "the settle saw the committed enqueue"
    );
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
}

/// A completion never waits long for a key an open transaction holds: past its
/// patience it leaves the key to the sweeper.
#[tokio::test]
async fn a_completion_leaves_a_key_held_by_a_long_transaction_to_the_sweeper() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    enqueue(&mut conn, job("k", None, Some("A"))).await;
    let head = claim(&mut conn, &["k"]).await;
    let mut enq = db.pool().acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *enq).await.unwrap();
    let a2 = enqueue(&mut tx, job("k", None, Some("A"))).await;
    // Returns (after its patience) although the enqueue is still open.
    done(&mut conn, head[0]).await;
    tx.commit().await.unwrap();
    assert!(claim(&mut conn, &["k"]).await.is_empty());
    let r = crate::flow::ordering::sweep(db.pool(), 10).await.unwrap();
    assert_eq!(r.released, 1);
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
}

#[tokio::test]
async fn the_sweep_releases_a_key_left_behind_by_a_crash() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    claim(&mut conn, &["k"]).await;
    // The completion committed, then the process died before its release.
    sqlx::query("UPDATE jobq.jobs SET state = 'done', finished_at = now(), locked_until = NULL WHERE id = $1")
        .bind(a1)
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(claim(&mut conn, &["k"]).await.is_empty());
    assert_eq!(
        ordering_stale_blockers(&mut conn, 10).await.unwrap(),
        vec![a1]
    );
    let r = crate::flow::ordering::sweep(db.pool(), 10).await.unwrap();
    assert_eq!((r.stale, r.released), (1, 1));
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
    assert!(
        ordering_stale_blockers(&mut conn, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_pruner_keeps_a_failed_job_that_parks_its_key() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let u = enqueue(&mut conn, job("k", None, None)).await;
    for c in claim(&mut conn, &["k"]).await {
        fail(&mut conn, c, Disposition::Permanent).await;
    }
    let p = PruneParams {
        state: "failed",
        before: chrono::Utc::now() + chrono::Duration::days(1),
        kind: None,
        except_kinds: &[],
    };
    assert_eq!(
        job_prune_batch(&mut conn, &p, None, 100).await.unwrap().0,
        1
    );
    assert!(job_get(&mut conn, u).await.unwrap().is_none());
    assert!(job_get(&mut conn, a1).await.unwrap().is_some());
}

/// A key's next job becomes due when it is released, so a claim that starts after the
/// last job claimed (as claims do while they are slow) finds it.
#[tokio::test]
async fn a_released_job_is_found_by_a_claim_from_the_last_position() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let b1 = enqueue(&mut conn, job("k", None, Some("B"))).await;
    let kinds = ["k".to_owned()];
    let params = |after| ClaimParams {
        queue: "default",
        kinds: &kinds,
        lease_secs: &[60.0],
        limit: 100,
        worker: "w",
        now: None,
        after,
    };
    let first = job_claim(&mut conn, &params(None)).await.unwrap();
    assert_eq!(first.iter().map(|c| c.id).collect::<Vec<_>>(), vec![a1, b1]);
    let last = first.iter().map(ClaimedJob::position).max();
    let a1_fence = first[0].fence;
    job_complete_with_outputs(&mut conn, &[(a1, a1_fence)], &[], None)
        .await
        .unwrap();
    let after = [last];
    let next = job_claim(&mut conn, &params(Some(&after))).await.unwrap();
    assert_eq!(
        next.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![a2],
        "the released job is behind the claim's position"
    );
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn a_settle_returns_the_jobs_it_freed_at_their_places_in_claim_order() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let a1 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let a2 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let _a3 = enqueue(&mut conn, job("k", None, Some("A"))).await;
    let c = claim(&mut conn, &["k"]).await;
    assert_eq!(ids(&c), vec![a1]);
    let (results, ordered) = job_complete_unsettled(&mut conn, &[c[0]], &[None], None)
        .await
        .unwrap();
    assert_eq!(results, vec![FenceResult::Applied]);
    assert_eq!(ordered, vec![a1]);
    let before: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let freed = ordering_settle_freed(&mut conn, &ordered, SETTLE_PATIENCE, None)
        .await
        .unwrap();
    assert_eq!(freed.len(), 1, "{freed:?}");
    let f = &freed[0];
    assert_eq!(
        (f.queue.as_str(), f.kind.as_str(), f.pending),
        ("default", "k", true)
    );
    assert_eq!((f.position.priority, f.position.id), (0, a2));
    // Its place is among the jobs due at its release, not at its enqueue.
    assert!(f.position.run_after >= before, "{f:?} {before}");
    let row: DateTime<Utc> = sqlx::query_scalar("SELECT run_after FROM jobq.jobs WHERE id = $1")
        .bind(a2)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(row, f.position.run_after);
    // Settled again: nothing more is freed (a3 still waits behind a2).
    let again = ordering_settle_freed(&mut conn, &ordered, SETTLE_PATIENCE, None)
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(ids(&claim(&mut conn, &["k"]).await), vec![a2]);
}
