//! The admin HTTP API, served on every peer. Reads come from this peer's
//! applied state (`?consistent=true` waits for a read index first); writes
//! go through the Raft leader, wherever they arrive.

mod backup;
pub(crate) mod console;
mod error;
mod explain;
mod fleet;
mod health;
mod keys;
mod load;
mod models;
mod peers;
mod rollout;
mod usage;

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
    /// The last hour of autoscaled models' load, as this peer sampled it.
    pub load_history: crate::load_history::LoadHistory,
    pub placement: PlanSettings,
    /// gRPC links are plaintext (`insecure: true`); shown in /api/v1/cluster.
    pub insecure: bool,
    /// Turns true when the peer stops: long-lived answers (the console's
    /// event streams) end, so the admin API can shut down gracefully.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// How long API keys' per-minute usage is kept.
    pub usage_retention: std::time::Duration,
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

/// An oversized body is read and dropped up to this many bytes before the
/// 413 goes out: a peer that answers and closes while the client is still
/// sending resets the connection, and the client sees the reset, not the
/// answer.
const DRAIN_BYTES: usize = 16 << 20;
const DRAIN_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

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
        .route("/api/v1/models/{name}/load", get(load::model_load))
        .route("/api/v1/models/{name}/rollout", get(rollout::status))
        .route("/api/v1/models/{name}/rollback", post(rollout::rollback))
        .route("/api/v1/models/{name}/wake", post(models::wake))
        .route("/api/v1/keys", get(keys::list).post(keys::create))
        .route(
            "/api/v1/keys/{name}",
            get(keys::get_one).put(keys::update).delete(keys::revoke),
        )
        .route("/api/v1/keys/{name}/rotate", post(keys::rotate))
        .route("/api/v1/usage", get(usage::per_day).post(usage::report))
        .fallback(|| async {
            ApiError::not_found("no such route; the admin API lives under /api/v1/")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(limit_the_body))
        .with_state(state)
}

/// Reads the body whole, up to [`MAX_BODY_BYTES`]; a larger one is read
/// on and dropped (up to [`DRAIN_BYTES`]) so that the client, done
/// sending, reads the 413 that names the request and the limit (axum's own
/// would be plain text, sent while the client still writes).
async fn limit_the_body(request: Request, next: Next) -> Response {
    use http_body_util::BodyExt;
    let what = format!("{} {}", request.method(), request.uri().path());
    let (parts, mut body) = request.into_parts();
    let mut kept = bytes::BytesMut::new();
    let mut seen = 0usize;
    let read = tokio::time::timeout(DRAIN_WITHIN, async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map(|f| f.into_data()) else {
                return false;
            };
            let Ok(data) = data else { continue };
            seen += data.len();
            if seen <= MAX_BODY_BYTES {
                kept.extend_from_slice(&data);
            } else if seen > DRAIN_BYTES {
                return false;
            }
        }
        true
    })
    .await;
    if seen > MAX_BODY_BYTES {
        return too_large(&what, read == Ok(true));
    }
    if read != Ok(true) {
        return ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_request",
            message: format!("{what}: the request body could not be read whole"),
        }
        .into_response();
    }
    let request = Request::from_parts(parts, axum::body::Body::from(kept.freeze()));
    next.run(request).await
}

/// The 413, in the API's own shape. `drained`: the whole body was read, so
/// the connection can carry another request.
fn too_large(what: &str, drained: bool) -> Response {
    let mut response = ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        kind: "payload_too_large",
        message: format!(
            "{what}: the request body is larger than the admin API's limit of {MAX_BODY_BYTES} bytes (1 MiB)"
        ),
    }
    .into_response();
    if !drained {
        // The rest of the body was not read, so the connection cannot
        // carry another request: say so, or a client reuses it and its
        // next request fails.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}
