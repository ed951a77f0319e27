//! The admin HTTP API, served on every peer. Reads come from this peer's
//! applied state (`?consistent=true` waits for a read index first); writes
//! go through the Raft leader, wherever they arrive.

mod backup;
mod error;
mod explain;
mod fleet;
mod health;
mod models;
mod peers;

use std::sync::Arc;

use axum::Router;
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

/// All admin routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
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
        .fallback(|| async {
            ApiError::not_found("no such route; the admin API lives under /api/v1/")
        })
        .with_state(state)
}
