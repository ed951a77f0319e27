//! `GET /api/v1/cluster` and membership changes.

use axum::Json;
use axum::extract::{Path, State};
use llmgw_api::{AddPeer, ClusterView, PeerAdded, PeerRemoved};
use llmgw_raft::PeerNode;

use super::{ApiError, ApiState};

pub async fn cluster(State(state): State<ApiState>) -> Json<ClusterView> {
    let metrics = state.control.metrics();
    let peers = state.control.cluster_view().await;
    let (cluster_id, epoch) = state.control.read(|fleet| {
        fleet
            .settled_epoch()
            .map(|(id, epoch)| (id.to_owned(), epoch))
            .unzip()
    });
    Json(ClusterView {
        cluster_id,
        epoch,
        id: state.control.id(),
        leader_id: metrics.current_leader,
        leader_heard_ms_ago: state
            .control
            .leader_heard_ago()
            .map(|ago| u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)),
        term: metrics.current_term,
        peers,
        insecure: state.insecure,
        leader_changes_last_hour: state
            .control
            .counters()
            .leader_changes_within(std::time::Duration::from_secs(3600)),
    })
}

pub async fn add_peer(
    State(state): State<ApiState>,
    body: Result<Json<AddPeer>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<PeerAdded>, ApiError> {
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
    Ok(Json(PeerAdded { added: peer.id }))
}

pub async fn remove_peer(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<PeerRemoved>, ApiError> {
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::bad_request(format!("peer id {id:?} is not a number")))?;
    state.control.remove_peer(id).await?;
    Ok(Json(PeerRemoved { removed: id }))
}
