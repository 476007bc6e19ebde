//! `jobq dashboard`: serves `jobq::web::router` standalone.

use std::net::SocketAddr;

use clap::Args;
use jobq::web::{Role, WebConfig};
use sqlx::PgPool;

use super::{Failure, fail};

/// Serve the web dashboard.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Address to listen on. Without credentials only a loopback address is allowed.
    #[arg(long, default_value = "127.0.0.1:9470")]
    bind: SocketAddr,
    /// Accept `Authorization: Bearer TOKEN` as NAME with every right: `NAME:TOKEN`
    /// (repeatable).
    #[arg(long = "token", env = "JOBQ_DASHBOARD_TOKEN", hide_env_values = true)]
    tokens: Vec<String>,
    /// A bearer token of the read-only role, as `NAME:TOKEN` (repeatable).
    #[arg(
        long = "read-only-token",
        env = "JOBQ_DASHBOARD_READ_ONLY_TOKEN",
        hide_env_values = true
    )]
    read_only_tokens: Vec<String>,
    /// Accept HTTP basic auth `USER:PASSWORD` with every right (repeatable).
    #[arg(long = "basic", env = "JOBQ_DASHBOARD_BASIC", hide_env_values = true)]
    basic: Vec<String>,
    /// HTTP basic auth `USER:PASSWORD` of the read-only role (repeatable).
    #[arg(
        long = "read-only-basic",
        env = "JOBQ_DASHBOARD_READ_ONLY_BASIC",
        hide_env_values = true
    )]
    read_only_basic: Vec<String>,
    /// Link trace ids to this URL, `{trace_id}` replaced.
    #[arg(long)]
    trace_url: Option<String>,
    /// Bulk replays from the dashboard go at most this many jobs per second.
    #[arg(long, default_value_t = 50.0)]
    replay_rate: f64,
}

fn pair(s: &str, what: &str) -> Result<(String, String), Failure> {
    match s.split_once(':') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_owned(), b.to_owned())),
        _ => Err(fail("config", format!("{what} must be NAME:SECRET"))),
    }
}

pub(crate) async fn run(pool: PgPool, args: DashboardArgs) -> Result<(), Failure> {
    let mut config = WebConfig::new().replay_rate(args.replay_rate);
    for (list, role, bearer) in [
        (&args.tokens, Role::Admin, true),
        (&args.read_only_tokens, Role::ReadOnly, true),
        (&args.basic, Role::Admin, false),
        (&args.read_only_basic, Role::ReadOnly, false),
    ] {
        for s in list {
            let (name, secret) = pair(s, if bearer { "--token" } else { "--basic" })?;
            config = if bearer {
                config.bearer(name, secret, role)
            } else {
                config.basic(name, secret, role)
            };
        }
    }
    if let Some(t) = args.trace_url {
        config = config.trace_url(t);
    }
    if !config.has_credentials() && !args.bind.ip().is_loopback() {
        return Err(fail(
            "config",
            format!(
                "refusing to serve {} without credentials: bind a loopback address or pass --token / --basic",
                args.bind
            ),
        ));
    }
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| fail("bind", format!("cannot listen on {}: {e}", args.bind)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| fail("bind", e.to_string()))?;
    eprintln!("jobq dashboard on http://{addr}/");
    let app = jobq::web::router(pool, config);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| fail("serve", e.to_string()))
}
