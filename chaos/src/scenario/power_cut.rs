//! The power-cut scenarios. Their peers run on lazy disks (`powercut`); a power
//! cut kills a peer and drops everything its disk had not synced, torn or
//! not by the seed, before it restarts. Every standard invariant is
//! checked afterwards (acknowledged writes on every peer, equal state
//! hashes, linearizable registers, one leader per term), plus
//! `every-peer-restarted`: no peer refused to start.

use std::time::{Duration, Instant};

use rand::Rng;

use super::{Ctx, ScenarioError};
use crate::fleet::Subject;
use crate::invariants::Checked;

pub const EVERY_PEER_RESTARTED: &str = "every-peer-restarted";

/// Power cut of `id`, torn or not by the seed; logged as a fault.
fn cut(ctx: &mut Ctx, id: u64) -> Result<(), ScenarioError> {
    let tear = ctx.rng.random_bool(0.5);
    // Opened before the kill: a request the cut interrupts is excused.
    ctx.open_window(Subject::Peer(id), true);
    let report = if tear {
        ctx.cluster.power_cut(id, Some(&mut ctx.rng))
    } else {
        ctx.cluster.power_cut(id, None)
    }
    .map_err(ScenarioError::Setup)?;
    ctx.fault(crate::powercut::describe(id, &report));
    Ok(())
}

/// After healing: every peer whose power was cut runs again and answers.
async fn check_restarted(ctx: &mut Ctx, ids: &[u64]) {
    let mut violations = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for &id in ids {
        loop {
            if !ctx.cluster.is_running(id) {
                violations.push(format!(
                    "peer {id} exited after its power cut (refused to start?):\n{}",
                    ctx.cluster.log_tails()
                ));
                break;
            }
            if ctx.cluster.own_state(id).await.is_some() {
                break;
            }
            if Instant::now() > deadline {
                violations.push(format!("peer {id} runs but its admin API does not answer"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    ctx.extra_checks.push(Checked::new(
        EVERY_PEER_RESTARTED,
        format!("peers {ids:?} after their power cuts"),
        violations,
    ));
}

/// One peer (the leader or a follower, by seed) loses power under load;
/// twice.
pub(super) async fn one_peer(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let mut cut_ids = Vec::new();
    for _ in 0..2 {
        let leader = ctx.leader().await?;
        let victim = if ctx.rng.random_bool(0.5) {
            leader
        } else {
            let followers = ctx.followers(leader);
            ctx.pick(&followers)
        };
        cut(ctx, victim)?;
        ctx.hold(500, 2000).await;
        ctx.restart(victim)?;
        cut_ids.push(victim);
        ctx.hold(1500, 3000).await;
    }
    cut_ids.sort_unstable();
    cut_ids.dedup();
    check_restarted(ctx, &cut_ids).await;
    Ok(())
}

/// All three lose power at once in the middle of a write burst.
pub(super) async fn all_peers(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.start_burst(4);
    ctx.hold(500, 1500).await;
    let ids = ctx.cluster.member_ids();
    for &id in &ids {
        cut(ctx, id)?;
    }
    ctx.stop_burst().await;
    ctx.hold(300, 1500).await;
    for &id in &ids {
        ctx.restart(id)?;
        ctx.hold(0, 600).await;
    }
    check_restarted(ctx, &ids).await;
    Ok(())
}

/// A follower loses power while it installs a snapshot: it is cut off
/// while a burst moves the leader's snapshot past its log, the network is
/// healed, and its power is cut at a seeded moment while the leader sends
/// it the snapshot. After the restart it must catch up.
pub(super) async fn during_snapshot_install(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let follower = ctx.pick(&followers);
    let applied_before = ctx
        .cluster
        .own_state(follower)
        .await
        .map_or(0, |(applied, _)| applied);
    ctx.cluster.net.isolate(&[follower])?;
    ctx.fault(format!("isolate follower {follower}"));
    ctx.start_burst_avoiding(4, Some(follower));
    let deadline = Instant::now() + Duration::from_secs(45);
    while Instant::now() < deadline {
        let snapshot = match ctx.cluster.wait_leader_among(&followers).await {
            Some(leader) => ctx
                .cluster
                .metric(leader, "llmgw_raft_snapshot_index")
                .await
                .unwrap_or(0.0),
            None => 0.0,
        };
        if snapshot >= (applied_before + 60) as f64 {
            ctx.fault(format!("leader snapshot at index {snapshot}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.stop_burst().await;
    let installed_before = ctx
        .cluster
        .metric(follower, "llmgw_raft_snapshots_installed_total")
        .await;
    ctx.heal()?;
    // The leader sends the snapshot as soon as the follower is reachable.
    ctx.hold(50, 700).await;
    cut(ctx, follower)?;
    ctx.fault(format!(
        "peer {follower} had installed {installed_before:?} snapshot(s) before healing"
    ));
    ctx.hold(500, 1500).await;
    ctx.restart(follower)?;
    ctx.hold(2000, 3000).await;
    check_restarted(ctx, &[follower]).await;
    Ok(())
}
