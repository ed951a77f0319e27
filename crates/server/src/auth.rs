//! Bearer tokens on the admin API: a `read` token may GET, a `write` token
//! may do everything. Health, readiness and metrics stay open so probes and
//! scrapers need no secret. No token configured leaves the API open.

use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use llmgw_config::{AdminRole, AdminToken, Secret};

use crate::api::ApiError;

/// Paths anyone may call.
const OPEN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// The tokens this peer accepts. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    tokens: Arc<Vec<Accepted>>,
}

#[derive(Debug)]
struct Accepted {
    name: String,
    role: AdminRole,
    secret: Secret,
}

impl AdminAuth {
    /// Reads every token (token files included). Errors name the token and
    /// file, never the secret.
    pub fn from_config(tokens: &[AdminToken]) -> Result<Self, String> {
        let mut accepted: Vec<Accepted> = Vec::new();
        for token in tokens {
            let secret = token.secret()?;
            if let Some(other) = accepted.iter().find(|a| a.secret == secret) {
                return Err(format!(
                    "admin tokens {:?} and {:?} are the same token; every token must differ",
                    other.name, token.name
                ));
            }
            accepted.push(Accepted {
                name: token.name.clone(),
                role: token.role,
                secret,
            });
        }
        Ok(AdminAuth {
            tokens: Arc::new(accepted),
        })
    }

    /// No tokens: every request is let through.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    fn find(&self, presented: &str) -> Option<&Accepted> {
        // Every token is compared in full, so timing does not tell how much
        // of a guess was right.
        let mut found = None;
        for token in self.tokens.iter() {
            if constant_time_eq(token.secret.expose().as_bytes(), presented.as_bytes()) {
                found = Some(token);
            }
        }
        found
    }

    fn check(
        &self,
        method: &Method,
        path: &str,
        authorization: Option<&HeaderValue>,
    ) -> Result<(), Refusal> {
        if self.is_open()
            || OPEN_PATHS.contains(&path)
            || (*method == Method::GET && crate::api::console::is_asset(path))
        {
            return Ok(());
        }
        let Some(value) = authorization else {
            return Err(Refusal::Missing);
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or(Refusal::Malformed)?;
        let token = self.find(presented).ok_or(Refusal::Unknown)?;
        let needs = needed_role(method, path);
        if token.role < needs {
            return Err(Refusal::Role {
                name: token.name.clone(),
                has: token.role,
                needs,
            });
        }
        Ok(())
    }

    /// Puts the token check in front of every route of `router`.
    pub fn protect(&self, router: Router) -> Router {
        router.layer(middleware::from_fn_with_state(self.clone(), require_token))
    }
}

fn needed_role(method: &Method, path: &str) -> AdminRole {
    // A router holding a request for a model scaled to zero asks for a
    // replica with the read token it polls with: waking starts at most the
    // replica the model's own autoscale policy allows.
    let wake =
        *method == Method::POST && path.starts_with("/api/v1/models/") && path.ends_with("/wake");
    // Routers report what their keys used with the same token: a report
    // only adds to usage figures, and each router's are numbered.
    let usage_report = *method == Method::POST && path == "/api/v1/usage";
    if wake || usage_report || matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        AdminRole::Read
    } else {
        AdminRole::Write
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

enum Refusal {
    Missing,
    Malformed,
    Unknown,
    Role {
        name: String,
        has: AdminRole,
        needs: AdminRole,
    },
}

async fn require_token(State(auth): State<AdminAuth>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let refusal = match auth.check(&method, &path, request.headers().get(header::AUTHORIZATION)) {
        Ok(()) => return next.run(request).await,
        Err(refusal) => refusal,
    };
    let remote = request
        .extensions()
        .get::<ConnectInfo<crate::admin_listener::Caller>>()
        .map_or_else(|| "unknown".to_owned(), |c| c.0.0.to_string());
    let (status, kind, message) = match &refusal {
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this admin API needs a bearer token: send `Authorization: Bearer <token>` (llmgw ctl: \
             --token or LLMGW_TOKEN)"
                .to_owned(),
        ),
        Refusal::Malformed => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the Authorization header is not `Bearer <token>`".to_owned(),
        ),
        Refusal::Unknown => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the bearer token is not one this peer accepts".to_owned(),
        ),
        Refusal::Role { name, has, needs } => (
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("token {name:?} has the {has} role; {method} {path} needs a {needs} token"),
        ),
    };
    // The token itself is never logged, only its name once it is known.
    match &refusal {
        Refusal::Role { name, .. } => {
            tracing::warn!(%remote, %method, %path, token = %name, "admin request refused: {message}")
        }
        _ => tracing::warn!(%remote, %method, %path, "admin request refused: {message}"),
    }
    let mut response = ApiError {
        status,
        kind,
        message,
    }
    .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmgw_config::TokenSource;

    fn auth() -> AdminAuth {
        let token = |name: &str, role, secret: &str| AdminToken {
            name: name.to_owned(),
            role,
            source: TokenSource::Inline(Secret::new(secret.to_owned())),
        };
        AdminAuth::from_config(&[
            token("reader", AdminRole::Read, "read-token-0123456789"),
            token("writer", AdminRole::Write, "write-token-0123456789"),
        ])
        .unwrap()
    }

    fn bearer(token: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
    }

    #[test]
    fn roles_and_refusals() {
        let auth = auth();
        let read = bearer("read-token-0123456789");
        let write = bearer("write-token-0123456789");
        let models = "/api/v1/models/m";
        assert!(auth.check(&Method::GET, models, Some(&read)).is_ok());
        assert!(auth.check(&Method::PUT, models, Some(&write)).is_ok());
        assert!(auth.check(&Method::GET, models, Some(&write)).is_ok());
        assert!(matches!(
            auth.check(&Method::PUT, models, Some(&read)),
            Err(Refusal::Role { .. })
        ));
        // A router's read token may wake a model scaled to zero, nothing more.
        assert!(
            auth.check(&Method::POST, "/api/v1/models/m/wake", Some(&read))
                .is_ok()
        );
        assert!(matches!(
            auth.check(&Method::POST, "/api/v1/models/m/rollback", Some(&read)),
            Err(Refusal::Role { .. })
        ));
        assert!(matches!(
            auth.check(&Method::DELETE, models, None),
            Err(Refusal::Missing)
        ));
        assert!(matches!(
            auth.check(&Method::GET, models, Some(&bearer("read-token-012345678X"))),
            Err(Refusal::Unknown)
        ));
        assert!(matches!(
            auth.check(
                &Method::GET,
                models,
                Some(&HeaderValue::from_static("Basic abc"))
            ),
            Err(Refusal::Malformed)
        ));
        assert!(auth.check(&Method::GET, "/healthz", None).is_ok());
        assert!(
            AdminAuth::default()
                .check(&Method::PUT, models, None)
                .is_ok()
        );
    }

    #[test]
    fn equal_tokens_are_refused_without_naming_the_secret() {
        let token = |name: &str| AdminToken {
            name: name.to_owned(),
            role: AdminRole::Read,
            source: TokenSource::Inline(Secret::new("same-token-0123456789".to_owned())),
        };
        let error = AdminAuth::from_config(&[token("a"), token("b")]).unwrap_err();
        assert!(!error.contains("same-token"), "{error}");
    }
}
