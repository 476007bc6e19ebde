//! Who is asking, and may they: credentials, roles, loopback-only access, and the CSRF
//! check every POST passes before any handler runs.

use std::net::SocketAddr;

use axum::body::{Body, to_bytes};
use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;

use super::Shared;

/// What a signed-in viewer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sees everything, payloads included, and takes actions.
    Admin,
    /// Sees every page but no payload, and gets 403 on every action.
    ReadOnly,
}

#[derive(Clone)]
pub(super) enum Secret {
    Bearer(String),
    Basic { user: String, password: String },
}

/// One accepted credential: its secret, the actor name it acts as, its role.
#[derive(Clone)]
pub(super) struct Credential {
    pub(super) name: String,
    pub(super) secret: Secret,
    pub(super) role: Role,
}

/// The request's viewer and where the dashboard is mounted, for handlers and templates.
#[derive(Debug, Clone)]
pub(super) struct Ctx {
    /// The actor written to audit rows.
    pub(super) actor: String,
    pub(super) role: Role,
    /// The path prefix the router is mounted under (`""` at the root).
    pub(super) base: String,
    pub(super) csrf: String,
}

impl Ctx {
    pub(super) fn sees_payloads(&self) -> bool {
        self.role == Role::Admin
    }
}

/// 32 random bytes, hex.
pub(super) fn new_csrf_token() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares without stopping at the first difference, so timing tells nothing of a
/// secret's prefix.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refuse(status: StatusCode, message: &str) -> Response {
    super::view::message(status, message)
}

/// The viewer a request authenticates as, or the response refusing it.
fn authenticate(app: &Shared, req: &Request) -> Result<(String, Role), Box<Response>> {
    let creds = &app.config.credentials;
    if creds.is_empty() {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        return match peer {
            Some(ip) if ip.is_loopback() => Ok((crate::admin::default_actor(), Role::Admin)),
            _ => Err(Box::new(refuse(
                StatusCode::FORBIDDEN,
                "this dashboard has no credentials configured and serves loopback clients only",
            ))),
        };
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let found = if let Some(token) = given.strip_prefix("Bearer ") {
        creds.iter().find(|c| match &c.secret {
            Secret::Bearer(t) => ct_eq(t.as_bytes(), token.trim().as_bytes()),
            Secret::Basic { .. } => false,
        })
    } else if let Some(b64) = given.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap_or_default();
        creds.iter().find(|c| match &c.secret {
            Secret::Basic { user, password } => {
                let mut expected = Vec::with_capacity(user.len() + password.len() + 1);
                expected.extend_from_slice(user.as_bytes());
                expected.push(b':');
                expected.extend_from_slice(password.as_bytes());
                ct_eq(&expected, &decoded)
            }
            Secret::Bearer(_) => false,
        })
    } else {
        None
    };
    match found {
        Some(c) => Ok((c.name.clone(), c.role)),
        None => {
            let mut resp = refuse(StatusCode::UNAUTHORIZED, "credentials required");
            let challenge = if creds
                .iter()
                .any(|c| matches!(c.secret, Secret::Basic { .. }))
            {
                "Basic realm=\"jobq\", charset=\"UTF-8\""
            } else {
                "Bearer realm=\"jobq\""
            };
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
            Err(Box::new(resp))
        }
    }
}

/// The prefix the router is mounted under: the original path less the routed one.
fn base_of(req: &Request) -> String {
    let routed = req.uri().path();
    let original = req
        .extensions()
        .get::<OriginalUri>()
        .map_or(routed, |o| o.0.path());
    let base = original.strip_suffix(routed).unwrap_or(original);
    base.trim_end_matches('/').to_owned()
}

/// Whether a url-encoded form body carries `csrf=<token>` (the token is hex, so it needs
/// no decoding).
fn has_csrf(body: &[u8], token: &str) -> bool {
    body.split(|b| *b == b'&').any(|pair| {
        pair.strip_prefix(b"csrf=")
            .is_some_and(|v| ct_eq(v, token.as_bytes()))
    })
}

/// The largest form body accepted (a corrected payload is at most 1 MiB of JSON, which
/// url-encoding can triple).
const MAX_FORM_BYTES: usize = 4 << 20;

/// Authenticates every request; refuses every POST of a read-only viewer (403) and every
/// POST without the CSRF token (403); hands handlers the [`Ctx`].
pub(super) async fn guard(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let (actor, role) = match authenticate(&app, &req) {
        Ok(v) => v,
        Err(resp) => return *resp,
    };
    let ctx = Ctx {
        actor,
        role,
        base: base_of(&req),
        csrf: app.csrf.clone(),
    };
    let mut req = req;
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if role != Role::Admin {
            return refuse(
                StatusCode::FORBIDDEN,
                "the read-only role can take no action",
            );
        }
        let (parts, body) = req.into_parts();
        let Ok(bytes) = to_bytes(body, MAX_FORM_BYTES).await else {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "form too large");
        };
        if !has_csrf(&bytes, &app.csrf) {
            return refuse(
                StatusCode::FORBIDDEN,
                "missing or wrong CSRF token: reload the page and try again",
            );
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    req.extensions_mut().insert(ctx);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::{ct_eq, has_csrf};

    #[test]
    fn csrf_field_must_match_exactly() {
        assert!(has_csrf(b"reason=x&csrf=ab12", "ab12"));
        assert!(has_csrf(b"csrf=ab12", "ab12"));
        assert!(!has_csrf(b"csrf=ab1", "ab12"));
        assert!(!has_csrf(b"xcsrf=ab12", "ab12"));
        assert!(!has_csrf(b"reason=csrf%3Dab12", "ab12"));
        assert!(!has_csrf(b"", "ab12"));
        assert!(ct_eq(b"abc", b"abc") && !ct_eq(b"abc", b"abd") && !ct_eq(b"ab", b"abc"));
    }
}
