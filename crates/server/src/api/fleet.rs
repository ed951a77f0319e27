//! Nodes and replicas.

use axum::Json;
use axum::extract::{Path, Query, State};
use llmgw_raft::now_ms;
use llmgw_state::{Command, NodeRecord, Replica, ReplicaState};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState, ReadQuery};

pub async fn nodes(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<Vec<NodeRecord>>, ApiError> {
    state.before_read(&query).await?;
    Ok(Json(
        state
            .control
            .read(|fleet| fleet.nodes.values().cloned().collect()),
    ))
}

#[derive(Debug, Serialize)]
pub struct ReplicaView {
    pub state: ReplicaState,
    #[serde(flatten)]
    pub replica: Replica,
}

pub async fn replicas(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<Vec<ReplicaView>>, ApiError> {
    state.before_read(&query).await?;
    Ok(Json(state.control.read(|fleet| {
        fleet
            .replicas
            .values()
            .map(|replica| ReplicaView {
                state: replica.state(),
                replica: replica.clone(),
            })
            .collect()
    })))
}

async fn node_after(
    state: &ApiState,
    id: &str,
    command: Command,
) -> Result<Json<NodeRecord>, ApiError> {
    state.control.write(command).await?;
    state
        .control
        .read(|fleet| fleet.nodes.get(id).cloned())
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("node {id} is not registered")))
}

pub async fn cordon(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<NodeRecord>, ApiError> {
    let command = Command::Cordon {
        id: id.clone(),
        at_ms: now_ms(),
    };
    node_after(&state, &id, command).await
}

pub async fn uncordon(
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<NodeRecord>, ApiError> {
    let command = Command::Uncordon {
        id: id.clone(),
        at_ms: now_ms(),
    };
    node_after(&state, &id, command).await
}

#[derive(Debug, Default, Deserialize)]
pub struct DrainQuery {
    /// Seconds in-flight requests get before shards are stopped anyway.
    #[serde(default = "default_drain_seconds")]
    pub deadline_s: u64,
}

fn default_drain_seconds() -> u64 {
    300
}

pub async fn drain(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<DrainQuery>,
) -> Result<Json<NodeRecord>, ApiError> {
    let at_ms = now_ms();
    let command = Command::StartDrain {
        id: id.clone(),
        deadline_ms: at_ms.saturating_add(query.deadline_s.saturating_mul(1000)),
        at_ms,
    };
    node_after(&state, &id, command).await
}
