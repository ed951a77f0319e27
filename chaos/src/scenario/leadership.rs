//! Fault schedules about who may command the fleet: a deposed leader that
//! wakes up with a drain and its placements in flight, an agent that
//! reconnects in the middle of a drain, and a leader killed right after it
//! committed a placement. The witness check (every command an agent
//! executed, held against the sampled leadership history) runs on all of
//! them; each schedule adds the promise of its own.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use llmgw_api::{ReplicaState, ReplicaView, paths};
use rand::Rng;
use serde_json::Value;

use super::ctx::{latest, node_addr, pick_small_node, promise, scale_small_up};
use super::fleet_faults::{
    drain_completes, drain_node, drain_small_node, small_replicas_on, wait_successor,
};
use super::{Ctx, ScenarioError};
use crate::fleet::{self, Subject};

/// Drain a node, pause the leader while the drain's placements and orders
/// are in flight until a follower leads, resume it: whatever the old leader
/// still had queued must not be executed by any agent.
pub(super) async fn deposed_leader_during_drain(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let (node, drained) = drain_small_node(ctx, 30).await?;
    ctx.hold(0, 400).await;
    ctx.pause(leader);
    wait_successor(ctx, &followers, "the leader's SIGSTOP").await?;
    // Long enough for every agent to re-home, short of `lost_after`.
    ctx.hold(2000, 4000).await;
    ctx.resume(leader);
    drain_completes(ctx, &node, &drained).await;
    Ok(())
}

/// A long request runs on one engine of a node; the node's control stream
/// is cut, the node drained, and the cut held past the agent's
/// `leader_timeout` (below `lost_after`), so the drain order cannot reach
/// the agent and the agent leaves and registers again. The leader's
/// `Registered` must carry the drain with its deadline: the engine drains
/// (no SIGTERM at once), the long request finishes, no routed request
/// fails.
pub(super) async fn reconnect_during_drain(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let drained = small_replicas_on(&before, &node);
    let endpoint = replicas(ctx)
        .await
        .map_err(ScenarioError::Setup)?
        .into_iter()
        .find(|r| drained.contains(&r.replica.id))
        .and_then(|r| r.endpoint)
        .ok_or_else(|| ScenarioError::Setup(format!("no endpoint for {drained:?}")))?;
    let long = tokio::spawn(long_request(endpoint.clone(), LONG_REQUEST_TOKENS));
    ctx.fault(format!(
        "a request for {LONG_REQUEST_TOKENS} tokens straight to {endpoint}"
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The stream is cut before the drain is ordered: the order cannot
    // reach the agent, and the first it hears of it is the `Registered`
    // of its next stream.
    let addr = node_addr(ctx, &node);
    let peers = ctx.cluster.member_ids();
    let cut_ms = ctx.rng.random_range(2600..3500);
    let cut_at = Instant::now();
    ctx.cluster
        .net
        .cut_stream(addr, &peers, fleet::STREAM_PORT)?;
    ctx.open_window(Subject::Node(node.clone()), false);
    ctx.fault(format!(
        "cut node {node}'s control stream for at least {cut_ms} ms (past the agent's \
         leader_timeout, below lost_after {:?})",
        fleet::LOST_AFTER
    ));
    drain_node(ctx, &node, &drained, 60).await?;
    let draining = wait_draining(ctx, &node, &drained, Duration::from_secs(5)).await?;
    ctx.fault(format!("replica {draining} is ordered to drain"));
    let left = Duration::from_millis(cut_ms).saturating_sub(cut_at.elapsed());
    tokio::time::sleep(left).await;
    ctx.heal()?;
    let finished = match long.await {
        Ok(result) => result,
        Err(e) => Err(format!("the request task failed: {e}")),
    };
    promise(
        ctx,
        "in-flight-request-finished",
        format!("{LONG_REQUEST_TOKENS} tokens from {endpoint}"),
        finished,
    );
    drain_completes(ctx, &node, &drained).await;
    // The agent's own words: it registered again after the cut, and no
    // shard of the drain was stopped for want of an order.
    let agent_log = ctx
        .fleet
        .as_ref()
        .and_then(|f| f.agents.get(&node))
        .map(|a| a.log_text())
        .unwrap_or_default();
    let left = agent_log
        .matches(llmgw_runtime::log_events::CONTROL_PLANE_PEER_SILENT)
        .count()
        + agent_log
            .matches(llmgw_runtime::log_events::CONTROL_PLANE_STREAM_LOST)
            .count();
    let cut_short: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("not assigned to this node by the leader"))
        .filter(|l| drained.iter().any(|r| l.contains(r.as_str())))
        .collect();
    let outcome = if left == 0 {
        Err(format!(
            "the agent of {node} never left its stream: the cut did not make it reconnect"
        ))
    } else if !cut_short.is_empty() {
        Err(format!(
            "the reconnect stopped draining shards at once: {}",
            cut_short.join(" | ")
        ))
    } else {
        Ok(())
    };
    promise(
        ctx,
        "drain-survived-reconnect",
        format!("node {node}, replicas {drained:?}, the agent left its stream {left} time(s)"),
        outcome,
    );
    Ok(())
}

/// Tokens of the long request: a few seconds at the simulator's 1 ms per
/// token, so the drain lasts through the cut.
pub(super) const LONG_REQUEST_TOKENS: u64 = 6000;

/// A chat completion of exactly `tokens` tokens, straight to an engine.
pub(super) async fn long_request(endpoint: String, tokens: u64) -> Result<(), String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let response = http
        .post(format!("{endpoint}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": fleet::SMALL,
            "messages": [{"role": "user", "content": "Write a long story"}],
            "max_tokens": tokens,
            "ignore_eos": true
        }))
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status().as_u16();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("HTTP {status}, body: {e}"))?;
    match body["usage"]["completion_tokens"].as_u64() {
        Some(n) if status == 200 && n == tokens => Ok(()),
        _ => Err(format!("HTTP {status}: {body}")),
    }
}

/// Polls the leader until one of `drained` is draining; its id.
async fn wait_draining(
    ctx: &mut Ctx,
    node: &str,
    drained: &BTreeSet<String>,
    within: Duration,
) -> Result<String, ScenarioError> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < within {
        match replicas(ctx).await {
            Ok(all) => {
                let draining = all
                    .iter()
                    .find(|r| r.state == ReplicaState::Draining && drained.contains(&r.replica.id));
                if let Some(view) = draining {
                    return Ok(view.replica.id.clone());
                }
                last = format!("{} replicas, none of {drained:?} draining", all.len());
            }
            Err(why) => last = why,
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    Err(ScenarioError::Setup(format!(
        "no replica on {node} started draining within {within:?}: {last}"
    )))
}

/// `GET /api/v1/replicas` from the leader.
async fn replicas(ctx: &Ctx) -> Result<Vec<ReplicaView>, String> {
    let (_, text) = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::GET,
        paths::REPLICAS,
        None,
        Duration::from_secs(5),
    )
    .await?;
    serde_json::from_str(&text).map_err(|e| format!("GET /api/v1/replicas ({e}): {text}"))
}

/// Scale the small model up by one; the moment the leader shows the new
/// replica placed (committed), SIGKILL it. The new leader must carry the
/// placement on: the same replica becomes ready, nothing its predecessor
/// started is stopped, no port or GPU is handed out twice.
pub(super) async fn leader_kill_after_placement(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before: BTreeSet<String> = latest(ctx)?
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.model == fleet::SMALL)
        .map(|r| r.id.clone())
        .collect();
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    scale_small_up(ctx).await.map_err(ScenarioError::Setup)?;
    let started = Instant::now();
    let placed = loop {
        let all = replicas(ctx).await.unwrap_or_default();
        let new = all
            .iter()
            .map(|view| &view.replica)
            .find(|r| r.model == fleet::SMALL && !before.contains(&r.id))
            .map(|r| r.id.clone());
        if let Some(id) = new {
            break id;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(ScenarioError::Setup(format!(
                "no new replica of {} was placed within 30s",
                fleet::SMALL
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ctx.kill(leader);
    ctx.fault(format!("(right after replica {placed} was placed)"));
    wait_successor(ctx, &followers, "the leader's SIGKILL").await?;
    ctx.hold(1000, 2000).await;
    ctx.restart(leader)?;
    let desired = ctx.desired.clone();
    let ready = ctx
        .wait_fleet(Duration::from_secs(60), |s| fleet::fleet_ready(s, &desired))
        .await;
    let outcome = match ready {
        Err(why) => Err(format!("the fleet was not ready within 60s: {why}")),
        Ok(sample) => {
            let kept = sample
                .replicas
                .iter()
                .flatten()
                .any(|r| r.id == placed && r.state == "ready");
            if kept {
                Ok(())
            } else {
                Err(format!(
                    "replica {placed}, placed before the kill, is not among the ready ones: {:?}",
                    sample
                        .replicas
                        .iter()
                        .flatten()
                        .filter(|r| r.model == fleet::SMALL)
                        .map(|r| format!("{} {}", r.id, r.state))
                        .collect::<Vec<_>>()
                ))
            }
        }
    };
    promise(
        ctx,
        "placement-carried-on",
        format!("replica {placed} of {}", fleet::SMALL),
        outcome,
    );
    Ok(())
}
