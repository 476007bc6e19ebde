//! The dashboard in a real headless Chromium, driven over WebDriver (chromedriver): each
//! test has its own database, its own server on 127.0.0.1:0 (mounted under a prefix, as
//! a user would mount it) and its own chromedriver. Every screen visited is saved as a
//! screenshot under `target/dashboard-screenshots/` for a person to look at.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use jobq::admin::{Admin, JobQuery};
use jobq::web::{Role, WebConfig};
use jobq::{Job, JobContext, JobId, RetryPolicy, Runtime};
use jobq_testing::TestDatabase;
use serde_json::json;
use sqlx::PgPool;
use tests::{N, eventually, init_tracing, job_state};

/// Where the router is mounted in the test app.
const PREFIX: &str = "/ops/jobq";

/// A dashboard served on a free port of 127.0.0.1, nested under [`PREFIX`].
struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(pool: &PgPool, config: WebConfig) -> Server {
        let app = axum::Router::new().nest(PREFIX, jobq::web::router(pool.clone(), config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        Server { addr, task }
    }

    /// The URL of `path` under the prefix, with `user:password@` when given.
    fn url(&self, creds: Option<(&str, &str)>, path: &str) -> String {
        let auth = creds.map_or_else(String::new, |(u, p)| format!("{u}:{p}@"));
        format!("http://{auth}{}{PREFIX}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A chromedriver of this test's own, on a free port, and a headless Chromium session.
struct Browser {
    driver: Child,
    client: Client,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's Chromium and ChromeDriver, installed with apt-get the first time a test of
/// this run finds them missing, so `cargo test --workspace` works on a fresh machine (as
/// `.ci/run` does); a failed install fails the tests with what to do.
fn ensure_chromium() {
    static READY: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let present = || {
        ["/usr/bin/chromium", "/usr/bin/chromedriver"]
            .iter()
            .all(|p| std::path::Path::new(p).exists())
    };
    let ready = READY.get_or_init(|| {
        if present() {
            return Ok(());
        }
        eprintln!("installing Debian's chromium and chromium-driver for the dashboard tests");
        let status = Command::new("sh")
            .args([
                "-c",
                "apt-get update -qq && apt-get install -y -qq chromium chromium-driver",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() && present() => Ok(()),
            Ok(s) => Err(format!("apt-get: {s}")),
            Err(e) => Err(format!("could not run apt-get: {e}")),
        }
    });
    if let Err(e) = ready {
        panic!(
            "the dashboard tests need Debian's chromium and chromium-driver, and installing them failed ({e}); run `apt-get install chromium chromium-driver` as root"
        );
    }
}

impl Browser {
    async fn start() -> Browser {
        ensure_chromium();
        let port = free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) must be installed");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1100,800"]
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session from chromedriver: {e}"),
            }
        };
        Browser { driver, client }
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The element `css` selects, once it is there.
    async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    async fn text(&self, css: &str) -> String {
        self.text_where(css, |_| true).await
    }

    /// The text of the element `css` selects, once it satisfies `ok`. The element is
    /// found afresh on each try: after a click, the old page may still be there, or
    /// be replaced between finding an element and reading it.
    async fn text_where(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut last = None;
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await {
                match el.text().await {
                    Ok(t) if ok(&t) => return t,
                    Ok(t) => last = Some(t),
                    Err(_) => {}
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{css} never showed the expected text; last seen: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn click(&self, css: &str) {
        self.element(css).await.click().await.unwrap();
    }

    /// Waits until the current URL contains `part` (a navigation has happened).
    async fn wait_url(&self, part: &str) {
        let arrived = eventually(Duration::from_secs(30), || async {
            self.client
                .current_url()
                .await
                .is_ok_and(|u| u.as_str().contains(part))
        })
        .await;
        assert!(arrived, "never reached a URL with {part}");
    }

    async fn fill(&self, css: &str, value: &str) {
        let el = self.client.find(Locator::Css(css)).await.unwrap();
        el.clear().await.unwrap();
        el.send_keys(value).await.unwrap();
    }

    /// Saves the page as `target/dashboard-screenshots/<name>.png`.
    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let dir = std::env::var("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
            .join("dashboard-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// POSTs a form from the page (so with the browser's credentials) and returns the
    /// status and body.
    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> (u16, String) {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect();
        let r = self
            .client
            .execute_async(
                "const [url, body, done] = arguments;
                 fetch(new URL(url, location.origin), {method: 'POST', body, redirect: 'manual',
                             headers: {'Content-Type': 'application/x-www-form-urlencoded'}})
                   .then(async r => done([r.status, await r.text()]))
                   .catch(e => done([0, String(e)]));",
                vec![json!(format!("{PREFIX}{path}")), json!(body.join("&"))],
            )
            .await
            .unwrap();
        (
            r[0].as_u64().unwrap() as u16,
            r[1].as_str().unwrap_or("").to_owned(),
        )
    }

    async fn csrf(&self) -> String {
        self.client
            .find(Locator::Css("meta[name=csrf-token]"))
            .await
            .unwrap()
            .attr("content")
            .await
            .unwrap()
            .unwrap()
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Inserts a job in `state` directly: `due`, `scheduled` (later, never attempted),
/// `retrying` (later, attempted), `running`, `done`, `failed` (with `code` and an error
/// history of one entry) or `cancelled`. Returns its id.
async fn seed(pool: &PgPool, queue: &str, kind: &str, state: &str, code: Option<&str>) -> i64 {
    let (st, attempts, later) = match state {
        "due" => ("pending", 0, false),
        "scheduled" => ("pending", 0, true),
        "retrying" => ("pending", 1, true),
        other => (other, 1, false),
    };
    sqlx::query_scalar(
        r#"INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, run_after,
               locked_until, locked_by, started_at, finished_at, last_error_code, last_error,
               first_failed_at, last_failed_at, errors)
           VALUES ($2, $1, '{"n": 1}', $3, $4,
               CASE WHEN $5 THEN now() + interval '1 hour' ELSE now() END,
               CASE WHEN $3 = 'running' THEN now() + interval '5 minutes' END,
               CASE WHEN $3 = 'running' THEN 'seed-worker' END,
               CASE WHEN $4 > 0 THEN now() - interval '2 seconds' END,
               CASE WHEN $3 IN ('done', 'failed', 'cancelled') THEN now() END,
               $6, CASE WHEN $6 IS NOT NULL THEN 'seeded failure' END,
               CASE WHEN $6 IS NOT NULL THEN now() END, CASE WHEN $6 IS NOT NULL THEN now() END,
               CASE WHEN $6 IS NOT NULL THEN jsonb_build_array(jsonb_build_object(
                   'attempt', 1, 'at', now(), 'code', $6, 'message', 'seeded failure',
                   'disposition', 'permanent')) ELSE '[]'::jsonb END)
           RETURNING id"#,
    )
    .bind(queue)
    .bind(kind)
    .bind(st)
    .bind(attempts)
    .bind(later)
    .bind(code)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The job ids the list shows, read again if the page is replaced while reading.
async fn ids_in_page(b: &Browser) -> Vec<i64> {
    let read = || async {
        let mut ids = Vec::new();
        for r in b.client.find_all(Locator::Css("tr.job")).await? {
            let id = r.attr("data-id").await?.expect("a job row has data-id");
            ids.push(id.parse::<i64>().expect("data-id is a number"));
        }
        Ok::<_, fantoccini::error::CmdError>(ids)
    };
    for _ in 0..100 {
        if let Ok(ids) = read().await {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    read().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_shows_the_seeded_counts() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    for (state, n) in [
        ("due", 3),
        ("scheduled", 2),
        ("retrying", 1),
        ("running", 1),
        ("done", 4),
    ] {
        for _ in 0..n {
            seed(pool, "mail", "send_mail", state, None).await;
        }
    }
    for _ in 0..2 {
        seed(pool, "mail", "send_mail", "failed", Some("smtp_auth")).await;
    }
    seed(pool, "reports", "build_report", "due", None).await;
    Admin::new(pool.clone())
        .actor("seed")
        .pause("reports", Some("nightly freeze"))
        .await?;

    let server = Server::start(pool, WebConfig::new()).await;
    let b = Browser::start().await;
    b.goto(&server.url(None, "")).await;
    let cell = |q: &str, col: &str| format!("#queues tr[data-queue={q}] td[data-col={col}]");
    assert_eq!(b.text(&cell("mail", "due")).await, "3");
    assert_eq!(b.text(&cell("mail", "scheduled")).await, "2");
    assert_eq!(b.text(&cell("mail", "retrying")).await, "1");
    assert_eq!(b.text(&cell("mail", "running")).await, "1/—");
    assert_eq!(b.text(&cell("mail", "done")).await, "4");
    assert_eq!(b.text(&cell("mail", "failed")).await, "2");
    assert_eq!(b.text(&cell("reports", "due")).await, "1");
    assert_eq!(
        b.text("#queues tr[data-queue=reports] [data-col=paused]")
            .await,
        "paused"
    );
    assert_eq!(b.text("#done-total").await, "4");
    assert_eq!(b.text("#failed-total").await, "2");
    // No worker serves these kinds: flagged.
    let flags = b.text("#flags").await;
    assert!(
        flags.contains("send_mail on mail") && flags.contains("unserved"),
        "{flags}"
    );
    // The same numbers as the library's stats.
    let s = jobq::stats::stats(pool).await?;
    let mail = s.queues.iter().find(|q| q.queue == "mail").unwrap();
    assert_eq!((mail.due, mail.scheduled, mail.retrying), (3, 2, 1));
    b.screenshot("overview").await;
    b.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_list_filters_and_pages() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut failed_b = Vec::new();
    for i in 0..12 {
        seed(pool, "default", "kind_a", "done", None).await;
        seed(pool, "default", "kind_b", "due", None).await;
        let id = seed(
            pool,
            "default",
            "kind_b",
            "failed",
            Some(if i % 2 == 0 { "x" } else { "y" }),
        )
        .await;
        failed_b.push(id);
    }
    failed_b.reverse(); // newest first, as the list shows them

    let server = Server::start(pool, WebConfig::new().page_size(4)).await;
    let b = Browser::start().await;
    b.goto(&server.url(None, "/jobs")).await;
    b.fill("#filters input[name=kind]", "kind_b").await;
    b.client
        .find(Locator::Css("#filters select[name=state]"))
        .await?
        .select_by_value("failed")
        .await?;
    b.click("#apply").await;
    b.wait_url("kind=kind_b").await;
    assert_eq!(ids_in_page(&b).await, failed_b[..4].to_vec());
    b.screenshot("jobs").await;
    // The next page continues below the last id, with the same filters.
    b.click("#next").await;
    b.wait_url("before=").await;
    assert_eq!(ids_in_page(&b).await, failed_b[4..8].to_vec());
    // A code narrows further; every row shown is in SQL's answer.
    b.goto(&server.url(None, "/jobs?kind=kind_b&state=failed&code=x"))
        .await;
    let want: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobq.jobs WHERE kind = 'kind_b' AND state = 'failed'
         AND last_error_code = 'x' ORDER BY id DESC LIMIT 4",
    )
    .fetch_all(pool)
    .await?;
    assert_eq!(ids_in_page(&b).await, want);
    b.close().await;
    Ok(())
}

#[derive(Debug, thiserror::Error, jobq::Classify)]
enum MailError {
    #[error("SMTP server down (attempt {0})")]
    #[jobq(retryable, code = "smtp_down")]
    Down(u32),
    #[error("SMTP credentials rejected")]
    #[jobq(permanent, code = "smtp_auth")]
    Auth,
}

/// Fails twice retryably, then permanently.
struct Flaky;

impl Job for Flaky {
    const KIND: &'static str = "dash_flaky";
    const RETRY: RetryPolicy = RetryPolicy::fixed(Duration::from_millis(10)).max(5);
    type Args = N;
    type Error = MailError;
    async fn run(ctx: JobContext, _args: N) -> Result<(), MailError> {
        if ctx.attempt() < 3 {
            Err(MailError::Down(ctx.attempt()))
        } else {
            Err(MailError::Auth)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_shows_its_error_history() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let rt = Runtime::builder(pool.clone())
        .auto_register(false)
        .register::<Flaky>()
        .queue("default", 1)
        .poll_interval(Duration::from_millis(50))
        .build()?
        .start()
        .await?;
    let id = Flaky::enqueue(pool, N { n: 7 }).await?.id;
    assert!(
        eventually(Duration::from_secs(60), || async {
            job_state(pool, id).await.0 == "failed"
        })
        .await
    );
    rt.shutdown().await;
    // As the `otel` feature stores it when the job was enqueued in a traced request.
    sqlx::query(
        r#"UPDATE jobq.jobs SET trace_context =
           '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
           WHERE id = $1"#,
    )
    .bind(id.0)
    .execute(pool)
    .await?;

    let config = WebConfig::new().trace_url("https://traces.example/trace/{trace_id}");
    let server = Server::start(pool, config).await;
    let b = Browser::start().await;
    b.goto(&server.url(None, &format!("/jobs/{id}"))).await;
    assert_eq!(b.text("#job-state").await, "failed");
    let trace = b.element("#trace a").await;
    assert_eq!(trace.text().await?, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        trace.attr("href").await?.as_deref(),
        Some("https://traces.example/trace/4bf92f3577b34da6a3ce929d0e0e4736")
    );
    let entries = b.client.find_all(Locator::Css("#errors li")).await?;
    let mut texts = Vec::new();
    for e in entries {
        texts.push(e.text().await?);
    }
    // Newest first: the permanent failure, then the two retryable ones.
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(
        texts[0].contains("attempt 3") && texts[0].contains("smtp_auth"),
        "{texts:?}"
    );
    assert!(
        texts[1].contains("attempt 2") && texts[1].contains("smtp_down"),
        "{texts:?}"
    );
    assert!(
        texts[2].contains("attempt 1") && texts[2].contains("SMTP server down (attempt 1)"),
        "{texts:?}"
    );
    // An admin on loopback sees the payload.
    assert!(b.text("#payload").await.contains("\"n\": 7"));
    b.screenshot("job-detail").await;
    b.close().await;
    Ok(())
}

#[derive(sqlx::FromRow, Debug, PartialEq)]
struct AuditEntry {
    job_id: Option<i64>,
    action: String,
    actor: String,
    reason: Option<String>,
}

async fn audit_rows(pool: &PgPool) -> Vec<AuditEntry> {
    sqlx::query_as("SELECT job_id, action, actor, reason FROM jobq.job_audit ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn admins() -> WebConfig {
    WebConfig::new()
        .basic("alice", "alice-pw", Role::Admin)
        .basic("viewer", "viewer-pw", Role::ReadOnly)
        .replay_rate(1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_replay_replays_exactly_that_group_and_audits_the_actor() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let mut group = Vec::new();
    for _ in 0..3 {
        group.push(seed(pool, "mail", "send_mail", "failed", Some("smtp_auth")).await);
    }
    let mut others = Vec::new();
    for _ in 0..2 {
        others.push(seed(pool, "mail", "send_mail", "failed", Some("bounce")).await);
        others.push(seed(pool, "mail", "other_kind", "failed", Some("smtp_auth")).await);
        others.push(seed(pool, "bulk", "send_mail", "failed", Some("smtp_auth")).await);
    }

    let server = Server::start(pool, admins()).await;
    let b = Browser::start().await;
    b.goto(&server.url(Some(("alice", "alice-pw")), "/failed"))
        .await;
    let row = "#groups tr.group[data-kind=send_mail][data-code=smtp_auth]";
    // Three rows share kind and code (queues mail and bulk): pick mail's by its count.
    let rows = b.client.find_all(Locator::Css(row)).await?;
    let mut target = None;
    for r in rows {
        if r.text().await?.starts_with("mail") {
            target = Some(r);
        }
    }
    let target = target.expect("the mail/send_mail/smtp_auth group is listed");
    assert!(target.text().await?.contains('3'));
    b.screenshot("failed").await;
    target
        .find(Locator::Css("input[name=reason]"))
        .await?
        .send_keys("SMTP credentials fixed")
        .await?;
    target
        .find(Locator::Css("button.replay-group"))
        .await?
        .click()
        .await?;
    b.text_where("#flash", |t| t.contains("replaying 3")).await;

    let pending_group = || async {
        let states: Vec<String> =
            sqlx::query_scalar("SELECT state FROM jobq.jobs WHERE id = ANY($1)")
                .bind(&group)
                .fetch_all(pool)
                .await
                .unwrap();
        states.iter().all(|s| s == "pending")
    };
    assert!(eventually(Duration::from_secs(60), pending_group).await);
    let still_failed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobq.jobs WHERE id = ANY($1) AND state = 'failed'",
    )
    .bind(&others)
    .fetch_one(pool)
    .await?;
    assert_eq!(
        still_failed,
        others.len() as i64,
        "only the group is replayed"
    );
    let audit = audit_rows(pool).await;
    let mut replayed: Vec<i64> = audit.iter().filter_map(|a| a.job_id).collect();
    replayed.sort_unstable();
    assert_eq!(replayed, group);
    assert!(audit.iter().all(|a| a.action == "replay"
        && a.actor == "alice"
        && a.reason.as_deref() == Some("SMTP credentials fixed")));
    b.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_a_queue() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    seed(pool, "mail", "send_mail", "due", None).await;
    let paused = || async {
        sqlx::query_scalar::<_, bool>("SELECT paused FROM jobq.queues WHERE name = 'mail'")
            .fetch_optional(pool)
            .await
            .unwrap()
            .unwrap_or(false)
    };

    let server = Server::start(pool, admins()).await;
    let b = Browser::start().await;
    b.goto(&server.url(Some(("alice", "alice-pw")), "/queues"))
        .await;
    let row = "#queues tr[data-queue=mail]";
    assert_eq!(b.text(&format!("{row} .status")).await, "active");
    b.fill(&format!("{row} input[name=reason]"), "provider incident")
        .await;
    b.click(&format!("{row} button.toggle")).await;
    b.text_where("#flash", |t| t.contains("mail paused")).await;
    b.text_where(&format!("{row} .status"), |t| t == "paused")
        .await;
    assert!(paused().await);
    b.screenshot("queues").await;
    b.click(&format!("{row} button.toggle")).await;
    b.text_where("#flash", |t| t.contains("mail resumed")).await;
    assert!(!paused().await);
    let audit = audit_rows(pool).await;
    let actions: Vec<(&str, &str, Option<&str>)> = audit
        .iter()
        .map(|a| (a.action.as_str(), a.actor.as_str(), a.reason.as_deref()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("pause", "alice", Some("provider incident")),
            ("resume", "alice", None)
        ]
    );
    b.goto(&server.url(Some(("alice", "alice-pw")), "/audit"))
        .await;
    assert!(b.text("#audit").await.contains("pause"));
    b.screenshot("audit").await;
    b.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_viewer_sees_no_payload_and_may_take_no_action() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    let failed = seed(pool, "mail", "send_mail", "failed", Some("smtp_auth")).await;
    let waiting = seed(pool, "mail", "send_mail", "retrying", None).await;
    // A secret in the payload, and in an audit row's payload-before/after.
    Admin::new(pool.clone())
        .actor("seed")
        .edit_payload(JobId(failed), json!({"card": "4242-SECRET"}), None)
        .await?;
    let before = audit_rows(pool).await.len();
    let done = seed(pool, "mail", "send_mail", "done", None).await;
    sqlx::query("UPDATE jobq.jobs SET output = '{\"receipt\": \"OUT-SECRET\"}' WHERE id = $1")
        .bind(done)
        .execute(pool)
        .await?;

    let server = Server::start(pool, admins()).await;
    let b = Browser::start().await;
    let viewer = Some(("viewer", "viewer-pw"));
    b.goto(&server.url(viewer, &format!("/jobs/{failed}")))
        .await;
    b.text("#payload-hidden").await;
    assert!(!b.client.source().await?.contains("4242-SECRET"));
    assert!(
        b.client.find(Locator::Css("#actions")).await.is_err(),
        "no action forms"
    );
    b.screenshot("read-only-job").await;
    b.goto(&server.url(viewer, &format!("/jobs/{done}"))).await;
    assert!(
        b.text("main")
            .await
            .contains("your role does not see outputs")
    );
    assert!(!b.client.source().await?.contains("OUT-SECRET"));
    b.goto(&server.url(viewer, "/audit")).await;
    assert!(b.text("#audit").await.contains("edit_payload"));
    assert!(!b.client.source().await?.contains("4242-SECRET"));

    // Every action, with a valid CSRF token: 403 each, nothing changes.
    let csrf = b.csrf().await;
    let actions = [
        format!("/jobs/{failed}/replay"),
        format!("/jobs/{failed}/cancel"),
        format!("/jobs/{waiting}/retry-now"),
        format!("/jobs/{failed}/payload"),
        "/failed/replay".to_owned(),
        "/queues/mail/pause".to_owned(),
        "/queues/mail/resume".to_owned(),
    ];
    for path in &actions {
        let (status, body) = b
            .post(
                path,
                &[
                    ("csrf", &csrf),
                    ("reason", "x"),
                    ("payload", "{\"n\": 2}"),
                    ("queue", "mail"),
                    ("kind", "send_mail"),
                    ("code", "smtp_auth"),
                ],
            )
            .await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("read-only"), "{path}: {body}");
    }
    assert_eq!(audit_rows(pool).await.len(), before);
    assert_eq!(job_state(pool, JobId(failed)).await.0, "failed");

    // The same token works for an admin: the refusals were the role's.
    b.goto(&server.url(Some(("alice", "alice-pw")), &format!("/jobs/{failed}")))
        .await;
    assert!(b.text("#payload").await.contains("4242-SECRET"));
    b.goto(&server.url(Some(("alice", "alice-pw")), &format!("/jobs/{done}")))
        .await;
    assert!(b.text("#output").await.contains("OUT-SECRET"));
    b.goto(&server.url(Some(("alice", "alice-pw")), &format!("/jobs/{failed}")))
        .await;
    let (status, _) = b
        .post(
            &format!("/jobs/{failed}/replay"),
            &[("csrf", &b.csrf().await)],
        )
        .await;
    assert!(status == 303 || status == 0 || status == 200, "{status}");
    assert!(
        eventually(Duration::from_secs(30), || async {
            job_state(pool, JobId(failed)).await.0 == "pending"
        })
        .await
    );
    b.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_the_csrf_token_is_refused() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    seed(pool, "mail", "send_mail", "due", None).await;
    let server = Server::start(pool, admins()).await;
    let b = Browser::start().await;
    b.goto(&server.url(Some(("alice", "alice-pw")), "/queues"))
        .await;
    for fields in [
        vec![("reason", "x")],
        vec![("csrf", "0123abcd"), ("reason", "x")],
    ] {
        let (status, body) = b.post("/queues/mail/pause", &fields).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("CSRF"), "{body}");
    }
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT paused FROM jobq.queues WHERE name = 'mail'")
            .fetch_optional(pool)
            .await?;
    assert_eq!(paused, None, "nothing was paused");
    assert!(audit_rows(pool).await.is_empty());
    // With the page's token, the same POST goes through.
    let csrf = b.csrf().await;
    let (status, _) = b
        .post("/queues/mail/pause", &[("csrf", &csrf), ("reason", "x")])
        .await;
    assert_ne!(status, 403);
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT paused FROM jobq.queues WHERE name = 'mail'")
            .fetch_optional(pool)
            .await?;
    assert_eq!(paused, Some(true));
    b.close().await;
    Ok(())
}

/// A GET of the overview over a plain socket, with an `Authorization` header when given:
/// the whole response, status line first.
async fn raw_get(addr: SocketAddr, authorization: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = authorization.map_or_else(String::new, |a| format!("Authorization: {a}\r\n"));
    s.write_all(
        format!("GET {PREFIX} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_only_loopback_is_served() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    // Served without connect info, the peer is unknown: refused, never assumed local.
    let app = axum::Router::new().nest(PREFIX, jobq::web::router(pool.clone(), WebConfig::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let b = Browser::start().await;
    b.goto(&format!("http://{addr}{PREFIX}")).await;
    let page = b.text("body").await;
    assert!(page.contains("loopback clients only"), "{page}");
    task.abort();
    // With connect info, a loopback client is served.
    let server = Server::start(pool, WebConfig::new()).await;
    b.goto(&server.url(None, "")).await;
    b.text("#queues").await;
    b.close().await;
    // With credentials: none, a wrong one, a right one (bearer or basic).
    let server = Server::start(
        pool,
        admins().bearer("deploy-bot", "bot-token", Role::Admin),
    )
    .await;
    let none = raw_get(server.addr, None).await;
    assert!(none.starts_with("HTTP/1.1 401"), "{none}");
    assert!(
        none.contains("www-authenticate: Basic realm=\"jobq\""),
        "{none}"
    );
    let wrong = raw_get(server.addr, Some("Bearer not-the-token")).await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let bearer = raw_get(server.addr, Some("Bearer bot-token")).await;
    assert!(bearer.starts_with("HTTP/1.1 200"), "{bearer}");
    assert!(bearer.contains("deploy-bot"), "the actor is shown");
    // "alice:alice-pw" in base64.
    let basic = raw_get(server.addr, Some("Basic YWxpY2U6YWxpY2UtcHc=")).await;
    assert!(basic.starts_with("HTTP/1.1 200"), "{basic}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyset_pagination_at_a_million_rows_uses_the_index() -> anyhow::Result<()> {
    init_tracing();
    let db = TestDatabase::new().await?;
    let pool = db.pool();
    sqlx::query(
        "INSERT INTO jobq.jobs (kind, queue, payload, state, attempts, finished_at, last_error_code)
         SELECT 'k' || (g % 20), 'q' || (g % 3), '{}',
                CASE WHEN g % 100 = 3 THEN 'failed' WHEN g % 5 = 4 THEN 'pending' ELSE 'done' END,
                1, CASE WHEN g % 5 < 4 THEN now() END,
                CASE WHEN g % 100 = 3 THEN 'c' || (g % 7) END
         FROM generate_series(1, 1000000) g",
    )
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE jobq.jobs").execute(pool).await?;
    let admin = Admin::new(pool.clone());
    let max: i64 = sqlx::query_scalar("SELECT max(id) FROM jobq.jobs")
        .fetch_one(pool)
        .await?;
    let deep = JobQuery::default().before(max - 600_000);

    let failed = JobQuery {
        state: Some(jobq::JobState::Failed),
        ..deep.clone()
    };
    let plan = admin.jobs_plan(&failed, 50).await?.join("\n");
    assert!(plan.contains("jobs_state_id_idx"), "{plan}");
    assert!(
        !plan.contains("Sort") && !plan.contains("Seq Scan"),
        "{plan}"
    );
    let plan = admin.jobs_plan(&deep, 50).await?.join("\n");
    assert!(
        plan.contains("Index Scan Backward using jobs_pkey"),
        "{plan}"
    );
    assert!(
        !plan.contains("Sort") && !plan.contains("Seq Scan"),
        "{plan}"
    );

    // The page itself: the 50 failed ids just below the keyset, newest first.
    let page = admin.jobs(&failed, 50).await?;
    let want: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobq.jobs WHERE state = 'failed' AND id < $1 ORDER BY id DESC LIMIT 50",
    )
    .bind(max - 600_000)
    .fetch_all(pool)
    .await?;
    assert_eq!(page.iter().map(|j| j.id).collect::<Vec<_>>(), want);
    Ok(())
}
