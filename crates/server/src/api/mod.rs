//! The admin HTTP API, served on every peer. Reads come from this peer's
//! applied state (`?consistent=true` waits for a read index first); writes
//! go through the Raft leader, wherever they arrive.

mod backup;
pub(crate) mod console;
mod error;
mod explain;
mod fleet;
mod health;
mod models;
mod peers;
mod rollout;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use llmgw_raft::ControlPlane;
use serde::Deserialize;

use crate::agents::Hub;
use crate::reconcile::PlanSettings;

pub use error::ApiError;
pub(crate) use explain::explain_model;

#[derive(Clone)]
pub struct ApiState {
    pub control: ControlPlane,
    /// Agent sessions; populated on the leader only.
    pub hub: Arc<Hub>,
    pub placement: PlanSettings,
    /// gRPC links are plaintext (`insecure: true`); shown in /api/v1/cluster.
    pub insecure: bool,
    /// Turns true when the peer stops: long-lived answers (the console's
    /// event streams) end, so the admin API can shut down gracefully.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ReadQuery {
    /// Linearizable read: wait until this peer has applied everything the
    /// leader had committed when the request arrived.
    #[serde(default)]
    pub consistent: bool,
}

impl ApiState {
    async fn before_read(&self, query: &ReadQuery) -> Result<(), ApiError> {
        if query.consistent {
            self.control.linearizable_barrier().await?;
        }
        Ok(())
    }
}

/// The largest request body the admin API reads: a model entry is a few
/// kilobytes, and nothing larger needs to reach a parser.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// All admin routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/ui", get(console::root))
        .route("/ui/", get(console::index))
        .route("/ui/app.js", get(console::app))
        .route("/ui/style.css", get(console::style))
        .route("/api/v1/events", get(console::events))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/api/v1/cluster", get(peers::cluster))
        .route("/api/v1/snapshot", get(backup::snapshot))
        .route("/api/v1/cluster/peers", post(peers::add_peer))
        .route(
            "/api/v1/cluster/peers/{id}",
            axum::routing::delete(peers::remove_peer),
        )
        .route("/api/v1/nodes", get(fleet::nodes))
        .route("/api/v1/nodes/{id}", get(fleet::node))
        .route("/api/v1/nodes/{id}/cordon", post(fleet::cordon))
        .route("/api/v1/nodes/{id}/uncordon", post(fleet::uncordon))
        .route("/api/v1/nodes/{id}/drain", post(fleet::drain))
        .route("/api/v1/replicas", get(fleet::replicas))
        .route("/api/v1/models", get(models::list))
        .route(
            "/api/v1/models/{name}",
            get(models::get_one).put(models::put).delete(models::delete),
        )
        .route("/api/v1/models/{name}/explain", get(explain::explain))
        .route("/api/v1/models/{name}/rollout", get(rollout::status))
        .route("/api/v1/models/{name}/rollback", post(rollout::rollback))
        .fallback(|| async {
            ApiError::not_found("no such route; the admin API lives under /api/v1/")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(name_the_body_limit))
        .with_state(state)
}

/// axum refuses an oversized body with a plain-text 413; the API answers
/// every error in its own shape, naming the request and the limit.
async fn name_the_body_limit(request: Request, next: Next) -> Response {
    let what = format!("{} {}", request.method(), request.uri().path());
    let response = next.run(request).await;
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE || is_json {
        return response;
    }
    let mut response = ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        kind: "payload_too_large",
        message: format!(
            "{what}: the request body is larger than the admin API's limit of {MAX_BODY_BYTES} bytes (1 MiB)"
        ),
    }
    .into_response();
    // The rest of the body is never read, so the connection cannot carry
    // another request: say so, or a client reuses it and its next request
    // fails.
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}
