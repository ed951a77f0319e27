//! Nodes and replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderValue;
use axum::http::header::LINK;
use axum::response::{IntoResponse, Response};
use llmgw_api::{DrainQuery, KvEventsView, NodeShard, NodeView, ReplicaView};
use llmgw_raft::now_ms;
use llmgw_state::{Command, FleetState, NodeRecord, NodeStatus, ShardState};

use super::{ApiError, ApiState, ReadQuery};
use llmgw_reconcile::{endpoint, kv_event_addresses};

/// Every node's shards, in one pass over the replicas.
fn shards_by_node(fleet: &FleetState) -> BTreeMap<&str, Vec<NodeShard>> {
    shards_where(fleet, |_| true)
}

/// The shards of the nodes in `ids`, in one pass over the replicas.
fn shards_on<'a>(fleet: &'a FleetState, ids: &BTreeSet<&str>) -> BTreeMap<&'a str, Vec<NodeShard>> {
    shards_where(fleet, |node| ids.contains(node))
}

fn shards_where(fleet: &FleetState, on: impl Fn(&str) -> bool) -> BTreeMap<&str, Vec<NodeShard>> {
    let mut out: BTreeMap<&str, Vec<NodeShard>> = BTreeMap::new();
    for replica in fleet.replicas.values() {
        for shard in replica.shards.iter().filter(|s| on(&s.node)) {
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

/// Filters and pages for `GET /api/v1/nodes`: at 10,000 nodes the whole
/// list is tens of MiB, built while the state is read-locked.
#[derive(Debug, Default, serde::Deserialize)]
pub struct NodeListQuery {
    /// Only nodes in this status: `ready`, `unreachable` or `lost`.
    status: Option<String>,
    /// Only nodes whose id sorts after this one: the previous page's last.
    after: Option<String>,
    /// At most this many nodes, 1 to `MAX_NODES_PER_PAGE`; when more are
    /// left, the `Link` header names the next page.
    limit: Option<usize>,
}

pub const MAX_NODES_PER_PAGE: usize = 10_000;

impl NodeListQuery {
    fn status(&self) -> Result<Option<NodeStatus>, ApiError> {
        let Some(wanted) = self.status.as_deref() else {
            return Ok(None);
        };
        [NodeStatus::Ready, NodeStatus::Unreachable, NodeStatus::Lost]
            .into_iter()
            .find(|s| s.as_str() == wanted)
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "status={wanted:?} is not a node status: ready, unreachable or lost"
                ))
            })
    }

    fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(usize::MAX),
            Some(n) if (1..=MAX_NODES_PER_PAGE).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::bad_request(format!(
                "limit={n} is out of range: 1 to {MAX_NODES_PER_PAGE}"
            ))),
        }
    }

    /// The next page's link, after `last`. Node ids and the statuses that
    /// pass `status()` need no escaping in a URL.
    fn next_page(&self, last: &str, limit: usize) -> String {
        let status = match &self.status {
            Some(status) => format!("status={status}&"),
            None => String::new(),
        };
        format!(
            "<{}?{status}after={last}&limit={limit}>; rel=\"next\"",
            llmgw_api::paths::NODES
        )
    }
}

pub async fn nodes(
    State(state): State<ApiState>,
    Query(query): Query<ReadQuery>,
    Query(list): Query<NodeListQuery>,
) -> Result<Response, ApiError> {
    let status = list.status()?;
    let limit = list.limit()?;
    state.before_read(&query).await?;
    let leading = state.control.leading_term().is_some();
    let (views, more) = state.control.read(|fleet| {
        let from = match &list.after {
            Some(after) => Bound::Excluded(after.clone()),
            None => Bound::Unbounded,
        };
        let mut matching = fleet
            .nodes
            .range((from, Bound::Unbounded))
            .map(|(_, record)| record)
            .filter(|record| status.is_none_or(|s| record.status == s));
        let page: Vec<&NodeRecord> = matching.by_ref().take(limit).collect();
        let more = matching.next().is_some();
        let mut shards = if page.len() == fleet.nodes.len() {
            shards_by_node(fleet)
        } else {
            let ids: BTreeSet<&str> = page.iter().map(|r| r.id.as_str()).collect();
            shards_on(fleet, &ids)
        };
        let views: Vec<NodeView> = page
            .into_iter()
            .map(|record| {
                let mine = shards.remove(record.id.as_str()).unwrap_or_default();
                node_view(&state, record, mine, leading)
            })
            .collect();
        (views, more)
    });
    let next = match views.last() {
        Some(last) if more => Some(list.next_page(&last.record.id, limit)),
        _ => None,
    };
    let mut response = Json(views).into_response();
    if let Some(next) = next
        && let Ok(value) = HeaderValue::from_str(&next)
    {
        response.headers_mut().insert(LINK, value);
    }
    Ok(response)
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
                kv_events: kv_event_addresses(fleet, replica).map(|kv| KvEventsView {
                    stream: kv.stream,
                    replay: kv.replay,
                    ranks: kv.ranks,
                }),
                wanted_asleep: fleet.wanted_asleep(replica),
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
