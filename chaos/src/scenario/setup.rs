//! Bringing a run to its starting state (agents registered, the catalog
//! ready on every peer) and the reads that close it (convergence, a
//! consistent read of every key on every member, every catalog).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use llmgw_api::{Model, paths};

use super::{Ctx, ScenarioError};
use crate::cluster::Cluster;
use crate::fleet::{self, Fleet};
use crate::history::{History, OpRecord};
use crate::linearizability::RegOp;
use crate::load;

/// Agents up and registered, the catalog written, every desired replica
/// ready: the state every fleet scenario starts from.
pub(super) async fn setup_fleet(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.fleet = Some(Fleet::start(&mut ctx.cluster)?);
    let expected = fleet::NODES.len();
    ctx.wait_fleet(Duration::from_secs(90), |s| {
        let ready = fleet::ready_nodes(s);
        if ready.len() == expected {
            Ok(())
        } else {
            Err(format!("nodes ready: {ready:?}"))
        }
    })
    .await
    .map_err(|why| ScenarioError::Setup(format!("agents did not register within 90s: {why}")))?;
    for (model, replicas) in fleet::catalog() {
        let name = model.name.clone();
        fleet::send_to_leader(
            &ctx.cluster,
            reqwest::Method::PUT,
            &paths::model(&name),
            Some(&model),
            Duration::from_secs(60),
        )
        .await
        .map_err(|why| ScenarioError::Setup(format!("cannot write model {name}: {why}")))?;
        ctx.desired.insert(name, replicas);
        // One model at a time, the two-node one first: single-node
        // replicas spread onto the H100s would leave no fabric with two
        // free 8-GPU nodes (the scheduler does not pack for later models).
        let desired = ctx.desired.clone();
        ctx.wait_fleet(Duration::from_secs(120), |s| {
            fleet::fleet_ready(s, &desired)
        })
        .await
        .map_err(|why| {
            ScenarioError::Setup(format!("the catalog was not ready within 120s: {why}"))
        })?;
    }
    let desired = ctx.desired.clone();
    ctx.wait_fleet(Duration::from_secs(120), |s| {
        fleet::fleet_ready(s, &desired)
    })
    .await
    .map_err(|why| ScenarioError::Setup(format!("the catalog was not ready within 120s: {why}")))?;
    // Every peer's router serves from its own applied state (its table is
    // rebuilt within 100 ms of an apply): each peer must see the catalog
    // ready before the router load starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in ctx.cluster.member_ids() {
        let one = crate::cluster::Members::default();
        one.write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, ctx.cluster.admin(id));
        fleet::wait_sample(
            &ctx.cluster.admin_client(Duration::from_millis(1500)),
            &one,
            &[],
            &ctx.history,
            deadline.saturating_duration_since(Instant::now()),
            |s| fleet::fleet_ready(s, &desired),
        )
        .await
        .map_err(|why| {
            ScenarioError::Setup(format!("peer {id} did not see the catalog ready: {why}"))
        })?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if ctx.verbose {
        println!(
            "  {} agents registered, {:?} ready on every peer",
            expected, ctx.desired
        );
    }
    Ok(())
}

/// Waits for every member to report the same applied index and hash;
/// returns the last states seen either way.
pub(super) async fn wait_converged(
    cluster: &Cluster,
    within: Duration,
) -> BTreeMap<u64, Option<(u64, String)>> {
    let started = Instant::now();
    loop {
        let mut states = BTreeMap::new();
        for id in cluster.member_ids() {
            states.insert(id, cluster.own_state(id).await);
        }
        let distinct: BTreeSet<_> = states.values().collect();
        if (distinct.len() == 1 && !distinct.contains(&None)) || started.elapsed() > within {
            return states;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A consistent read of every key on every member, once the load has
/// stopped; recorded like any other operation.
pub(super) async fn final_reads(cluster: &Cluster, history: &History) {
    let keys: BTreeSet<String> = history.ops().into_iter().map(|op| op.key).collect();
    let http = load::client(cluster);
    for id in cluster.member_ids() {
        let base = cluster.admin(id);
        for key in &keys {
            let op_id = history.next_id();
            let invoke_us = history.now_us();
            let outcome = load::perform(&http, &base, key, &RegOp::Read).await;
            history.record(OpRecord {
                id: op_id,
                worker: usize::MAX,
                peer: id,
                key: key.clone(),
                op: RegOp::Read,
                invoke_us,
                complete_us: history.now_us(),
                outcome,
            });
        }
    }
}

pub(super) type Catalog = BTreeMap<String, Option<String>>;

/// Every member's catalog from its own applied state.
pub(super) async fn catalogs(cluster: &Cluster) -> BTreeMap<u64, Result<Catalog, String>> {
    let mut out = BTreeMap::new();
    for id in cluster.member_ids() {
        let result = match cluster.get::<Vec<Model>>(id, paths::MODELS).await {
            Ok(models) => Ok(models
                .iter()
                .map(|m| (m.name.clone(), load::value_of(m)))
                .collect()),
            Err(e) => Err(format!("GET /api/v1/models: {e}")),
        };
        out.insert(id, result);
    }
    out
}
