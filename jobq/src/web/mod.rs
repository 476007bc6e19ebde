//! The dashboard (`web` feature): an [`axum::Router`] to mount in your own app, under any
//! path prefix, or to serve standalone with `jobq dashboard`.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use jobq::web::{Role, WebConfig};
//!
//! let config = WebConfig::new()
//!     .bearer("deploy-bot", "s3cret-token", Role::Admin)
//!     .basic("oncall", "another-secret", Role::Admin)
//!     .basic("viewer", "read-only-secret", Role::ReadOnly)
//!     .trace_url("https://tracing.example.com/trace/{trace_id}");
//! let app = axum::Router::new().nest("/jobq", jobq::web::router(pool, config));
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! axum::serve(
//!     listener,
//!     app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
//! )
//! .await?;
//! # Ok(()) }
//! ```
//!
//! Every number on its pages comes from [`crate::stats`] and [`crate::admin`], the same
//! functions the CLI prints; every action is a POST through [`crate::admin::Admin`]
//! (fenced, audited with the signed-in actor's name) carrying a CSRF token.
//!
//! # Access
//!
//! - With no credentials configured, only loopback clients are served (the peer address
//!   comes from axum's `ConnectInfo`; without it every request is refused). A reverse
//!   proxy on the same host makes every client look local: configure credentials there.
//! - With credentials, every request needs one: `Authorization: Bearer <token>` or HTTP
//!   basic auth (browsers prompt for it). Each credential has a name, written to the audit
//!   log as the actor, and a [`Role`].
//! - [`Role::ReadOnly`] sees every page but no payload (nor the payloads kept in audit
//!   rows), and gets 403 on every action.
//!
//! Payloads are never logged.

mod actions;
mod auth;
mod pages;
mod view;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use sqlx::PgPool;

pub use auth::Role;

/// How the dashboard is reached and what it shows.
#[derive(Clone)]
pub struct WebConfig {
    credentials: Vec<auth::Credential>,
    trace_url: Option<String>,
    replay_rate: f64,
    window: Duration,
    page_size: u32,
}

impl std::fmt::Debug for WebConfig {
    // Names and roles only: secrets stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field(
                "credentials",
                &self
                    .credentials
                    .iter()
                    .map(|c| (c.name.as_str(), c.role))
                    .collect::<Vec<_>>(),
            )
            .field("trace_url", &self.trace_url)
            .field("replay_rate", &self.replay_rate)
            .field("window", &self.window)
            .field("page_size", &self.page_size)
            .finish()
    }
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            credentials: Vec::new(),
            trace_url: None,
            replay_rate: 50.0,
            window: Duration::from_secs(3600),
            page_size: 50,
        }
    }
}

impl WebConfig {
    /// No credentials (loopback clients only), bulk replays at 50 jobs/s, a one-hour
    /// window, 50 jobs a page.
    pub fn new() -> Self {
        WebConfig::default()
    }

    /// Accepts `Authorization: Bearer <token>` as `name`, with `role`.
    #[must_use]
    pub fn bearer(mut self, name: impl Into<String>, token: impl Into<String>, role: Role) -> Self {
        self.credentials.push(auth::Credential {
            name: name.into(),
            secret: auth::Secret::Bearer(token.into()),
            role,
        });
        self
    }

    /// Accepts HTTP basic auth as `user` with `password`, with `role`.
    #[must_use]
    pub fn basic(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
        role: Role,
    ) -> Self {
        let user = user.into();
        self.credentials.push(auth::Credential {
            name: user.clone(),
            secret: auth::Secret::Basic {
                user,
                password: password.into(),
            },
            role,
        });
        self
    }

    /// Links a job's trace id, as `template` with `{trace_id}` replaced
    /// (`"https://tracing.example.com/trace/{trace_id}"`). Jobs carry a trace id when they
    /// were enqueued inside a traced span with the `otel` feature.
    #[must_use]
    pub fn trace_url(mut self, template: impl Into<String>) -> Self {
        self.trace_url = Some(template.into());
        self
    }

    /// The link to trace `trace_id` (32 hex digits), if a template is set.
    fn trace_link(&self, trace_id: &str) -> Option<String> {
        self.trace_url
            .as_ref()
            .map(|t| t.replace("{trace_id}", trace_id))
    }

    /// Bulk replays go at most this many jobs per second (default 50).
    #[must_use]
    pub fn replay_rate(mut self, per_sec: f64) -> Self {
        self.replay_rate = per_sec;
        self
    }

    /// How far back the overview's finished counts and charts look (default 1 h).
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Jobs per page of the list (default 50, at most 500).
    #[must_use]
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n.clamp(1, 500);
        self
    }

    /// Whether any credential is configured (without one, only loopback is served).
    pub fn has_credentials(&self) -> bool {
        !self.credentials.is_empty()
    }
}

/// What every handler shares.
#[derive(Debug)]
struct App {
    pool: PgPool,
    config: WebConfig,
    /// The CSRF token every form carries: random per router, never sent but in pages.
    csrf: String,
}

type Shared = Arc<App>;

/// The dashboard's routes, to mount with [`Router::nest`] under any prefix or serve as
/// they are. Serve with `into_make_service_with_connect_info::<SocketAddr>()` when no
/// credentials are configured, so that loopback clients can be recognised.
pub fn router(pool: PgPool, config: WebConfig) -> Router {
    let app = Arc::new(App {
        pool,
        config,
        csrf: auth::new_csrf_token(),
    });
    Router::new()
        .route("/", get(pages::overview))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/replay", post(actions::replay))
        .route("/jobs/{id}/cancel", post(actions::cancel))
        .route("/jobs/{id}/retry-now", post(actions::retry_now))
        .route("/jobs/{id}/payload", post(actions::edit_payload))
        .route("/failed", get(pages::failed))
        .route("/failed/replay", post(actions::replay_group))
        .route("/queues", get(pages::queues))
        .route("/queues/{queue}/pause", post(actions::pause))
        .route("/queues/{queue}/resume", post(actions::resume))
        .route("/audit", get(pages::audit))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::guard,
        ))
        .with_state(app)
}
