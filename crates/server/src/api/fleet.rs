//! Nodes and replicas.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use llmgw_api::{DrainQuery, NodeShard, NodeView, ReplicaView};
use llmgw_raft::now_ms;
use llmgw_state::{Command, FleetState, NodeRecord, ShardState};

use super::{ApiError, ApiState, ReadQuery};
use llmgw_reconcile::endpoint;

/// Every node's shards, in one pass over the replicas.
fn shards_by_node(fleet: &FleetState) -> BTreeMap<&str, Vec<NodeShard>> {
    let mut out: BTreeMap<&str, Vec<NodeShard>> = BTreeMap::new();
    for replica in fleet.replicas.values() {
        for shard in &replica.shards {
            out.entry(shard.node.as_str()).or_default().push(NodeShard {
                shard: replica.shard_id(shard.rank),
                replica: replica.id.clone(),
                model: replica.model.clone(),
                gpus: shard.gpus.clone(),
                port: shard.port,
                state: shard.state,
            });
        }
    }
    out
}

fn node_view(
    state: &ApiState,
    record: &NodeRecord,
    shards: Vec<NodeShard>,
    leading: bool,
) -> NodeView {
    let gpus_used = shards
        .iter()
        .filter(|s| s.state != ShardState::Stopped)
        .map(|s| s.gpus.len())
        .sum();
    NodeView {
        record: record.clone(),
        gpus_total: record.inventory.gpus.len(),
        gpus_used,
        shards,
        stream: leading.then(|| state.hub.view(&record.id)),
    }
}

pub async fn nodes(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<Vec<NodeView>>, ApiError> {
    state.before_read(&query).await?;
    let leading = state.control.leading_term().is_some();
    Ok(Json(state.control.read(|fleet| {
        let mut shards = shards_by_node(fleet);
        fleet
            .nodes
            .values()
            .map(|record| {
                let mine = shards.remove(record.id.as_str()).unwrap_or_default();
                node_view(&state, record, mine, leading)
            })
            .collect()
    })))
}

pub async fn node(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<NodeView>, ApiError> {
    state.before_read(&query).await?;
    let leading = state.control.leading_term().is_some();
    state
        .control
        .read(|fleet| {
            fleet.nodes.get(&id).map(|record| {
                let mine = shards_by_node(fleet)
                    .remove(id.as_str())
                    .unwrap_or_default();
                node_view(&state, record, mine, leading)
            })
        })
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("node {id} is not registered")))
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
                endpoint: endpoint(fleet, replica),
                replica: replica.clone(),
            })
            .collect()
    })))
}

/// Counts for `/metrics`.
pub fn counts(
    fleet: &FleetState,
) -> (BTreeMap<&'static str, usize>, BTreeMap<&'static str, usize>) {
    let mut nodes = BTreeMap::new();
    for node in fleet.nodes.values() {
        *nodes.entry(node.status.as_str()).or_default() += 1;
    }
    let mut replicas = BTreeMap::new();
    for replica in fleet.replicas.values() {
        *replicas.entry(replica.state().as_str()).or_default() += 1;
    }
    (nodes, replicas)
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
