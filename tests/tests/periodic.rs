//! Periodic jobs: exactly one job per slot across nodes (real processes), restarts across
//! slots with each missed-slot policy (the clock given to the database, not slept),
//! daylight saving time, pause / resume / run-now, and the `#[job(cron = …)]` form.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jobq::admin::Admin;
use jobq::maintenance::SchedulerConfig;
use jobq::{JobError, Missed, Runtime, Schedule};
use jobq_testing::TestDatabase;
use tests::{N, Nodes};

#[jobq::job(kind = "ping")]
async fn ping(_args: N) -> Result<(), JobError> {
    Ok(())
}

#[jobq::job(kind = "nightly_report", cron = "0 3 * * *", tz = "Europe/Berlin")]
async fn nightly_report(_args: ()) -> Result<(), JobError> {
    Ok(())
}

fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn node(pool: &sqlx::PgPool, schedule: Schedule, grace: Duration) -> anyhow::Result<Runtime> {
    Ok(Runtime::builder(pool.clone())
        .auto_register(false)
        .periodic::<Ping>(schedule, N { n: 1 })
        .scheduler(Some(SchedulerConfig {
            grace,
            ..SchedulerConfig::default()
        }))
        .build()?)
}

fn minutely(missed: Missed) -> Schedule {
    Schedule::every(Duration::from_secs(60))
        .named("minutely")
        .missed(missed)
}

/// The slots (run_after) of the jobs of schedule `name`, in order.
async fn slots(pool: &sqlx::PgPool, name: &str) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT run_after FROM jobq.jobs WHERE idempotency_key LIKE 'schedule:' || $1 || ':%'
         ORDER BY run_after",
    )
    .bind(name)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn three_node_processes_enqueue_every_one_second_slot_exactly_once() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut nodes = Nodes(Vec::new());
    for _ in 0..3 {
        nodes.0.push(spawn_node(&db)?);
    }
    // Thirty one-second slots: the nodes run side by side for 30 s.
    let enough = tests::eventually(Duration::from_secs(150), || async {
        slots(pool, "every_second").await.len() >= 30
    })
    .await;
    assert!(enough, "three nodes did not enqueue 30 slots in 150 s");
    drop(nodes);
    let slots = slots(pool, "every_second").await;
    let mut distinct = slots.clone();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        slots.len(),
        "a slot was enqueued twice: {slots:?}"
    );
    assert_every_slot_once(&slots);
    Ok(())
}

fn spawn_node(db: &TestDatabase) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_periodic_node"))
        .env("DATABASE_URL", db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Asserts one job per one-second slot, contiguous.
fn assert_every_slot_once(slots: &[DateTime<Utc>]) {
    for pair in slots.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_milliseconds(),
            1000,
            "a slot was skipped or repeated: {slots:?}"
        );
    }
}

#[tokio::test]
async fn a_node_killed_and_replaced_three_slots_later_leaves_no_slot_behind() -> anyhow::Result<()>
{
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut first = Nodes(vec![spawn_node(&db)?]);
    let started = tests::eventually(Duration::from_secs(60), || async {
        slots(pool, "every_second").await.len() >= 3
    })
    .await;
    assert!(started, "the first node enqueued no slots");
    drop(first.0.pop().map(|mut c| {
        let _ = c.kill();
        c.wait()
    }));
    let last = *slots(pool, "every_second").await.last().unwrap();
    // Three slots pass with no node, by the database's clock.
    let passed = tests::eventually(Duration::from_secs(60), || async {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(pool)
            .await
            .unwrap();
        now >= last + chrono::Duration::milliseconds(3500)
    })
    .await;
    assert!(passed);
    assert_eq!(slots(pool, "every_second").await.last(), Some(&last));
    let _second = Nodes(vec![spawn_node(&db)?]);
    let resumed = tests::eventually(Duration::from_secs(60), || async {
        slots(pool, "every_second")
            .await
            .last()
            .is_some_and(|s| *s >= last + chrono::Duration::seconds(6))
    })
    .await;
    assert!(resumed, "the second node did not take over");
    // The node's policy is `all(max = 1000)`: the three missed slots are enqueued too.
    assert_every_slot_once(&slots(pool, "every_second").await);
    Ok(())
}

#[tokio::test]
async fn two_runtimes_firing_one_slot_enqueue_it_once() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let a = node(pool, minutely(Missed::Once), Duration::from_secs(60))?;
    let b = node(pool, minutely(Missed::Once), Duration::from_secs(60))?;
    a.scheduler()
        .register_at(Some(t("2026-05-01T12:00:30Z")))
        .await?;
    b.scheduler()
        .register_at(Some(t("2026-05-01T12:00:40Z")))
        .await?;
    let at = Some(t("2026-05-01T12:01:05Z"));
    let (sa, sb) = (a.scheduler(), b.scheduler());
    let (ra, rb) = tokio::join!(sa.run_once_at(at), sb.run_once_at(at));
    assert_eq!(ra?.enqueued + rb?.enqueued, 1);
    assert_eq!(
        slots(pool, "minutely").await,
        vec![t("2026-05-01T12:01:00Z")]
    );
    // Even a cursor moved back by hand cannot enqueue the slot again: its key is unique.
    sqlx::query("UPDATE jobq.schedules SET next_slot = $1 WHERE name = 'minutely'")
        .bind(t("2026-05-01T12:01:00Z"))
        .execute(pool)
        .await?;
    let again = a.scheduler().run_once_at(at).await?;
    assert_eq!(again.enqueued, 0);
    assert_eq!(slots(pool, "minutely").await.len(), 1);
    Ok(())
}

/// Node A enqueues 12:01 and dies; node B starts at 12:04:20, three slots later.
async fn restart_across_slots(
    missed: Missed,
    grace: Duration,
) -> anyhow::Result<Vec<DateTime<Utc>>> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let a = node(pool, minutely(missed), grace)?;
    a.scheduler()
        .register_at(Some(t("2026-05-01T12:00:30Z")))
        .await?;
    let r = a
        .scheduler()
        .run_once_at(Some(t("2026-05-01T12:01:10Z")))
        .await?;
    assert_eq!(r.enqueued, 1);
    drop(a);
    let b = node(pool, minutely(missed), grace)?;
    b.scheduler()
        .register_at(Some(t("2026-05-01T12:04:20Z")))
        .await?;
    b.scheduler()
        .run_once_at(Some(t("2026-05-01T12:04:20Z")))
        .await?;
    // A second pass of the same moment changes nothing; the next slot runs on time.
    let r = b
        .scheduler()
        .run_once_at(Some(t("2026-05-01T12:04:30Z")))
        .await?;
    assert_eq!(r.enqueued, 0);
    let r = b
        .scheduler()
        .run_once_at(Some(t("2026-05-01T12:05:01Z")))
        .await?;
    assert_eq!(r.enqueued, 1);
    let mut got = slots(pool, "minutely").await;
    assert_eq!(got.first(), Some(&t("2026-05-01T12:01:00Z")));
    assert_eq!(got.last(), Some(&t("2026-05-01T12:05:00Z")));
    got.remove(0);
    got.pop();
    Ok(got)
}

#[tokio::test]
async fn a_restart_across_slots_applies_missed_once() -> anyhow::Result<()> {
    let between = restart_across_slots(Missed::Once, Duration::from_secs(60)).await?;
    assert_eq!(between, vec![t("2026-05-01T12:04:00Z")]);
    Ok(())
}

#[tokio::test]
async fn a_restart_across_slots_applies_missed_all_with_its_max() -> anyhow::Result<()> {
    let between = restart_across_slots(Missed::All { max: 2 }, Duration::from_secs(60)).await?;
    assert_eq!(
        between,
        vec![t("2026-05-01T12:03:00Z"), t("2026-05-01T12:04:00Z")]
    );
    Ok(())
}

#[tokio::test]
async fn a_restart_across_slots_applies_missed_skip() -> anyhow::Result<()> {
    // 20 s late with a 10 s grace: 12:04 is missed too, so nothing runs until 12:05.
    let between = restart_across_slots(Missed::Skip, Duration::from_secs(10)).await?;
    assert_eq!(between, Vec::<DateTime<Utc>>::new());
    // Within the grace, the current slot still runs and only the older ones are skipped.
    let between = restart_across_slots(Missed::Skip, Duration::from_secs(30)).await?;
    assert_eq!(between, vec![t("2026-05-01T12:04:00Z")]);
    Ok(())
}

#[tokio::test]
async fn a_cron_slot_in_the_skipped_dst_hour_runs_right_after_it() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let schedule = Schedule::cron("30 2 * * *")
        .tz("Europe/Berlin")
        .named("dst");
    let rt = node(pool, schedule, Duration::from_secs(60))?;
    rt.scheduler()
        .register_at(Some(t("2026-03-28T12:00:00Z")))
        .await?;
    // 2026-03-29 02:30 does not exist in Berlin (02:00 CET → 03:00 CEST).
    let r = rt
        .scheduler()
        .run_once_at(Some(t("2026-03-29T00:59:59Z")))
        .await?;
    assert_eq!(r.enqueued, 0);
    let r = rt
        .scheduler()
        .run_once_at(Some(t("2026-03-29T01:00:05Z")))
        .await?;
    assert_eq!(r.enqueued, 1);
    // The next day's is at 02:30 CEST, 00:30 UTC.
    let next: DateTime<Utc> =
        sqlx::query_scalar("SELECT next_slot FROM jobq.schedules WHERE name = 'dst'")
            .fetch_one(pool)
            .await?;
    assert_eq!(next, t("2026-03-30T00:30:00Z"));
    assert_eq!(slots(pool, "dst").await, vec![t("2026-03-29T01:00:00Z")]);
    Ok(())
}

#[tokio::test]
async fn the_job_attribute_declares_a_berlin_nightly_schedule() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<NightlyReport>()
        .build()?;
    let names: Vec<String> = rt.scheduler().schedules().map(str::to_owned).collect();
    assert_eq!(names, vec!["nightly_report".to_owned()]);
    rt.scheduler()
        .register_at(Some(t("2026-07-01T12:00:00Z")))
        .await?;
    let r = rt
        .scheduler()
        .run_once_at(Some(t("2026-07-02T01:00:01Z")))
        .await?;
    assert_eq!(r.enqueued, 1, "03:00 CEST is 01:00 UTC");
    let (kind, payload): (String, serde_json::Value) =
        sqlx::query_as("SELECT kind, payload FROM jobq.jobs")
            .fetch_one(pool)
            .await?;
    assert_eq!(kind, "nightly_report");
    assert_eq!(payload, serde_json::Value::Null);
    Ok(())
}

#[tokio::test]
async fn two_schedules_of_one_kind_need_their_own_names() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let b = Runtime::builder(db.pool().clone())
        .auto_register(false)
        .periodic::<Ping>(Schedule::every(Duration::from_secs(60)), N { n: 1 })
        .periodic::<Ping>(Schedule::every(Duration::from_secs(120)), N { n: 2 });
    let err = b.build().unwrap_err();
    assert!(
        err.to_string().contains("two schedules are named `ping`"),
        "{err}"
    );
    let bad = Runtime::builder(db.pool().clone())
        .auto_register(false)
        .periodic::<Ping>(Schedule::cron("0 3 * * *").tz("Europe/Nowhere"), N { n: 1 })
        .build()
        .unwrap_err();
    assert_eq!(bad.code(), "invalid_schedule");
    Ok(())
}

#[tokio::test]
async fn pause_resume_and_run_now_are_audited() -> anyhow::Result<()> {
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = node(pool, minutely(Missed::Once), Duration::from_secs(60))?;
    rt.scheduler()
        .register_at(Some(t("2026-05-01T12:00:30Z")))
        .await?;
    let admin = Admin::new(pool.clone()).actor("ops");
    assert!(
        !admin
            .schedule_pause("minutely", Some("maintenance"))
            .await?
    );
    let r = rt
        .scheduler()
        .run_once_at(Some(t("2026-05-01T12:03:10Z")))
        .await?;
    assert_eq!(r.enqueued, 0, "paused");
    assert!(admin.schedule_resume("minutely", None).await?);
    let r = rt
        .scheduler()
        .run_once_at(Some(t("2026-05-01T12:03:10Z")))
        .await?;
    assert_eq!(r.slots["minutely"], vec![t("2026-05-01T12:03:00Z")], "once");
    let id = admin.schedule_run_now("minutely", Some("rerun")).await?;
    let (kind, payload): (String, serde_json::Value) =
        sqlx::query_as("SELECT kind, payload FROM jobq.jobs WHERE id = $1")
            .bind(id.0)
            .fetch_one(pool)
            .await?;
    assert_eq!(
        (kind.as_str(), payload),
        ("ping", serde_json::json!({"n": 1}))
    );
    let list = admin.schedules().await?;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].last_slot, Some(t("2026-05-01T12:03:00Z")));
    assert_eq!(list[0].last_job_state.as_deref(), Some("pending"));
    assert_eq!(list[0].expression, "every 1m");
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM jobq.job_audit WHERE detail->>'schedule' = 'minutely' ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    let actions: Vec<&str> = actions.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        vec!["schedule_pause", "schedule_resume", "schedule_run_now"]
    );
    let stats = jobq::stats::stats(pool).await?;
    assert_eq!(stats.schedules.len(), 1);
    assert_eq!(stats.schedules[0].name, "minutely");
    assert_eq!(stats.schedules[0].next_slot, t("2026-05-01T12:04:00Z"));
    let missing = admin.schedule_pause("nope", None).await.unwrap_err();
    assert_eq!(missing.code(), "not_found");
    Ok(())
}
