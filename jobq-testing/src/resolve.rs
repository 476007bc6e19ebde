//! Which PostgreSQL server tests use: `DATABASE_URL`, else the default, else a throwaway
//! cluster when PostgreSQL's binaries are installed.

use std::time::Duration;

use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::OnceCell;

use crate::cluster::{self, ClusterError};
use crate::error::Error;

/// The server tests use when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// How long a probe waits for the server to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`], as written: no connection is tried and no
/// fallback applies. [`resolve_database_url`] is what the helpers use.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// The URL of a PostgreSQL server that answers, for tests and examples:
///
/// 1. `DATABASE_URL` when it is set (it must answer: nothing else is tried);
/// 2. else [`DEFAULT_DATABASE_URL`] when something answers there;
/// 3. else, when PostgreSQL's binaries (`initdb`, `pg_ctl`) are on `PATH` or in a usual
///    install location (`/usr/lib/postgresql/*/bin`, …), a throwaway cluster started
///    once per process in a temporary directory, with trust authentication, on a free
///    port of 127.0.0.1. As root, it runs them as the `postgres` user. The cluster is
///    stopped and its directory removed about a second after the process exits.
///
/// Steps 2 and 3 are decided once per process. The server must let the URL's role create
/// databases when the URL is used by [`TestDatabase`](crate::TestDatabase).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let url = jobq_testing::resolve_database_url().await?;
/// let pool = sqlx::PgPool::connect(&url).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::Unreachable`], one line naming the URL, the cause and the fix, e.g.
/// `cannot reach PostgreSQL at postgres://postgres@127.0.0.1:5432/test (Connection refused
/// (os error 111)); set DATABASE_URL or start PostgreSQL (e.g. `pg_ctlcluster 16 main
/// start`), or install its binaries (initdb, pg_ctl) so jobq-testing can start a throwaway
/// cluster`.
pub async fn resolve_database_url() -> Result<String, Error> {
    static DEFAULT: OnceCell<Result<String, Unreachable>> = OnceCell::const_new();
    match std::env::var("DATABASE_URL") {
        Ok(url) => resolve(&url, true).await.map_err(Into::into),
        Err(_) => DEFAULT
            .get_or_init(|| resolve(DEFAULT_DATABASE_URL, false))
            .await
            .clone()
            .map_err(Into::into),
    }
}

/// The parts of [`Error::Unreachable`], cloneable so a process-wide answer can be cached.
#[derive(Debug, Clone)]
pub(crate) struct Unreachable {
    url: String,
    cause: String,
    hint: String,
}

impl From<Unreachable> for Error {
    fn from(u: Unreachable) -> Self {
        Error::Unreachable {
            url: u.url,
            cause: u.cause,
            hint: u.hint,
        }
    }
}

/// What a probe found.
enum Probe {
    /// Nothing answered (refused, timed out, unknown host).
    NoAnswer(String),
    /// A server answered and refused (authentication, missing database, bad URL).
    Refused(String),
}

async fn probe(url: &str) -> Result<(), Probe> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .map_err(|e: sqlx::Error| Probe::Refused(format!("invalid URL: {e}")))?;
    let options = options.log_statements(tracing::log::LevelFilter::Off);
    let connect = async {
        let mut conn = PgConnection::connect_with(&options).await?;
        jobq::__testing::server_ping(&mut conn).await?;
        conn.close().await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, connect).await {
        Err(_) => Err(Probe::NoAnswer(format!(
            "no answer within {}s",
            PROBE_TIMEOUT.as_secs()
        ))),
        Ok(Ok(())) => Ok(()),
        Ok(Err(sqlx::Error::Io(e))) => Err(Probe::NoAnswer(e.to_string())),
        Ok(Err(sqlx::Error::PoolTimedOut)) => Err(Probe::NoAnswer("timed out".into())),
        Ok(Err(e)) => Err(Probe::Refused(one_line(&e.to_string()))),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

const START_HINT: &str = "start PostgreSQL (e.g. `sudo pg_ctlcluster <version> main start`, `brew services start postgresql`, or `docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres`)";

/// Resolves `url`; `explicit` when the user set it (then no fallback applies).
pub(crate) async fn resolve(url: &str, explicit: bool) -> Result<String, Unreachable> {
    let shown = redact(url);
    let fail = |cause: String, hint: String| Unreachable {
        url: shown.clone(),
        cause,
        hint,
    };
    match probe(url).await {
        Ok(()) => Ok(url.to_owned()),
        Err(Probe::Refused(cause)) => Err(fail(
            cause,
            if explicit {
                "point DATABASE_URL at a database whose role may create databases".into()
            } else {
                "set DATABASE_URL to a database whose role may create databases".into()
            },
        )),
        Err(Probe::NoAnswer(cause)) if explicit => Err(fail(
            cause,
            format!(
                "DATABASE_URL is set, so nothing else is tried: fix it, unset it, or {START_HINT}"
            ),
        )),
        Err(Probe::NoAnswer(cause)) => match cluster::throwaway().await {
            Ok(cluster_url) => match probe(&cluster_url).await {
                Ok(()) => Ok(cluster_url),
                Err(Probe::NoAnswer(c) | Probe::Refused(c)) => Err(fail(
                    cause,
                    format!(
                        "the throwaway cluster at {cluster_url} started but does not answer ({c}); set DATABASE_URL or {START_HINT}"
                    ),
                )),
            },
            Err(ClusterError::NoBinaries) => Err(fail(
                cause,
                format!(
                    "set DATABASE_URL or {START_HINT}, or install its binaries (initdb, pg_ctl) so jobq-testing can start a throwaway cluster"
                ),
            )),
            Err(ClusterError::Failed(why)) => Err(fail(
                cause,
                format!(
                    "a throwaway cluster could not be started either ({}); set DATABASE_URL or {START_HINT}",
                    one_line(&why)
                ),
            )),
        },
    }
}

/// `url` with the password, if any, replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic is how a test reports failure
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db?x=@"), "postgres://h/db?x=@");
        assert_eq!(redact("not a url"), "not a url");
    }

    /// A port nothing listens on: bind one, then let it go.
    fn dead_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        format!("postgres://postgres:pw@127.0.0.1:{port}/test")
    }

    #[tokio::test]
    async fn an_explicit_url_that_does_not_answer_is_one_line_that_says_what_to_do() {
        let url = dead_url();
        let err = Error::from(resolve(&url, true).await.unwrap_err()).to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(
            err.starts_with("cannot reach PostgreSQL at postgres://postgres:***@127.0.0.1:"),
            "{err}"
        );
        assert!(!err.contains("pw@"), "password shown: {err}");
        assert!(err.contains("DATABASE_URL"), "{err}");
        assert!(err.contains("start PostgreSQL"), "{err}");
    }

    #[tokio::test]
    async fn a_silent_default_falls_back_to_a_throwaway_cluster() {
        if find_bins_or_skip() {
            return;
        }
        let started = std::time::Instant::now();
        let url = resolve(&dead_url(), false).await.unwrap();
        assert!(url.starts_with("postgres://postgres@127.0.0.1:"), "{url}");
        // It works, and it can host test databases.
        let db = crate::TestDatabase::on_server(&url, 2).await.unwrap();
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(one, 1);
        let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobq.jobs")
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(jobs, 0);
        db.close().await;
        // Once per process: the second resolution reuses the cluster.
        assert_eq!(resolve(&dead_url(), false).await.unwrap(), url);
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    fn find_bins_or_skip() -> bool {
        let found = std::process::Command::new("sh")
            .args([
                "-c",
                "command -v initdb || ls /usr/lib/postgresql/*/bin/initdb",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("skipped: PostgreSQL's binaries (initdb, pg_ctl) are not installed");
        }
        !found
    }
}
