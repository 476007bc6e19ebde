//! The claim's cost does not grow with rows it will not take: counted as tuples the
//! statement reads (PostgreSQL's own statistics), not timed.

use super::*;

/// Flushes this backend's statistics and reads them afresh from then on.
async fn flush_stats(conn: &mut sqlx::PgConnection) {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// Entries read from jobq's index `name` so far, after [`flush_stats`].
async fn index_tuples_read(conn: &mut sqlx::PgConnection, name: &str) -> i64 {
    flush_stats(conn).await;
    sqlx::query_scalar(
        "SELECT idx_tup_read FROM pg_stat_user_indexes
         WHERE schemaname = 'jobq' AND indexrelname = $1",
    )
    .bind(name)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Index and sequential tuples read from `jobq.jobs` so far, after flushing this
/// backend's statistics.
async fn tuples_read(conn: &mut sqlx::PgConnection) -> i64 {
    flush_stats(conn).await;
    sqlx::query_scalar(
        "SELECT (SELECT coalesce(sum(idx_tup_read), 0)::int8 FROM pg_stat_user_indexes
                 WHERE relid = 'jobq.jobs'::regclass)
              + (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables
                 WHERE relid = 'jobq.jobs'::regclass)",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A connection holding a snapshot open, in the test's database (others do not hold its
/// horizon back) until it commits.
async fn hold_snapshot(
    db: &jobq_testing::TestDatabase,
) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut old = db.pool().acquire().await.unwrap();
    exec(
        &mut old,
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();",
    )
    .await;
    old
}

async fn exec(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .unwrap();
}

async fn claim(conn: &mut sqlx::PgConnection, queue: &str, limit: i64) -> Vec<ClaimedJob> {
    let kinds = ["a".to_owned(), "b".to_owned()];
    job_claim(
        conn,
        &ClaimParams {
            queue,
            kinds: &kinds,
            lease_secs: &[60.0, 60.0],
            limit,
            worker: "w",
            now: None,
            after: None,
        },
    )
    .await
    .unwrap()
}

/// Rows the claim will not take: 5,000 each of jobs scheduled for later, retries in
/// backoff, due jobs of a kind nobody serves, finished history, and due jobs of a
/// paused queue.
async fn seed_dirty(conn: &mut sqlx::PgConnection) {
    exec(
        conn,
        "INSERT INTO jobq.jobs (kind, payload, state, priority, run_after)
           SELECT 'a', '{}', 'scheduled', i % 5, now() + interval '1 hour'
           FROM generate_series(1, 5000) i;
         INSERT INTO jobq.jobs (kind, payload, state, attempts, run_after, last_failed_at)
           SELECT 'b', '{}', 'scheduled', 1, now() + interval '1 hour', now()
           FROM generate_series(1, 5000) i;
         INSERT INTO jobq.jobs (kind, payload, state, priority, run_after)
           SELECT 'unserved', '{}', 'pending', -5, now() - interval '1 minute'
           FROM generate_series(1, 5000) i;
         INSERT INTO jobq.jobs (kind, payload, state, finished_at)
           SELECT 'a', '{}', 'done', now() FROM generate_series(1, 5000) i;
         INSERT INTO jobq.jobs (kind, queue, payload, state)
           SELECT 'a', 'paused', '{}', 'pending' FROM generate_series(1, 5000) i;
         INSERT INTO jobq.queues (name, paused) VALUES ('paused', true);
         INSERT INTO jobq.jobs (kind, payload, state, priority)
           SELECT CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, '{}', 'pending',
                  CASE WHEN i % 2 = 0 THEN -1 ELSE 1 END
           FROM generate_series(1, 40) i;
         ANALYZE jobq.jobs;",
    )
    .await;
}

#[tokio::test]
async fn claim_reads_only_rows_it_takes() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed_dirty(&mut conn).await;
    let before = tuples_read(&mut conn).await;
    let jobs = claim(&mut conn, "default", 10).await;
    let read = tuples_read(&mut conn).await - before;
    assert_eq!(jobs.len(), 10);
    // Priority order across kinds: the ten claimed are all of kind `a` (priority -1).
    assert!(jobs.iter().all(|j| &*j.kind == "a" && j.priority == -1));
    // One probe per served kind reads at most `limit` rows each, plus the primary-key
    // lookups of the update: far below the 25,000 rows around them.
    assert!(read <= 100, "the claim read {read} tuples");

    // A paused queue's claim reads none of its 5,000 due rows.
    let before = tuples_read(&mut conn).await;
    assert!(claim(&mut conn, "paused", 10).await.is_empty());
    let read = tuples_read(&mut conn).await - before;
    assert!(read <= 5, "the paused claim read {read} tuples");
    drop(conn);
    db.close().await;
}

/// The depth gauges every node refreshes on its heartbeat read the due rows of its own
/// queues, not the future, finished or other queues' rows around them.
#[tokio::test]
async fn queue_depths_read_only_due_rows_of_the_queues_asked_for() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed_dirty(&mut conn).await;
    // One scheduled job past its time, not yet promoted: due, so counted.
    exec(
        &mut conn,
        "INSERT INTO jobq.jobs (kind, payload, state, run_after)
         VALUES ('a', '{}', 'scheduled', now() - interval '1 hour')",
    )
    .await;
    let before = tuples_read(&mut conn).await;
    let depths = queue_depths(&mut conn, &["default".to_owned()])
        .await
        .unwrap();
    let read = tuples_read(&mut conn).await - before;
    // The due rows of `default`: 40 served, 5,000 of a kind nobody serves, the overdue
    // scheduled one. Their oldest is that one, an hour old.
    assert_eq!(depths.len(), 1);
    let (queue, depth, age) = &depths[0];
    assert_eq!((queue.as_str(), *depth), ("default", 5_041));
    assert!(age.unwrap() > 3_500.0, "{age:?}");
    // Not the 20,000 future, finished and paused-queue rows beside them.
    assert!(read <= 5_041 + 100, "the count read {read} tuples");
}

/// While a snapshot older than the claims is held open, the index entries of claimed
/// jobs stay (nothing may mark or remove them) and a claim from the start reads them
/// all; a claim from a position starts past them. A job due behind the position is left
/// to the next claim from the start.
#[tokio::test]
async fn a_claim_from_a_position_reads_no_entry_of_the_jobs_claimed_before_it() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    exec(
        &mut conn,
        "INSERT INTO jobq.jobs (kind, payload, state)
           SELECT 'a', '{}', 'pending' FROM generate_series(1, 3000);
         ANALYZE jobq.jobs;",
    )
    .await;
    let mut old = hold_snapshot(&db).await;
    let kinds = ["a".to_owned(), "b".to_owned()];
    let params = |limit, after| ClaimParams {
        queue: "default",
        kinds: &kinds,
        lease_secs: &[60.0, 60.0],
        limit,
        worker: "w",
        now: None,
        after,
    };
    let mut last = None;
    for _ in 0..29 {
        let jobs = job_claim(&mut conn, &params(100, None)).await.unwrap();
        assert_eq!(jobs.len(), 100);
        last = jobs.iter().map(ClaimedJob::position).max();
    }
    // A job due behind the position: a higher priority.
    exec(
        &mut conn,
        "INSERT INTO jobq.jobs (kind, payload, state, priority) VALUES ('a', '{}', 'pending', -1)",
    )
    .await;

    let after = [last, None];
    let before = tuples_read(&mut conn).await;
    let jobs = job_claim(&mut conn, &params(10, Some(&after)))
        .await
        .unwrap();
    let read = tuples_read(&mut conn).await - before;
    assert_eq!(jobs.len(), 10);
    assert!(
        jobs.iter()
            .all(|j| j.priority == 0 && Some(j.position()) > last),
        "the claim from the position took only jobs after it"
    );
    assert!(read <= 100, "the claim from a position read {read} tuples");

    let before = tuples_read(&mut conn).await;
    let jobs = job_claim(&mut conn, &params(10, None)).await.unwrap();
    let read = tuples_read(&mut conn).await - before;
    assert_eq!(jobs.len(), 10);
    assert_eq!(
        jobs[0].priority, -1,
        "the claim from the start found the job behind"
    );
    assert!(
        read >= 2_900,
        "the claim from the start read only {read} tuples"
    );

    exec(&mut old, "COMMIT").await;
    drop((conn, old));
    db.close().await;
}

/// No statement about pending or running rows can be planned on `jobs_state_id_idx`: it
/// holds no entry of theirs (with statistics that said almost nothing was pending, the
/// planner walked it for the claim and sorted the whole backlog), and enqueues and
/// claims write none.
#[tokio::test]
async fn the_state_index_leaves_out_the_states_rows_pass_through() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed_dirty(&mut conn).await;
    exec(
        &mut conn,
        "UPDATE jobq.jobs SET state = 'running', locked_until = now() + interval '1 minute'
         WHERE id IN (SELECT id FROM jobq.jobs WHERE state = 'pending' LIMIT 1000);
         ANALYZE jobq.jobs;",
    )
    .await;
    // ANALYZE counts a partial index's entries from its sample (all 25,040 rows here).
    let (entries, listed, rows): (f32, i64, i64) = sqlx::query_as(
        "SELECT (SELECT reltuples FROM pg_class WHERE oid = 'jobq.jobs_state_id_idx'::regclass),
                (SELECT count(*) FROM jobq.jobs
                 WHERE state IN ('scheduled', 'done', 'failed', 'cancelled')),
                (SELECT count(*) FROM jobq.jobs)",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!((listed, rows), (15_000, 25_040));
    assert!(
        (f64::from(entries) - 15_000.0).abs() < 1.0,
        "jobs_state_id_idx holds {entries} entries"
    );
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn claim_takes_every_served_kind_in_priority_order() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed_dirty(&mut conn).await;
    let mut seen = Vec::new();
    loop {
        let jobs = claim(&mut conn, "default", 7).await;
        if jobs.is_empty() {
            break;
        }
        seen.extend(jobs.into_iter().map(|j| (j.priority, j.id)));
    }
    assert_eq!(seen.len(), 40, "every due job of both kinds, none other");
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "claimed in (priority, due, id) order");
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn inserts_put_future_jobs_in_scheduled() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let job = |delay: Option<f64>, key: Option<&str>| NewJob {
        kind: "a".into(),
        queue: "default".into(),
        payload: "{}".into(),
        priority: 0,
        max_attempts: 3,
        run_after: None,
        delay_secs: delay,
        idempotency_key: key.map(str::to_owned),
        time: Default::default(),
        trace_context: None,
        ordering: None,
    };
    let mut ids = Vec::new();
    for (delay, key) in [
        (None, None),
        (Some(60.0), None),
        (None, Some("k1")),
        (Some(60.0), Some("k2")),
    ] {
        let (e, _) = job_insert(&mut conn, &job(delay, key), Wake::default(), &[])
            .await
            .unwrap();
        ids.push(e.id.0);
    }
    for keyed in [false, true] {
        let batch: Vec<NewJob> = [None, Some(60.0)]
            .into_iter()
            .enumerate()
            .map(|(i, d)| job(d, keyed.then_some(["k3", "k4"][i])))
            .collect();
        let (es, _) = job_insert_many(&mut conn, &batch, Wake::default())
            .await
            .unwrap();
        ids.extend(es.iter().map(|e| e.id.0));
    }
    let states: Vec<String> =
        sqlx::query_scalar("SELECT state FROM jobq.jobs WHERE id = ANY($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let due_or_not = ["pending", "scheduled"];
    let expected: Vec<&str> = (0..8).map(|i| due_or_not[i % 2]).collect();
    assert_eq!(states, expected);
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn a_retry_with_backoff_is_scheduled_and_promoted_when_due() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, lease_gen, locked_until, locked_by)
         VALUES ('a', '{}', 'running', 1, 1, now() + interval '1 minute', 'w') RETURNING id",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let at = db_now(&mut conn).await.unwrap();
    let fail = |delay_secs| FailParams {
        id,
        fence: 1,
        disposition: crate::error::Disposition::Retryable,
        code: "x",
        message: "m",
        retry_in_secs: Some(delay_secs),
        now: Some(at),
    };
    assert_eq!(
        job_fail(&mut conn, &fail(30.0)).await.unwrap().as_deref(),
        Some("scheduled")
    );
    // Not due one millisecond early; due at its time, once.
    let early = at + chrono::Duration::seconds(30) - chrono::Duration::milliseconds(1);
    assert_eq!(
        job_promote_due(&mut conn, 10, Some(early)).await.unwrap(),
        0
    );
    assert!(claim(&mut conn, "default", 10).await.is_empty());
    let due = at + chrono::Duration::seconds(30);
    assert_eq!(job_promote_due(&mut conn, 10, Some(due)).await.unwrap(), 1);
    assert_eq!(job_promote_due(&mut conn, 10, Some(due)).await.unwrap(), 0);
    let state: String = sqlx::query_scalar("SELECT state FROM jobq.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(state, "pending");
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn asking_about_a_queue_without_jobs_reads_no_table() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    seed_dirty(&mut conn).await;
    exec(
        &mut conn,
        "INSERT INTO jobq.jobs (kind, queue, payload, state, finished_at)
           VALUES ('a', 'history', '{}', 'failed', now());
         ANALYZE jobq.jobs;",
    )
    .await;
    let before = tuples_read(&mut conn).await;
    assert!(!queue_exists(&mut conn, "idle").await.unwrap());
    let read = tuples_read(&mut conn).await - before;
    assert!(
        read <= 5,
        "asking about an unknown queue read {read} tuples"
    );
    // A queue with only history is known.
    assert!(queue_exists(&mut conn, "history").await.unwrap());
    drop(conn);
    db.close().await;
}

#[tokio::test]
async fn batched_completion_and_heartbeat_match_every_fence_of_a_large_batch() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    // 4,000 running jobs on attempt 2; every third input carries the stale attempt 1.
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, attempts, lease_gen, locked_until, locked_by)
         SELECT 'a', '{}', 'running', 2, 2, now() + interval '1 minute', 'w'
         FROM generate_series(1, 4000) RETURNING id",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let attempt = |i: usize| -> i64 { if i.is_multiple_of(3) { 1 } else { 2 } };
    let leases: Vec<LeaseRenewal> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| LeaseRenewal {
            id,
            fence: attempt(i),
            lease_secs: 30.0 + (i % 7) as f64,
        })
        .collect();
    let beats = lease_extend_many(&mut conn, &leases).await.unwrap();
    for (i, b) in beats.iter().enumerate() {
        let want = if attempt(i) == 2 {
            LeaseStatus::Extended {
                cancel_requested: false,
            }
        } else {
            LeaseStatus::Lost
        };
        assert_eq!(*b, want, "lease {i}");
    }
    // Each extended lease got its own length.
    let extended: Vec<&LeaseRenewal> = leases.iter().filter(|l| l.fence == 2).collect();
    let wrong: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs j JOIN unnest($1::bigint[], $2::float8[]) f(id, secs)
           ON j.id = f.id
         WHERE abs(extract(epoch FROM j.locked_until - now()) - f.secs) > 1",
    )
    .bind(extended.iter().map(|l| l.id).collect::<Vec<_>>())
    .bind(extended.iter().map(|l| l.lease_secs).collect::<Vec<_>>())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(wrong, 0);

    let fences: Vec<(i64, i64)> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, attempt(i)))
        .collect();
    let done = job_complete_many(&mut conn, &fences, None).await.unwrap();
    for (i, r) in done.iter().enumerate() {
        let want = if attempt(i) == 2 {
            FenceResult::Applied
        } else {
            FenceResult::Stale
        };
        assert_eq!(*r, want, "completion {i}");
    }
    // Completed already: the same fences again are told apart from stale ones.
    let again = job_complete_many(&mut conn, &fences[..6], None)
        .await
        .unwrap();
    assert_eq!(
        again,
        [0, 1, 2, 3, 4, 5].map(|i| if attempt(i) == 2 {
            FenceResult::AlreadyDone
        } else {
            FenceResult::Stale
        })
    );
    drop(conn);
    db.close().await;
}

/// 20,000 pending jobs, analyzed while every job is pending, then `change` without a
/// new ANALYZE: statistics that say no job is in the state `change` moves them to.
async fn analyzed_pending_then(conn: &mut sqlx::PgConnection, change: &str) {
    exec(
        conn,
        "INSERT INTO jobq.jobs (kind, payload) SELECT 'a', '{}' FROM generate_series(1, 20000)",
    )
    .await;
    exec(conn, "VACUUM ANALYZE jobq.jobs").await;
    exec(conn, change).await;
}

/// The statements of one attempt, fenced by `(id, lease generation)`, read its row by
/// primary key however many jobs run. Statistics taken while nothing ran (an idle
/// queue analyzed, then a burst) made the partial lease index look empty, and the
/// planner read every running job through it, for every fence check, completion in a
/// transaction, failure, hand-back and lease extension.
#[tokio::test]
async fn an_attempts_fenced_statements_read_its_row_only() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    analyzed_pending_then(
        &mut conn,
        "UPDATE jobq.jobs SET state = 'running', attempts = 1, lease_gen = 1,
                locked_until = now() + interval '1 hour', locked_by = 'w'",
    )
    .await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM jobq.jobs ORDER BY id LIMIT 6")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let mut read = Vec::new();
    for (step, id) in ids.into_iter().enumerate() {
        let before = tuples_read(&mut conn).await;
        let applied = match step {
            0 => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                let held = job_fence_check(&mut tx, id, 1).await.unwrap();
                tx.rollback().await.unwrap();
                held
            }
            1 => job_complete_in_tx(&mut conn, id, 1).await.unwrap(),
            2 => lease_extend_one(&mut conn, id, 1, 60.0).await.unwrap(),
            3 => job_hand_back(&mut conn, id, 1).await.unwrap(),
            // A retry, then a permanent failure.
            _ => {
                let (disposition, retry_in_secs) = if step == 4 {
                    (crate::error::Disposition::Retryable, Some(60.0))
                } else {
                    (crate::error::Disposition::Permanent, None)
                };
                let p = FailParams {
                    id,
                    fence: 1,
                    disposition,
                    code: "x",
                    message: "x",
                    retry_in_secs,
                    now: None,
                };
                job_fail(&mut conn, &p).await.unwrap().is_some()
            }
        };
        assert!(applied, "step {step} did not apply");
        read.push(tuples_read(&mut conn).await - before);
    }
    assert!(
        read.iter().all(|&n| n < 20),
        "tuples read by each statement: {read:?}"
    );
    drop(conn);
    db.close().await;
}

/// The promoter's and the reaper's updates join the rows they chose back by primary key
/// however many jobs are scheduled or running, also under statistics taken while there
/// were none: the planner had scanned every scheduled job once per promoted one.
#[tokio::test]
async fn promotion_and_reaping_join_their_rows_by_primary_key() {
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    analyzed_pending_then(
        &mut conn,
        "UPDATE jobq.jobs SET state = 'scheduled', run_after = now() - interval '1 minute'",
    )
    .await;
    let before = tuples_read(&mut conn).await;
    assert_eq!(job_promote_due(&mut conn, 500, None).await.unwrap(), 500);
    let promoted = tuples_read(&mut conn).await - before;

    exec(
        &mut conn,
        "UPDATE jobq.jobs SET state = 'running', attempts = 1, lease_gen = 1,
                locked_until = now() - interval '1 minute', locked_by = 'w'",
    )
    .await;
    let before = tuples_read(&mut conn).await;
    job_reap(&mut conn, 500, None).await.unwrap();
    let reaped = tuples_read(&mut conn).await - before;
    let requeued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobq.jobs WHERE state = 'pending'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(requeued, 500);
    assert!(
        promoted < 2_000 && reaped < 2_000,
        "tuples read: promoting 500 {promoted}, reaping 500 {reaped}"
    );
    drop(conn);
    db.close().await;
}

/// A sink that acknowledges every event.
struct Nowhere;

#[async_trait::async_trait]
impl crate::outbox::Sink for Nowhere {
    async fn publish(
        &self,
        events: &[crate::outbox::OutboxEvent],
    ) -> Vec<Result<(), crate::outbox::SinkError>> {
        events.iter().map(|_| Ok(())).collect()
    }
}

/// Seeds with `seed`, holds a snapshot open, runs `prune` on a pool of one connection
/// (its statistics are then the backend's that [`flush_stats`] flushes) and returns
/// what it counted (rows deleted, events published) and how many entries of `index` it
/// read.
async fn counted_under_a_held_snapshot<F, Fut>(seed: &str, index: &str, prune: F) -> (u64, i64)
where
    F: FnOnce(sqlx::PgPool) -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let db = jobq_testing::TestDatabase::new().await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*db.pool().connect_options()).clone())
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    exec(&mut conn, seed).await;
    let mut old = hold_snapshot(&db).await;
    let before = index_tuples_read(&mut conn, index).await;
    drop(conn);
    let deleted = prune(pool.clone()).await;
    let mut conn = pool.acquire().await.unwrap();
    let read = index_tuples_read(&mut conn, index).await - before;
    exec(&mut old, "COMMIT").await;
    drop((conn, old));
    pool.close().await;
    db.close().await;
    (deleted, read)
}

/// While a snapshot is held open, each prune batch starts where the one before ended:
/// the index entries of the rows the pass deleted stay, and a batch reading from the
/// oldest walked all of them (a pass of 30 batches read 15 times what it deleted).
/// Here for jobs, the inbox (both by the pruner) and the outbox (by a relay).
#[tokio::test]
async fn a_prune_pass_reads_past_what_it_deleted_once() {
    let pruner = |pool| {
        let config = crate::maintenance::PrunerConfig {
            batch: 100,
            ..Default::default()
        };
        async move {
            let r = crate::maintenance::Pruner::new(pool, config)
                .run_once()
                .await;
            let r = r.unwrap();
            r.total() + r.inbox
        }
    };
    let by_pruner = [
        (
            "INSERT INTO jobq.jobs (kind, payload, state, finished_at)
               SELECT 'a', '{}', 'done', now() - interval '10 days' + i * interval '1 second'
               FROM generate_series(1, 3000) i;
             ANALYZE jobq.jobs;",
            "jobs_finished_idx",
        ),
        (
            "INSERT INTO jobq.inbox (consumer, event_id, applied_at)
               SELECT 'c', gen_random_uuid(), now() - interval '40 days' + i * interval '1 second'
               FROM generate_series(1, 3000) i;
             ANALYZE jobq.inbox;",
            "inbox_applied_idx",
        ),
    ];
    for (seed, index) in by_pruner {
        let (deleted, read) = counted_under_a_held_snapshot(seed, index, pruner).await;
        assert_eq!(deleted, 3000, "{index}");
        // Each deleted row once, and the rows a batch's start shares a second with.
        assert!(read < 3_500, "{read} entries of {index}");
    }

    // The relay deletes in batches of 1,000.
    let (deleted, read) = counted_under_a_held_snapshot(
        "INSERT INTO jobq.outbox (id, event_type, agg_key, payload, published_at)
           SELECT gen_random_uuid(), 't', 'k', '{}',
                  now() - interval '10 days' + i * interval '1 second'
           FROM generate_series(1, 30000) i;
         ANALYZE jobq.outbox;",
        "outbox_published_idx",
        |pool| async move {
            let relay =
                crate::outbox::Relay::new(Nowhere).retention(std::time::Duration::from_secs(3600));
            relay.prune(&pool).await.unwrap()
        },
    )
    .await;
    assert_eq!(deleted, 30_000);
    assert!(
        read < 35_000,
        "outbox: {read} entries of outbox_published_idx"
    );
}

/// While full prune passes are slow (a snapshot held open), a pass starts where the one
/// before ended: it does not walk again the entries of what earlier passes deleted.
#[tokio::test]
async fn a_prune_pass_starts_where_the_last_one_ended_while_full_passes_are_slow() {
    let pruner = |pool: sqlx::PgPool| async move {
        let config = crate::maintenance::PrunerConfig {
            batch: 100,
            ..Default::default()
        };
        let pruner = crate::maintenance::Pruner::new(pool, config);
        // The rows finished one a second from the seed's base; a week later (the default
        // retention) the first 1,500 are due, and all of them 1,500 s after that.
        let base = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap();
        let at = |secs| Some(base.to_utc() + chrono::Duration::days(7) + secs);
        let earlier = pruner
            .run_once_at(at(chrono::Duration::milliseconds(1_500_500)))
            .await
            .unwrap();
        assert_eq!(earlier.done, 1500);
        pruner.ran_full_passes(std::time::Duration::from_secs(1));
        let later = pruner
            .run_once_at(at(chrono::Duration::seconds(3_001)))
            .await
            .unwrap();
        earlier.total() + later.total()
    };
    let (deleted, read) = counted_under_a_held_snapshot(
        "INSERT INTO jobq.jobs (kind, payload, state, finished_at)
           SELECT 'a', '{}', 'done', '2026-01-01T00:00:00Z'::timestamptz + i * interval '1 second'
           FROM generate_series(1, 3000) i;
         ANALYZE jobq.jobs;",
        "jobs_finished_idx",
        pruner,
    )
    .await;
    assert_eq!(deleted, 3000);
    // Each deleted row once: a second pass from the oldest would read 4,500.
    assert!(read < 3_500, "{read} entries of jobs_finished_idx");
}

/// While full windows are slow (a snapshot held open), a relay's window starts at the
/// first event of the window before: it does not walk again the entries of the events
/// earlier passes published.
#[tokio::test]
async fn a_relay_window_starts_where_the_last_one_began_while_full_windows_are_slow() {
    let (published, read) = counted_under_a_held_snapshot(
        "INSERT INTO jobq.outbox (id, event_type, agg_key, payload)
           SELECT gen_random_uuid(), 't', 'k' || i, '{}' FROM generate_series(1, 3000) i;
         ANALYZE jobq.outbox;",
        "outbox_unpublished_idx",
        |pool| async move {
            let relay = crate::outbox::Relay::new(Nowhere).config(crate::outbox::RelayConfig {
                batch: 100,
                window: 100,
                ..Default::default()
            });
            let mut published = relay.run_once(&pool).await.unwrap().published;
            relay.ran_full_window(std::time::Duration::from_secs(1));
            loop {
                let r = relay.run_once(&pool).await.unwrap();
                if r.claimed == 0 {
                    break;
                }
                published += r.published;
            }
            published as u64
        },
    )
    .await;
    assert_eq!(published, 3000);
    // About the window and the window before it, per pass: from the oldest, pass k
    // read the 100 × k entries of everything published before it too (46,500 in all).
    assert!(read < 10_000, "{read} entries of outbox_unpublished_idx");
}
