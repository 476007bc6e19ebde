//! The `jobq` binary end to end: each command run as a process against a real database,
//! its `--json` output parsed and its tables checked.

use std::process::{Command, Output};

use jobq_testing::TestDatabase;
use serde_json::Value;

fn url(db: &TestDatabase) -> String {
    let base = jobq_testing::database_url();
    let (server, _) = base.rsplit_once('/').unwrap_or((&base, ""));
    format!("{server}/{}", db.name())
}

fn jobq(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jobq"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("USER", "ops-test")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the jobq binary runs")
}

/// Runs a command that must succeed; returns its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let out = jobq(url, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "jobq {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs a command that must fail; returns its stderr.
fn err(url: &str, args: &[&str]) -> String {
    let out = jobq(url, args);
    assert!(!out.status.success(), "jobq {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = ok(url, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

async fn seed(db: &TestDatabase) {
    sqlx::raw_sql(
        r#"
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, max_attempts, started_at,
                               finished_at, last_error_code, last_error, errors)
            SELECT 'send_invoice', 'mail', jsonb_build_object('invoice_id', i), 'failed', 3, 3,
                   now() - interval '70 seconds', now() - interval '10 seconds',
                   CASE WHEN i <= 4 THEN 'smtp_auth' ELSE 'bad_address' END,
                   'the mail server said no',
                   jsonb_build_array(jsonb_build_object('attempt', 3, 'at', now(),
                       'code', 'smtp_auth', 'message', 'the mail server said no',
                       'disposition', 'retryable'))
            FROM generate_series(1, 5) i;
        INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, started_at, finished_at)
            SELECT 'send_invoice', 'mail', '{}', 'done', 1, now() - interval '2 seconds', now()
            FROM generate_series(1, 10);
        INSERT INTO jobq.jobs (kind, queue, payload, run_after, created_at)
            VALUES ('report', 'mail', '{}', now() - interval '5 minutes', now() - interval '1 hour');
        INSERT INTO jobq.jobs (kind, queue, payload, run_after, attempts)
            VALUES ('report', 'mail', '{}', now() + interval '1 hour', 1);
        INSERT INTO jobq.jobs (kind, queue, payload, state, finished_at)
            SELECT 'old', 'mail', '{}', 'done', now() - interval '8 days' FROM generate_series(1, 3);
        "#,
    )
    .execute(db.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_failed_show_and_errors() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    assert!(ok(&url, &["migrate"]).contains("version"));
    seed(&db).await;

    let s = json(&url, &["status"]);
    let mail = &s["queues"].as_array().unwrap()[0];
    assert_eq!(mail["queue"], "mail");
    assert_eq!(
        (mail["due"].as_i64(), mail["retrying"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (mail["done"].as_i64(), mail["failed"].as_i64()),
        (Some(10), Some(5))
    );
    let age = mail["oldest_due_created_age_secs"].as_f64().unwrap();
    assert!((3590.0..3700.0).contains(&age), "{age}");
    let report = s["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "report")
        .unwrap();
    assert_eq!(report["unserved"], true);
    let codes: Vec<(String, i64)> = s["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap().to_owned(),
                f["failed"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        vec![("bad_address".to_owned(), 1), ("smtp_auth".to_owned(), 4)]
    );

    let table = ok(&url, &["status"]);
    for needle in [
        "QUEUES (finished counts: last 1h00m)",
        "QUEUE  STATE   DUE  SCHEDULED  RETRYING  RUNNING  OLDEST DUE",
        "mail   active  1    0          1         0/-      5m00s",
        "UNSERVED",
        "FAILURES BY CODE",
        "send_invoice  smtp_auth    4",
        "RUN TIMES",
        "WORKERS (0 live)",
    ] {
        assert!(table.contains(needle), "no `{needle}` in\n{table}");
    }

    let failed = json(&url, &["failed", "--code", "smtp_auth"]);
    assert_eq!(failed.as_array().unwrap().len(), 4);
    let table = ok(&url, &["failed", "--kind", "send_invoice", "--since", "1h"]);
    assert!(
        table.starts_with("ID  QUEUE  KIND          STATE   ATTEMPTS  CODE"),
        "{table}"
    );
    assert!(table.contains("(5 jobs)"), "{table}");
    assert!(ok(&url, &["failed", "--until", "1h"]).contains("(0 jobs)"));

    let show = json(&url, &["show", "1"]);
    assert_eq!(show["job"]["id"], 1);
    assert_eq!(show["job"]["errors"][0]["code"], "smtp_auth");
    assert_eq!(show["audit"], Value::Array(vec![]));
    let text = ok(&url, &["show", "1"]);
    assert!(text.contains("state             failed"), "{text}");
    assert!(text.contains("ERRORS\nATTEMPT  AT"), "{text}");

    assert!(err(&url, &["show", "999"]).contains("error: no such job: 999"));
    let e = err(&url, &["--json", "show", "999"]);
    let e: Value = serde_json::from_str(&e).unwrap();
    assert_eq!(e["error"]["code"], "not_found");
    assert!(err(&url, &["show", "abc"]).contains("invalid value 'abc'"));
    let unreachable = err(
        "postgres://postgres:secret@127.0.0.1:1/nowhere",
        &["status"],
    );
    assert!(
        unreachable
            .contains("cannot reach the database at postgres://postgres:***@127.0.0.1:1/nowhere"),
        "{unreachable}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_jobq"))
        .arg("status")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("set DATABASE_URL"));
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_cancel_retry_pause_resume_and_prune() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    seed(&db).await;

    // One job.
    let t = json(&url, &["replay", "5", "--reason", "fixed the address"]);
    assert_eq!(
        (t["before"].as_str(), t["after"].as_str()),
        (Some("failed"), Some("pending"))
    );
    assert!(
        err(&url, &["replay", "5"])
            .contains("job 5 is pending; replay applies only to failed or cancelled jobs")
    );

    // Many: refused without --yes, a dry run counts, --yes replays at the rate.
    assert!(err(&url, &["replay", "--code", "smtp_auth"]).contains("refusing without --yes"));
    let dry = json(&url, &["replay", "--code", "smtp_auth", "--dry-run"]);
    assert_eq!(
        (dry["matched"].as_u64(), dry["replayed"].as_u64()),
        (Some(4), Some(0))
    );
    let r = json(
        &url,
        &[
            "replay",
            "--code",
            "smtp_auth",
            "--rate",
            "100/s",
            "--yes",
            "--reason",
            "rotated",
        ],
    );
    assert_eq!(
        (r["matched"].as_u64(), r["replayed"].as_u64()),
        (Some(4), Some(4))
    );
    assert!(err(&url, &["replay", "--rate", "fast", "--code", "x"]).contains("not a rate"));
    assert!(err(&url, &["replay"]).contains("give a job id, or at least one filter"));

    // Cancel one; several need --yes.
    let c = json(&url, &["cancel", "1"]);
    assert_eq!(
        (c[0]["before"].as_str(), c[0]["after"].as_str()),
        (Some("pending"), Some("cancelled"))
    );
    assert!(err(&url, &["cancel", "2", "3"]).contains("refusing without --yes"));
    assert!(
        ok(&url, &["cancel", "2", "3", "--yes"]).contains("job 3 cancelled: pending -> cancelled")
    );
    // A bulk cancel that stops on an error still reports what it cancelled before it.
    let out = jobq(&url, &["cancel", "4", "999999", "18", "--yes"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("job 4 cancelled: pending -> cancelled"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stopped at job 999999 after cancelling 1 job(s)"),
        "{stderr}"
    );

    // Retry now: the report job waiting for its retry (id 17).
    assert!(ok(&url, &["retry-now", "17"]).contains("job 17 is due now"));
    assert!(
        err(&url, &["retry-now", "17"])
            .contains("job 17 is pending; retry-now applies only to scheduled jobs")
    );

    // Pause and resume.
    assert!(err(&url, &["pause", "nope"]).contains("error: no such queue: nope"));
    let p = json(&url, &["pause", "mail", "--reason", "provider outage"]);
    assert_eq!(
        (p["was_paused"].as_bool(), p["paused"].as_bool()),
        (Some(false), Some(true))
    );
    let s = json(&url, &["status"]);
    assert_eq!(s["queues"][0]["paused"], true);
    assert!(ok(&url, &["status"]).contains("mail   paused"));
    assert!(ok(&url, &["resume", "mail"]).contains("queue mail resumed"));

    // The audit trail, newest first, by $USER.
    let audit = json(&url, &["audit", "--limit", "100"]);
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        vec![
            "resume",
            "pause",
            "retry_now",
            "cancel",
            "cancel",
            "cancel",
            "cancel",
            "replay",
            "replay",
            "replay",
            "replay",
            "replay"
        ]
    );
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["actor"] == "ops-test")
    );
    let shown = json(&url, &["--actor", "someone", "show", "5"]);
    assert_eq!(shown["audit"][0]["reason"], "fixed the address");

    // Prune: a dry run counts the 3 old done jobs; the real run needs --yes.
    let d = json(&url, &["prune", "--dry-run"]);
    assert_eq!(d["report"]["done"], 3);
    assert_eq!(d["dry_run"], true);
    assert!(err(&url, &["prune"]).contains("Delete 3 jobs? — refusing without --yes"));
    assert!(
        ok(&url, &["prune", "--yes"]).contains("deleted 3 jobs: 3 done, 0 failed, 0 cancelled")
    );
    assert!(ok(&url, &["prune", "--dry-run"]).contains("would delete 0 jobs"));
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_payload_fixes_a_failed_job_before_its_replay() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    seed(&db).await;

    // Job 5 failed with a bad address; give it a corrected payload, then replay it.
    let t = json(
        &url,
        &[
            "edit-payload",
            "5",
            r#"{"invoice_id": 5, "to": "billing@example.com"}"#,
            "--reason",
            "typo in the address",
        ],
    );
    assert_eq!(
        (t["before"].as_str(), t["after"].as_str()),
        (Some("failed"), Some("failed"))
    );
    let file = std::env::temp_dir().join(format!("jobq-payload-{}.json", db.name()));
    std::fs::write(&file, r#"{"invoice_id": 4}"#).unwrap();
    assert!(
        ok(
            &url,
            &["edit-payload", "4", &format!("@{}", file.display())]
        )
        .contains("job 4 payload replaced (still failed); `jobq replay 4` runs it again")
    );
    std::fs::remove_file(&file).unwrap();
    let payloads: Vec<(i64, Value)> =
        sqlx::query_as("SELECT id, payload FROM jobq.jobs WHERE id IN (4, 5) ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(payloads[0].1, serde_json::json!({"invoice_id": 4}));
    assert_eq!(payloads[1].1["to"], "billing@example.com");

    // The audit row keeps the payload before and after.
    let shown = json(&url, &["show", "5"]);
    let audit = &shown["audit"][0];
    assert_eq!(
        (audit["action"].as_str(), audit["reason"].as_str()),
        (Some("edit_payload"), Some("typo in the address"))
    );
    assert_eq!(
        audit["detail"]["payload_before"],
        serde_json::json!({"invoice_id": 5})
    );
    assert_eq!(
        audit["detail"]["payload_after"]["to"],
        "billing@example.com"
    );

    // Refused: text that is not JSON, a file that is not there, a job that is not
    // failed or cancelled (the done job 6), a job that does not exist.
    assert!(err(&url, &["edit-payload", "5", "{nope"]).contains("the payload is not JSON"));
    assert!(
        err(&url, &["edit-payload", "5", "@/nonexistent/payload.json"])
            .contains("reading /nonexistent/payload.json")
    );
    assert!(
        err(&url, &["edit-payload", "6", "{}"])
            .contains("job 6 is done; edit-payload applies only to failed or cancelled jobs")
    );
    assert!(err(&url, &["edit-payload", "999", "{}"]).contains("999"));
    db.close().await;
}

struct Nightly;

impl jobq::Job for Nightly {
    const KIND: &'static str = "nightly_report";
    type Args = ();
    type Error = jobq::JobError;
    async fn run(_ctx: jobq::JobContext, _args: ()) -> Result<(), jobq::JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_list_pause_resume_and_run_now() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    let rt = jobq::Runtime::builder(db.pool().clone())
        .auto_register(false)
        .periodic::<Nightly>(
            jobq::Schedule::cron("0 3 * * *")
                .tz("Europe/Berlin")
                .named("nightly"),
            (),
        )
        .build()
        .unwrap();
    let at: chrono::DateTime<chrono::Utc> = "2026-07-01T12:00:00Z".parse().unwrap();
    rt.scheduler().register_at(Some(at)).await.unwrap();
    rt.scheduler()
        .run_once_at(Some("2026-07-02T01:00:02Z".parse().unwrap()))
        .await
        .unwrap();

    let list = json(&url, &["schedules"]);
    let s = &list[0];
    assert_eq!(s["name"], "nightly");
    assert_eq!(s["kind"], "nightly_report");
    assert_eq!(s["expression"], "0 3 * * *");
    assert_eq!(s["tz"], "Europe/Berlin");
    assert_eq!(s["next_slot"], "2026-07-03T01:00:00Z");
    assert_eq!(s["last_slot"], "2026-07-02T01:00:00Z");
    assert_eq!(s["last_job_state"], "pending");
    assert_eq!(s["paused"], false);
    let table = ok(&url, &["schedules"]);
    assert!(
        table.contains("nightly") && table.contains("Europe/Berlin"),
        "{table}"
    );

    let p = json(
        &url,
        &["schedule", "pause", "nightly", "--reason", "freeze"],
    );
    assert_eq!(
        (p["was_paused"].as_bool(), p["paused"].as_bool()),
        (Some(false), Some(true))
    );
    assert!(ok(&url, &["schedules"]).contains("paused by ops-test"));
    assert_eq!(json(&url, &["schedules"])[0]["paused"], true);
    let r = json(&url, &["schedule", "resume", "nightly"]);
    assert_eq!(r["was_paused"], true);
    let n = json(
        &url,
        &["schedule", "run-now", "nightly", "--reason", "rerun"],
    );
    let id = n["job"].as_i64().unwrap();
    let kind: String = sqlx::query_scalar("SELECT kind FROM jobq.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(kind, "nightly_report");
    assert!(err(&url, &["schedule", "pause", "nope"]).contains("nope"));

    let audit = json(&url, &["audit"]);
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["action"].as_str())
        .collect();
    for a in ["schedule_pause", "schedule_resume", "schedule_run_now"] {
        assert!(actions.contains(&a), "{actions:?}");
    }
    assert!(ok(&url, &["audit"]).contains("schedule nightly"));
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_honours_per_kind_retention() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    ok(&url, &["migrate"]);
    sqlx::raw_sql(
        "INSERT INTO jobq.jobs (kind, payload, state, finished_at)
             SELECT k, '{}', s, now() - interval '2 days'
             FROM unnest(ARRAY['audit_log', 'thumbnail']) k,
                  unnest(ARRAY['done', 'failed']) s,
                  generate_series(1, 2);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // Done jobs go after a day, except audit_log's, kept a week; failed ones after a
    // day for audit_log only.
    let args = [
        "prune",
        "--done-after",
        "1d",
        "--kind-retention",
        "audit_log=7d,1d",
        "--yes",
    ];
    let out = json(&url, &args);
    assert_eq!(out["report"]["done"], 2, "{out}");
    assert_eq!(out["report"]["failed"], 2, "{out}");
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, state FROM jobq.jobs GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        left,
        [
            ("audit_log".to_owned(), "done".to_owned()),
            ("thumbnail".to_owned(), "failed".to_owned())
        ]
    );
    assert!(err(&url, &["prune", "--kind-retention", "no-equals"]).contains("KIND=DONE"));
    db.close().await;
}

/// `jobq dashboard`: refuses a non-loopback address without credentials; on loopback it
/// serves the overview; with a token, requests without it get 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_serves_loopback_and_refuses_an_open_bind_without_credentials() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    let e = err(&url, &["dashboard", "--bind", "0.0.0.0:0"]);
    assert!(e.contains("without credentials"), "{e}");
    // `jobq show` prints a job's recorded output.
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO jobq.jobs (kind, payload, state, finished_at, output)
         VALUES ('k', '{}', 'done', now(), '{\"receipt\": 77}') RETURNING id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let shown = ok(&url, &["show", &id.to_string()]);
    assert!(shown.contains(r#"{"receipt":77}"#), "{shown}");
    assert_eq!(
        json(&url, &["show", &id.to_string()])["job"]["output"]["receipt"],
        77
    );

    let get = |port: u16, auth: Option<&'static str>| async move {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let auth = auth.map_or_else(String::new, |a| format!("Authorization: {a}\r\n"));
        let req = format!("GET / HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    for (extra, auth, want) in [
        (vec![], None, "HTTP/1.1 200"),
        (vec!["--token", "ci:tok"], None, "HTTP/1.1 401"),
        (
            vec!["--token", "ci:tok"],
            Some("Bearer tok"),
            "HTTP/1.1 200",
        ),
    ] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bind = format!("127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobq"))
            .args(["dashboard", "--bind", &bind])
            .args(&extra)
            .env("DATABASE_URL", &url)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let answer = loop {
            if let Some(a) = get(port, auth).await {
                break a;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the dashboard never answered"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(answer.starts_with(want), "{extra:?} {auth:?}: {answer}");
    }
}

#[tokio::test]
async fn outbox_lists_stuck_events_replays_one_and_status_shows_the_lag() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    let mut tx = db.pool().begin().await.unwrap();
    let stuck = jobq::outbox::publish(
        &mut tx,
        jobq::outbox::Event::new("order_paid", &1).aggregate("order", 7, 1),
    )
    .await
    .unwrap();
    let fresh = jobq::outbox::publish(&mut tx, jobq::outbox::Event::new("order_paid", &2))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "UPDATE jobq.outbox SET attempts = 3, last_error_code = 'nats_stream_not_found' WHERE id = $1",
    )
    .bind(stuck)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE jobq.outbox SET published_at = now() WHERE id = $1")
        .bind(fresh)
        .execute(db.pool())
        .await
        .unwrap();

    let listed = json(&url, &["outbox"]);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [stuck.to_string()]);
    let table = ok(&url, &["outbox"]);
    assert!(
        table.contains("nats_stream_not_found") && table.contains("order:7"),
        "{table}"
    );

    let status = json(&url, &["status"]);
    assert_eq!(status["outbox"]["lag"][0]["event_type"], "order_paid");
    assert_eq!(status["outbox"]["lag"][0]["unpublished"], 1);
    assert!(ok(&url, &["status"]).contains("OUTBOX"));

    // Replaying a published event sends it again, audited.
    ok(
        &url,
        &[
            "outbox",
            "--replay",
            &fresh.to_string(),
            "--reason",
            "lost downstream",
        ],
    );
    let audit: (String, Option<String>, String) = sqlx::query_as(
        "SELECT actor, reason, before_state FROM jobq.job_audit WHERE action = 'outbox_replay'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        audit,
        (
            "ops-test".into(),
            Some("lost downstream".into()),
            "published".into()
        )
    );
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobq.outbox WHERE published_at IS NULL")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(unpublished, 2);
    let missing = err(
        &url,
        &[
            "outbox",
            "--replay",
            &jobq::outbox::Uuid::now_v7().to_string(),
        ],
    );
    assert!(
        missing.contains("not_found") || missing.contains("no such event"),
        "{missing}"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpark_lets_a_parked_key_proceed_and_show_says_what_it_waits_behind() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    let (failed, parked): (i64, i64) = sqlx::query_as(
        "WITH f AS (
             INSERT INTO jobq.jobs (kind, payload, state, finished_at, last_error_code,
                                    ordering_scope, ordering_key)
             VALUES ('sync', '{}', 'failed', now(), 'boom', 'sync', 'acct-1') RETURNING id
         ),
         b AS (
             INSERT INTO jobq.jobs (kind, payload, ordering_scope, ordering_key, blocked_by)
             SELECT 'sync', '{}', 'sync', 'acct-1', id FROM f RETURNING id
         )
         SELECT f.id, b.id FROM f, b",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let show = ok(&url, &["show", &parked.to_string()]);
    assert!(
        show.contains(&format!("parked behind job {failed} (failed)")),
        "{show}"
    );
    assert!(show.contains("acct-1 (scope sync)"), "{show}");
    let status = ok(&url, &["status"]);
    assert!(status.contains("PARKED KEYS (1 jobs parked"), "{status}");
    let s = json(&url, &["status"]);
    assert_eq!(s["parked_keys"][0]["blocker"].as_i64(), Some(failed));
    assert_eq!(s["queues"][0]["parked"].as_i64(), Some(1));

    let e = err(&url, &["--json", "unpark", "acct-1"]);
    let e: Value = serde_json::from_str(&e).unwrap();
    assert_eq!(e["error"]["code"], "skip_failed_required");
    let out = ok(
        &url,
        &[
            "unpark",
            "acct-1",
            "--skip-failed",
            "--reason",
            "gave up on it",
        ],
    );
    assert!(
        out.contains(&format!(
            "failed job(s) {failed} skipped (still failed), 1 job(s) released"
        )),
        "{out}"
    );
    let f = json(&url, &["show", &failed.to_string()]);
    assert_eq!(f["job"]["state"], "failed");
    assert_eq!(f["job"]["ordering_skipped"], true);
    assert_eq!(f["audit"][0]["action"], "unpark");
    assert_eq!(f["audit"][0]["actor"], "ops-test");
    assert_eq!(f["audit"][0]["reason"], "gave up on it");
    let b = json(&url, &["show", &parked.to_string()]);
    assert_eq!(b["job"]["blocked_by"], Value::Null);
    let again = err(&url, &["--json", "unpark", "acct-1", "--skip-failed"]);
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["error"]["code"], "not_found");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_list_set_and_clear() {
    let db = TestDatabase::new().await.unwrap();
    let url = url(&db);
    // A runtime's code limit, as `Runtime::start` writes it.
    sqlx::query(
        "INSERT INTO jobq.limits (scope, name, source, concurrency, per_key)
         VALUES ('kind', 'deliver', 'code', 5, true)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, payload, state, locked_until, locked_by, concurrency_key)
         SELECT 'deliver', '{}', 'running', now() + interval '1 minute', 'w', k
         FROM unnest(ARRAY['a', 'a', 'b']) k",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let rows = json(&url, &["limits"]);
    assert_eq!(rows[0]["name"], "deliver");
    assert_eq!(rows[0]["concurrency"], 5);
    assert_eq!(rows[0]["running"], 3);
    assert_eq!(rows[0]["busiest_key_running"], 2);
    assert_eq!(rows[0]["source"], "code");

    ok(
        &url,
        &[
            "limit",
            "set",
            "deliver",
            "--concurrency",
            "3",
            "--rate",
            "50/s",
            "--burst",
            "10",
            "--reason",
            "provider asked",
        ],
    );
    ok(
        &url,
        &["limit", "set", "--queue", "mail", "--concurrency", "20"],
    );
    let rows = json(&url, &["limits"]);
    assert_eq!(rows[0]["concurrency"], 3);
    assert_eq!(rows[0]["rate_count"], 50);
    assert_eq!(rows[0]["burst"], 10);
    assert_eq!(rows[0]["tokens"], 10.0);
    assert_eq!(rows[0]["source"], "code+operator");
    assert_eq!(rows[0]["updated_by"], "ops-test");
    assert_eq!(
        (rows[1]["scope"].as_str(), rows[1]["concurrency"].as_i64()),
        (Some("queue"), Some(20))
    );
    let table = ok(&url, &["limits"]);
    assert!(table.contains("2 of 3 per key (busiest key)"), "{table}");
    assert!(table.contains("50/s burst 10"), "{table}");

    // Bad input is a classified error, not a crash.
    assert!(err(&url, &["limit", "set", "deliver", "--rate", "50/day"]).contains("50/day"));
    assert!(
        err(&url, &["limit", "set", "--queue", "mail", "--rate", "5/s"]).contains("invalid_limit")
    );
    assert!(err(&url, &["limit", "set", "deliver"]).contains("empty_limit"));

    let cleared = json(
        &url,
        &["limit", "set", "deliver", "--clear", "--reason", "over"],
    );
    assert_eq!(cleared["changed"], true);
    let rows = json(&url, &["limits"]);
    assert_eq!(
        (
            rows[0]["concurrency"].as_i64(),
            rows[0]["rate_count"].as_i64()
        ),
        (Some(5), None)
    );
    let audit: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT action, actor, reason FROM jobq.job_audit WHERE action LIKE 'limit_%' ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(audit.len(), 3);
    assert_eq!(
        audit[0],
        (
            "limit_set".into(),
            "ops-test".into(),
            Some("provider asked".into())
        )
    );
    assert_eq!(audit[2].0, "limit_clear");
    db.close().await;
}
