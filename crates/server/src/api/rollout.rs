//! `GET /api/v1/models/{name}/rollout`: how far the model's current launch
//! spec has rolled onto its replicas; `POST /api/v1/models/{name}/rollback`:
//! restore the spec before the last change.

use std::collections::{BTreeSet, HashMap};

use axum::Json;
use axum::extract::{Path, Query, State};
use llmgw_api::{RolloutPhase, RolloutReplica, RolloutView};
use llmgw_raft::now_ms;
use llmgw_scheduler::{Request, Siblings};
use llmgw_state::{Command, FleetState, Replica, ReplicaState};

use super::explain::{placed_read, readable_model};
use super::{ApiError, ApiState, ReadQuery};
use crate::reconcile::{node_views, take_survivor_gpus};

pub async fn status(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Json<RolloutView>, ApiError> {
    placed_read(&state, &query, &name, rollout_view).await
}

pub async fn rollback(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<RolloutView>, ApiError> {
    state
        .control
        .write(Command::RollbackModel {
            name: name.clone(),
            reason: "an operator asked for it (ctl models rollback)".to_owned(),
            from: None,
            at_ms: now_ms(),
        })
        .await?;
    let strategy = state.placement.strategy;
    state
        .control
        .read(|fleet| rollout_view(fleet, &name, strategy, &HashMap::new()))
        .map(Json)
}

pub fn rollout_view(
    fleet: &FleetState,
    name: &str,
    strategy: llmgw_scheduler::Strategy,
    survivor_gpus: &HashMap<String, Vec<u32>>,
) -> Result<RolloutView, ApiError> {
    let (record, model) = readable_model(fleet, name)?;
    let Some(managed) = model.managed() else {
        return Err(ApiError::bad_request(format!(
            "model {name} is served by static endpoints; llmgw runs no replicas of it to roll"
        )));
    };
    let fingerprint = record.spec.launch_fingerprint();
    let replicas: Vec<RolloutReplica> = fleet
        .replicas
        .values()
        .filter(|r| r.model == name)
        .map(|r| RolloutReplica {
            id: r.id.clone(),
            state: r.state(),
            fingerprint: r.spec_fingerprint.clone(),
            current: !llmgw_reconcile::outdated(fleet, r),
            replaces: r.replaces.clone(),
            stopping: r.stop.as_ref().map(|s| s.reason.clone()),
        })
        .collect();
    let live = |r: &&RolloutReplica| r.stopping.is_none();
    let updated = replicas.iter().filter(live).filter(|r| r.current).count() as u32;
    let updated_ready = replicas
        .iter()
        .filter(live)
        .filter(|r| r.current && r.state == ReplicaState::Ready)
        .count() as u32;
    let outdated = replicas.iter().filter(|r| !r.current).count() as u32;
    let rollout = record.rollout.clone();
    let in_progress = outdated > 0
        || rollout
            .as_ref()
            .is_some_and(|r| r.completed_at_ms.is_none() && r.to == fingerprint);
    let phase = match &rollout {
        _ if !in_progress => RolloutPhase::Complete,
        Some(r) if r.failures > 0 => RolloutPhase::Failing,
        _ => RolloutPhase::InProgress,
    };
    let blocked = (outdated > 0)
        .then(|| surge_blocked(fleet, name, managed, strategy, survivor_gpus))
        .flatten();
    Ok(RolloutView {
        model: name.to_owned(),
        fingerprint: fingerprint.to_owned(),
        desired: record.desired_replicas,
        phase,
        updated,
        updated_ready,
        outdated,
        policy: managed.rollout,
        rollout,
        can_roll_back: record.previous.is_some(),
        blocked,
        replicas,
    })
}

/// Why no replacement runs beside an old replica: none is in flight and
/// none fits the fleet now.
fn surge_blocked(
    fleet: &FleetState,
    name: &str,
    managed: &llmgw_catalog::Managed,
    strategy: llmgw_scheduler::Strategy,
    survivor_gpus: &HashMap<String, Vec<u32>>,
) -> Option<String> {
    let live: Vec<&Replica> = fleet
        .replicas
        .values()
        .filter(|r| r.model == name && r.stop.is_none())
        .collect();
    let replacing = live
        .iter()
        .any(|r| r.replaces.is_some() && !llmgw_reconcile::outdated(fleet, r));
    if replacing {
        return None;
    }
    let mut views = node_views(fleet);
    take_survivor_gpus(&mut views, survivor_gpus);
    let mut siblings = Siblings::default();
    for shard in live.iter().flat_map(|r| &r.shards) {
        if let Some(view) = views.iter().find(|v| v.id == shard.node) {
            siblings.add(view);
        }
    }
    let request = Request {
        model: name,
        profiles: &managed.profiles,
        siblings,
        avoid: BTreeSet::new(),
        strategy,
    };
    let explanation = llmgw_scheduler::place(&views, &request).err()?;
    Some(format!(
        "no GPUs for a new replica beside the old ones ({explanation}); the rollout waits \
         for room, or set rollout.max_unavailable above {} to replace replicas in place",
        managed.rollout.max_unavailable
    ))
}
