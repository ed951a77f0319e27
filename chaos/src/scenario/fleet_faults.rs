//! Fault schedules of the data plane's neighbours: agents' control
//! streams cut, a drain across a leader failover, an engine that crashes
//! while loading.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use llmgw_api::{ModelExplanation, ReplicaFailure, paths};
use rand::Rng;

use super::ctx::{latest, node_addr, pick_small_node, promise};
use super::{Ctx, ScenarioError};
use crate::fleet::{self, FleetSample, Subject};

/// Replica ids and the shards (node, GPUs) of every replica.
fn placements(sample: &FleetSample) -> BTreeMap<String, Vec<(String, Vec<u32>)>> {
    sample
        .replicas
        .iter()
        .flatten()
        .map(|r| {
            (
                r.id.clone(),
                r.shards
                    .iter()
                    .map(|s| (s.node.clone(), s.gpus.clone()))
                    .collect(),
            )
        })
        .collect()
}

/// The engine process groups of `node`'s shards, from its state files.
fn shard_groups(sample: &FleetSample, node: &str) -> BTreeMap<String, Vec<i32>> {
    sample
        .agents
        .iter()
        .filter(|a| a.node == node)
        .flat_map(|a| a.shards.iter())
        .map(|s| (s.shard_id.clone(), s.pgids.clone()))
        .collect()
}

pub(super) async fn agent_cut_below_ttl(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let addr = node_addr(ctx, &node);
    let peers = ctx.cluster.member_ids();
    let groups_before = shard_groups(&before, &node);
    // Well below the TTL: TCP retransmission after the heal adds up to
    // a few hundred ms, a heartbeat interval (500 ms) more.
    let cut_ms = ctx.rng.random_range(500..900);
    ctx.cluster
        .net
        .cut_stream(addr, &peers, fleet::STREAM_PORT)?;
    ctx.open_window(Subject::Node(node.clone()), false);
    ctx.fault(format!(
        "cut node {node}'s control stream for {cut_ms} ms (node_ttl {:?})",
        fleet::NODE_TTL
    ));
    tokio::time::sleep(Duration::from_millis(cut_ms)).await;
    ctx.heal()?;
    ctx.hold(3000, 4000).await;
    let after = latest(ctx)?;
    // The node was never anything but ready, in any sample or any log.
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let marked: Vec<String> = log
        .iter()
        .filter_map(|s| {
            let (status, _) = s.nodes.as_ref()?.get(&node)?;
            (status != "ready").then(|| format!("{status} at {:.1}s", s.at_us as f64 / 1e6))
        })
        .collect();
    let logged: Vec<String> = ctx
        .cluster
        .peers
        .iter()
        .flat_map(|(&id, p)| (1..=p.starts).map(move |n| (id, n)))
        .flat_map(|(id, n)| {
            std::fs::read_to_string(ctx.cluster.log_path(id, n))
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.contains(llmgw_runtime::log_events::NODE_STATUS_CHANGED) && l.contains(&node)
                })
                .map(|l| format!("peer {id}: {}", l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    promise(
        ctx,
        "cut-node-stayed-ready",
        format!("node {node}, cut {cut_ms} ms"),
        if marked.is_empty() && logged.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "node {node} was marked down after a {cut_ms} ms cut: samples {marked:?}, logs {logged:?}"
            ))
        },
    );
    let (p0, p1) = (placements(&before), placements(&after));
    let groups_after = shard_groups(&after, &node);
    promise(
        ctx,
        "replicas-untouched",
        format!(
            "{} replicas, node {node}'s engines {:?}",
            p0.len(),
            groups_before
        ),
        if p0 == p1 && groups_before == groups_after {
            Ok(())
        } else {
            Err(format!(
                "placements before {p0:?} after {p1:?}; node {node}'s engines before {groups_before:?} after {groups_after:?}"
            ))
        },
    );
    Ok(())
}

pub(super) async fn agent_cut_past_lost(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let addr = node_addr(ctx, &node);
    let peers = ctx.cluster.member_ids();
    let old_replicas: BTreeSet<String> = before
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.shards.iter().any(|s| s.node == node))
        .map(|r| r.id.clone())
        .collect();
    let old_groups = shard_groups(&before, &node);
    ctx.cluster
        .net
        .cut_stream(addr, &peers, fleet::STREAM_PORT)?;
    // Its replicas are retired once it is lost: requests to them may fail.
    ctx.open_window(Subject::Node(node.clone()), true);
    ctx.fault(format!(
        "cut node {node}'s control stream (node_ttl {:?}, lost_after {:?}); it runs {old_replicas:?}",
        fleet::NODE_TTL,
        fleet::LOST_AFTER
    ));
    let bound = fleet::NODE_TTL + fleet::LOST_AFTER + Duration::from_secs(15);
    let lost = ctx
        .wait_fleet(bound, |s| {
            match s.nodes.as_ref().and_then(|n| n.get(&node)) {
                Some((status, _)) if status == "lost" => Ok(()),
                other => Err(format!("node {node} is {other:?}")),
            }
        })
        .await;
    ctx.fault(format!("node {node} lost: {}", lost.is_ok()));
    let desired = ctx.desired.clone();
    let replaced = ctx
        .wait_fleet(Duration::from_secs(30), |s| {
            fleet::fleet_ready(s, &desired)?;
            let left: Vec<&String> = s
                .replicas
                .iter()
                .flatten()
                .filter(|r| old_replicas.contains(&r.id))
                .map(|r| &r.id)
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("old replicas still listed: {left:?}"))
            }
        })
        .await;
    // The two-node model has nowhere else to go when an H100 is lost.
    let movable = !node.starts_with("h100");
    promise(
        ctx,
        "lost-node-replicas-replaced",
        format!("node {node}, replicas {old_replicas:?}"),
        match (&lost, &replaced) {
            (Err(why), _) => Err(format!("node {node} was not lost within {bound:?}: {why}")),
            (Ok(_), Err(why)) if movable => Err(format!(
                "{node}'s replicas were not replaced elsewhere within 30s: {why}"
            )),
            _ => Ok(()),
        },
    );
    ctx.hold(500, 1500).await;
    ctx.heal()?;
    returning_node_stops_old_shards(ctx, &node, &old_groups).await;
    Ok(())
}

/// Once healed, a node that was lost comes back `ready` and stops the
/// shards it ran before (their state files gone, their process groups
/// dead): they were replaced elsewhere.
async fn returning_node_stops_old_shards(
    ctx: &mut Ctx,
    node: &str,
    old_groups: &BTreeMap<String, Vec<i32>>,
) {
    let stopped = ctx
        .wait_fleet(Duration::from_secs(30), |s| {
            let status = s.nodes.as_ref().and_then(|n| n.get(node)).cloned();
            if status.as_ref().map(|(st, _)| st.as_str()) != Some("ready") {
                return Err(format!("node {node} is {status:?}"));
            }
            let still = shard_groups(s, node);
            let kept: Vec<&String> = old_groups
                .keys()
                .filter(|k| still.contains_key(*k))
                .collect();
            if !kept.is_empty() {
                return Err(format!("node {node} still runs its old shards {kept:?}"));
            }
            Ok(())
        })
        .await;
    let alive: Vec<i32> = old_groups
        .values()
        .flatten()
        .copied()
        .filter(|g| llmgw_procfs::alive(*g))
        .collect();
    promise(
        ctx,
        "returning-node-stopped-old-shards",
        format!(
            "node {node}, shards {:?}",
            old_groups.keys().collect::<Vec<_>>()
        ),
        match stopped {
            Err(why) => Err(format!("within 30s of healing: {why}")),
            Ok(_) if !alive.is_empty() => Err(format!(
                "the old shards' state files are gone but process groups {alive:?} live"
            )),
            Ok(_) => Ok(()),
        },
    );
}

/// Drains a seeded node that holds the small model, through the leader;
/// returns the node and the replicas that were on it.
pub(super) async fn drain_small_node(
    ctx: &mut Ctx,
    deadline_s: u64,
) -> Result<(String, BTreeSet<String>), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let drained = small_replicas_on(&before, &node);
    drain_node(ctx, &node, &drained, deadline_s).await?;
    Ok((node, drained))
}

/// The small model's replicas with a shard on `node`.
pub(super) fn small_replicas_on(sample: &FleetSample, node: &str) -> BTreeSet<String> {
    sample
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.model == fleet::SMALL && r.shards.iter().any(|s| s.node == node))
        .map(|r| r.id.clone())
        .collect()
}

/// `POST /api/v1/nodes/{node}/drain` through the leader.
pub(super) async fn drain_node(
    ctx: &mut Ctx,
    node: &str,
    drained: &BTreeSet<String>,
    deadline_s: u64,
) -> Result<(), ScenarioError> {
    let answer = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::POST,
        &format!(
            "{}?deadline_s={deadline_s}",
            paths::node_action(node, "drain")
        ),
        None,
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("drain {node}: {why}")))?;
    ctx.fault(format!(
        "drain node {node} (replicas {drained:?}, deadline {deadline_s} s): HTTP {}",
        answer.0
    ));
    Ok(())
}

/// Waits until one of `followers` leads (after the old leader was killed
/// or paused): openraft's leader lease can outlast a short fault, and the
/// schedule means a real change of leadership.
pub(super) async fn wait_successor(
    ctx: &mut Ctx,
    followers: &[u64],
    what: &str,
) -> Result<u64, ScenarioError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(new) = ctx
            .cluster
            .wait_leader_among(followers)
            .await
            .filter(|l| followers.contains(l))
        {
            ctx.fault(format!("peer {new} leads"));
            return Ok(new);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(ScenarioError::Setup(format!(
        "no follower of {followers:?} took over within 30s of {what}"
    )))
}

pub(super) async fn failover_during_drain(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let (node, drained) = drain_small_node(ctx, 30).await?;
    ctx.hold(0, 1500).await;
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    ctx.kill(leader);
    wait_successor(ctx, &followers, "the leader's SIGKILL").await?;
    ctx.hold(1000, 3000).await;
    ctx.restart(leader)?;
    drain_completes(ctx, &node, &drained).await;
    Ok(())
}

/// The drain of `node` completes within 60 s with exactly one replacement
/// for each replica that was on it; the node is uncordoned afterwards so
/// the checks after healing find the whole fleet usable.
pub(super) async fn drain_completes(ctx: &mut Ctx, node: &str, drained: &BTreeSet<String>) {
    let node = node.to_owned();
    let desired = ctx.desired.clone();
    let done = ctx
        .wait_fleet(Duration::from_secs(60), |s| {
            fleet::fleet_ready(s, &desired)?;
            match s.nodes.as_ref().and_then(|n| n.get(&node)) {
                Some((_, false)) => {}
                other => return Err(format!("node {node} is {other:?}")),
            }
            let on_node: Vec<&String> = s
                .replicas
                .iter()
                .flatten()
                .filter(|r| r.model == fleet::SMALL && r.shards.iter().any(|sh| sh.node == node))
                .map(|r| &r.id)
                .collect();
            if on_node.is_empty() {
                Ok(())
            } else {
                Err(format!("{on_node:?} still on {node}"))
            }
        })
        .await;
    promise(
        ctx,
        "drain-completed",
        format!("node {node}"),
        done.map(|_| ())
            .map_err(|why| format!("within 60s of the restart: {why}")),
    );
    one_replacement_each(ctx, "drained", drained);
    // Leave the node usable for the checks after healing.
    let _ = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::POST,
        &paths::node_action(&node, "uncordon"),
        None,
        Duration::from_secs(20),
    )
    .await;
    ctx.fault(format!("uncordon node {node}"));
}

/// Over every sample, each replica of `old` had exactly one replacement
/// (a replica naming it in `replaces`): none is left behind, none doubled.
pub(super) fn one_replacement_each(ctx: &mut Ctx, how: &str, old: &BTreeSet<String>) {
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut replacements: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in log.iter().flat_map(|s| s.replicas.iter().flatten()) {
        if let Some(replaced) = &r.replaces
            && old.contains(replaced)
        {
            replacements
                .entry(replaced.clone())
                .or_default()
                .insert(r.id.clone());
        }
    }
    let wrong: Vec<String> = old
        .iter()
        .filter(|o| replacements.get(*o).map_or(0, BTreeSet::len) != 1)
        .map(|o| format!("{o} replaced by {:?}", replacements.get(o)))
        .collect();
    promise(
        ctx,
        "exactly-one-replacement",
        format!("{} replicas {how}", old.len()),
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        },
    );
}

/// When each replica of the crashing model was first sampled between
/// `from_us` and `to_us` (one per attempt, in order), and whether any
/// sample showed one ready.
fn crashing_attempts(ctx: &Ctx, from_us: u64, to_us: u64) -> (Vec<u64>, bool) {
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut first_seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut ready_seen = false;
    for s in log
        .iter()
        .filter(|s| s.at_us >= from_us && s.at_us <= to_us)
    {
        for r in s
            .replicas
            .iter()
            .flatten()
            .filter(|r| r.model == fleet::CRASHING)
        {
            first_seen.entry(r.id.clone()).or_insert(s.at_us);
            ready_seen |= r.state == "ready";
        }
    }
    let mut starts: Vec<u64> = first_seen.values().copied().collect();
    starts.sort_unstable();
    (starts, ready_seen)
}

pub(super) async fn engine_crash_loop(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let term_before = ctx.cluster.leader_view(ctx.leader().await?).await;
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::PUT,
        &paths::model(fleet::CRASHING),
        Some(&fleet::crashing_model()),
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("PUT {}: {why}", fleet::CRASHING)))?;
    let from_us = ctx.history.now_us();
    ctx.fault(format!(
        "add model {} whose engine crashes while loading",
        fleet::CRASHING
    ));
    let watch_ms = ctx.rng.random_range(12_000..16_000);
    tokio::time::sleep(Duration::from_millis(watch_ms)).await;
    let to_us = ctx.history.now_us();
    // A failed replica is stopped and removed in the reconcile round right
    // after its failure applies (milliseconds), so samples see attempts
    // come and go, never `failed`; the failure itself is read from
    // `explain` below.
    let (starts, ready_seen) = crashing_attempts(ctx, from_us, to_us);
    let gaps: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]) / 1000).collect();
    // With no backoff a round every 250 ms would try ~50 times.
    let max_attempts = 8;
    let explained: ModelExplanation = ctx
        .cluster
        .get(ctx.leader().await?, &paths::explain(fleet::CRASHING))
        .await
        .map_err(ScenarioError::Setup)?;
    let failure = explained.last_failure;
    promise(
        ctx,
        "crash-loop-backed-off",
        format!(
            "{} attempts in {watch_ms} ms, gaps {gaps:?} ms",
            starts.len()
        ),
        if starts.len() < 2 {
            Err(format!(
                "{} was tried {} time(s) in {watch_ms} ms: not retried",
                fleet::CRASHING,
                starts.len()
            ))
        } else if starts.len() > max_attempts {
            Err(format!(
                "{} was tried {} times in {watch_ms} ms (gaps {gaps:?} ms): no backoff",
                fleet::CRASHING,
                starts.len()
            ))
        } else if !failure
            .as_ref()
            .is_some_and(|f| carries(f, "No available memory for the cache blocks"))
        {
            Err(format!(
                "explain does not carry the engine's failure: last_failure {failure:?}"
            ))
        } else if ready_seen {
            Err(format!("a replica of {} was seen ready", fleet::CRASHING))
        } else {
            Ok(())
        },
    );
    let term_after = ctx.cluster.leader_view(ctx.leader().await?).await;
    promise(
        ctx,
        "control-plane-undisturbed",
        format!("term and leader before {term_before:?}, after {term_after:?}"),
        if term_before == term_after && term_before.is_some() {
            Ok(())
        } else {
            Err(format!(
                "the leader or term changed while an engine crashed in a loop: {term_before:?} -> {term_after:?}"
            ))
        },
    );
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::DELETE,
        &paths::model(fleet::CRASHING),
        None,
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("DELETE {}: {why}", fleet::CRASHING)))?;
    ctx.fault(format!("delete model {}", fleet::CRASHING));
    Ok(())
}

/// Whether a replica's recorded failure mentions `text`, in its message or
/// in the engine's last lines.
fn carries(failure: &ReplicaFailure, text: &str) -> bool {
    failure.failure.message.contains(text)
        || failure
            .failure
            .output_tail
            .iter()
            .any(|line| line.contains(text))
}
