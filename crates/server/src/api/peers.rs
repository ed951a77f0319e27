//! `GET /api/v1/cluster` and membership changes.

use axum::Json;
use axum::extract::{Path, State};
use llmgw_raft::{PeerNode, PeerView};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState};

#[derive(Debug, Serialize)]
pub struct ClusterView {
    /// The peer that answered.
    pub id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub peers: Vec<PeerView>,
    /// This peer's gRPC links are plaintext (`insecure: true`).
    pub insecure: bool,
    /// Leader changes this peer saw in the last hour.
    pub leader_changes_last_hour: usize,
}

pub async fn cluster(State(state): State<ApiState>) -> Json<ClusterView> {
    let metrics = state.control.metrics();
    let peers = state.control.cluster_view().await;
    Json(ClusterView {
        id: state.control.id(),
        leader_id: metrics.current_leader,
        term: metrics.current_term,
        peers,
        insecure: state.insecure,
        leader_changes_last_hour: state
            .control
            .counters()
            .leader_changes_within(std::time::Duration::from_secs(3600)),
    })
}

#[derive(Debug, Deserialize)]
pub struct AddPeer {
    pub id: u64,
    /// `host:port` of the new peer's gRPC listener.
    pub grpc: String,
    /// Base URL of the new peer's admin API.
    #[serde(default)]
    pub admin: String,
}

pub async fn add_peer(
    State(state): State<ApiState>,
    body: Result<Json<AddPeer>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(peer) = body.map_err(|e| ApiError::bad_request(format!("peer to add: {e}")))?;
    if peer.grpc.trim().is_empty() {
        return Err(ApiError::bad_request(
            "peer to add: `grpc` (host:port) is required",
        ));
    }
    state
        .control
        .add_peer(
            peer.id,
            PeerNode {
                grpc: peer.grpc,
                admin: peer.admin,
            },
        )
        .await?;
    Ok(Json(serde_json::json!({"added": peer.id})))
}

pub async fn remove_peer(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::bad_request(format!("peer id {id:?} is not a number")))?;
    state.control.remove_peer(id).await?;
    Ok(Json(serde_json::json!({"removed": id})))
}
