//! `GET /api/v1/models/{name}/explain`: why each replica is where it is,
//! and why the rest are pending, with the scheduler's counts per reason.
//! Any peer answers from its applied state by running the same pure
//! placement function the leader runs; the leader also counts the GPUs
//! agents report held by processes that outlived SIGKILL, which only it
//! hears of.

use std::collections::{BTreeSet, HashMap};

use axum::Json;
use axum::extract::{Path, Query, State};
use llmgw_api::{ModelExplanation, ReplicaWhy};
use llmgw_catalog::{Managed, Model};
use llmgw_scheduler::{Explanation, NodeView, Request, Siblings};
use llmgw_state::{FleetState, ModelRecord, Replica};

use super::{ApiError, ApiState, ReadQuery};
use crate::reconcile::{node_views, take_survivor_gpus};

pub async fn explain(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<ModelExplanation>, ApiError> {
    placed_read(&state, &query, &name, explain_model).await
}

/// A view of model `name` that runs placement as the leader would: read
/// from this peer's state after `query`'s consistency wait, with the
/// GPUs only the leader knows to be held.
pub(super) async fn placed_read<T>(
    state: &ApiState,
    query: &ReadQuery,
    name: &str,
    view: impl FnOnce(
        &FleetState,
        &str,
        llmgw_scheduler::Strategy,
        &HashMap<String, Vec<u32>>,
    ) -> Result<T, ApiError>,
) -> Result<Json<T>, ApiError> {
    state.before_read(query).await?;
    let strategy = state.placement.strategy;
    let survivor_gpus = survivor_gpus(state);
    state
        .control
        .read(|fleet| view(fleet, name, strategy, &survivor_gpus))
        .map(Json)
}

/// Per node, GPUs held by processes that outlived SIGKILL: only the leader
/// hears of them, so a follower's answer leaves them out.
fn survivor_gpus(state: &ApiState) -> HashMap<String, Vec<u32>> {
    match state.control.leading_term() {
        Some(_) => state.hub.survivor_gpus(),
        None => HashMap::new(),
    }
}

/// The catalog entry `name` and the model it means, or why there is none
/// this peer can read.
pub(super) fn readable_model<'a>(
    fleet: &'a FleetState,
    name: &str,
) -> Result<(&'a ModelRecord, &'a Model), ApiError> {
    let record = fleet
        .models
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("model {name} is not in the catalog")))?;
    let model = record.spec.model().map_err(|why| {
        ApiError::bad_request(format!(
            "model {name}: this peer cannot read its stored entry: {why}"
        ))
    })?;
    Ok((record, model))
}

/// `survivor_gpus`: per node, GPUs held by processes that outlived
/// SIGKILL (empty where this peer does not lead).
pub fn explain_model(
    fleet: &FleetState,
    name: &str,
    strategy: llmgw_scheduler::Strategy,
    survivor_gpus: &HashMap<String, Vec<u32>>,
) -> Result<ModelExplanation, ApiError> {
    let (record, model) = readable_model(fleet, name)?;
    let Some(managed) = model.managed() else {
        return Ok(static_model_explanation(name, model));
    };
    let mut views = node_views(fleet);
    take_survivor_gpus(&mut views, survivor_gpus);
    let placed = explain_replicas(fleet, name, managed, &views);
    let pending = record.desired_replicas.saturating_sub(placed.serving);
    let (explanation, detail) = if pending == 0 {
        (None, None)
    } else {
        why_pending(name, managed, placed.siblings, &views, strategy)
    };
    Ok(ModelExplanation {
        model: name.to_owned(),
        desired: record.desired_replicas,
        replicas: placed.replicas,
        pending,
        explanation,
        detail,
        last_failure: record.last_failure.clone(),
        scaling: managed.autoscale.map(|policy| scaling(&policy, record)),
        last_scale: record.last_scale.clone(),
    })
}

/// Why an autoscaled model wants the replicas it wants.
fn scaling(policy: &llmgw_catalog::Autoscale, record: &ModelRecord) -> String {
    let bounds = policy.describe();
    let now = llmgw_raft::now_ms();
    let sleep = match (record.asleep_since_ms, record.woken_at_ms) {
        (Some(since), _) => format!(
            " Asleep for {} s (vLLM sleep mode): no request came for its sleep_after; the next \
             one wakes it.",
            now.saturating_sub(since) / 1000
        ),
        (None, Some(woken)) => format!(
            " Awake: last woken from sleep by a request {} s ago.",
            now.saturating_sub(woken) / 1000
        ),
        (None, None) => String::new(),
    };
    let what = match &record.last_scale {
        Some(last) if last.to == record.desired_replicas => {
            format!("{bounds}. Last change: {}", last.reason())
        }
        Some(last) => format!(
            "{bounds}. Now {}: the entry's new bounds moved the count after the last change ({})",
            record.desired_replicas,
            last.reason()
        ),
        None => format!(
            "{bounds}. No change yet: the model starts at {} replicas",
            record.desired_replicas
        ),
    };
    if sleep.is_empty() {
        what
    } else {
        format!("{what}.{sleep}")
    }
}

fn static_model_explanation(name: &str, model: &Model) -> ModelExplanation {
    ModelExplanation {
        model: name.to_owned(),
        desired: 0,
        replicas: Vec::new(),
        pending: 0,
        explanation: Some(format!(
            "{name} is served by static endpoints ({}); llmgw places no replicas for it",
            model.static_endpoints().join(", ")
        )),
        detail: None,
        last_failure: None,
        scaling: None,
        last_scale: None,
    }
}

/// The model's replicas as placed, and what the serving ones (those not
/// ordered away) mean for placing one more.
struct PlacedReplicas {
    replicas: Vec<ReplicaWhy>,
    serving: u32,
    siblings: Siblings,
}

fn explain_replicas(
    fleet: &FleetState,
    name: &str,
    managed: &Managed,
    views: &[NodeView],
) -> PlacedReplicas {
    let mut placed = PlacedReplicas {
        replicas: Vec::new(),
        serving: 0,
        siblings: Siblings::default(),
    };
    for replica in fleet.replicas.values().filter(|r| r.model == name) {
        if replica.stop.is_none() {
            placed.serving += 1;
            for shard in &replica.shards {
                if let Some(view) = views.iter().find(|v| v.id == shard.node) {
                    placed.siblings.add(view);
                }
            }
        }
        placed.replicas.push(ReplicaWhy {
            id: replica.id.clone(),
            state: replica.state(),
            why: replica_why(replica, managed),
        });
    }
    placed
}

/// One line on a replica: its profile, where its shards run, and what
/// drains, stop orders or failures touch it.
fn replica_why(replica: &Replica, managed: &Managed) -> String {
    let profile = managed.profiles.iter().find(|p| p.name == replica.profile);
    let mut why = match profile {
        Some(p) => format!(
            "profile {} ({} node(s) x {} GPU(s), {})",
            p.name, p.nodes, p.gpus_per_node, p.engine
        ),
        None => format!("profile {} (no longer in the catalog)", replica.profile),
    };
    if let Some(fabric) = &replica.fabric {
        why.push_str(&format!(" on fabric {fabric}"));
    }
    let placed: Vec<String> = replica
        .shards
        .iter()
        .map(|s| {
            format!(
                "rank {} on {} GPUs {:?} port {}",
                s.rank, s.node, s.gpus, s.port
            )
        })
        .collect();
    why.push_str(&format!(": {}", placed.join("; ")));
    if let Some(old) = &replica.replaces {
        why.push_str(&format!("; replaces {old} (node drain)"));
    }
    if let Some(stop) = &replica.stop {
        why.push_str(&format!("; ordered away: {}", stop.reason));
    }
    for shard in &replica.shards {
        if let Some(failure) = &shard.last_failure {
            why.push_str(&format!(
                "; rank {} last failed: {}",
                shard.rank, failure.message
            ));
        }
    }
    why
}

/// Why a replica is still missing: runs the placement the leader would,
/// and reports either where one fits now or the scheduler's reasons.
fn why_pending(
    name: &str,
    managed: &Managed,
    siblings: Siblings,
    views: &[NodeView],
    strategy: llmgw_scheduler::Strategy,
) -> (Option<String>, Option<Explanation>) {
    let request = Request {
        model: name,
        profiles: &managed.profiles,
        siblings,
        avoid: BTreeSet::new(),
        strategy,
    };
    match llmgw_scheduler::place(views, &request) {
        Ok(placement) => (
            Some(format!(
                "a replica fits now (profile {} on {}); the leader places it on its next round, \
                 after any backoff from an earlier failure",
                placement.profile,
                placement
                    .shards
                    .iter()
                    .map(|s| s.node.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            None,
        ),
        Err(explanation) => (Some(explanation.to_string()), Some(explanation)),
    }
}
