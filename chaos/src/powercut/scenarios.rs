//! The power-cut scenarios. Peers run on lazy disks (see the module
//! docs); a power cut kills the peer and drops everything its disk had not
//! synced, sometimes tearing the last unsynced bytes, before it restarts.
//! Every standard invariant is checked afterwards (acknowledged writes on
//! every peer, equal state hashes, linearizable registers, one leader per
//! term), plus `every-peer-restarted`: no peer refused to start.

use std::time::Duration;

use rand::Rng;

use crate::scenario::{Ctx, ScenarioError};

/// Name prefix of the scenarios that need lazy disks.
pub const PREFIX: &str = "power-cut";

pub const EVERY_PEER_RESTARTED: &str = "every-peer-restarted";

/// Power cut of `id`, torn or not by the seed; logged as a fault.
fn cut(ctx: &mut Ctx, id: u64) -> Result<(), ScenarioError> {
    let tear = ctx.rng().random_bool(0.5);
    ctx.open_peer_window(id);
    let report = if tear {
        let mut rng = ctx.rng().clone();
        let report = ctx.cluster.power_cut(id, Some(&mut rng));
        // Keep the schedule's own generator moving the same way.
        let _ = ctx.rng().random::<u64>();
        report
    } else {
        ctx.cluster.power_cut(id, None)
    }
    .map_err(ScenarioError::Setup)?;
    ctx.log_fault(super::describe(id, &report));
    Ok(())
}

/// After healing: every peer whose power was cut runs again and answers.
async fn check_restarted(ctx: &mut Ctx, ids: &[u64]) {
    let mut violations = Vec::new();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for &id in ids {
        if !ctx.cluster.is_running(id) {
            violations.push(format!(
                "peer {id} exited after its power cut (refused to start?):\n{}",
                ctx.cluster.log_tails()
            ));
        } else if ctx.cluster.own_state(id).await.is_none() {
            violations.push(format!("peer {id} runs but does not answer its admin API"));
        }
    }
    ctx.add_check(
        EVERY_PEER_RESTARTED,
        format!("peers {ids:?} after their power cuts"),
        violations,
    );
}

/// One peer (the leader or a follower, by seed) loses power under load,
/// twice.
pub async fn one_peer(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let mut cut_ids = Vec::new();
    for _ in 0..2 {
        let leader = ctx.current_leader().await?;
        let victim = if ctx.rng().random_bool(0.5) {
            leader
        } else {
            let followers = ctx.follower_ids(leader);
            followers[ctx.rng().random_range(0..followers.len())]
        };
        cut(ctx, victim)?;
        ctx.hold_ms(500, 2000).await;
        ctx.restart_peer(victim)?;
        cut_ids.push(victim);
        ctx.hold_ms(1500, 3000).await;
    }
    cut_ids.sort_unstable();
    cut_ids.dedup();
    check_restarted(ctx, &cut_ids).await;
    Ok(())
}

/// All three lose power at once in the middle of a write burst.
pub async fn all_peers(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.burst(4);
    ctx.hold_ms(500, 1500).await;
    let ids = ctx.cluster.member_ids();
    for &id in &ids {
        cut(ctx, id)?;
    }
    ctx.end_burst().await;
    ctx.hold_ms(300, 1500).await;
    for &id in &ids {
        ctx.restart_peer(id)?;
        ctx.hold_ms(0, 600).await;
    }
    check_restarted(ctx, &ids).await;
    Ok(())
}

/// A follower loses power while it installs a snapshot: it is cut off
/// while a burst moves the leader's snapshot past its log, healed, and
/// cut at a seeded moment while the leader sends it the snapshot.
pub async fn during_snapshot_install(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.current_leader().await?;
    let followers = ctx.follower_ids(leader);
    let follower = followers[ctx.rng().random_range(0..followers.len())];
    ctx.isolate_peer(follower)?;
    ctx.burst(4);
    ctx.hold_ms(2500, 3500).await;
    ctx.end_burst().await;
    ctx.heal_network()?;
    // The leader sends the snapshot as soon as it reaches the follower.
    ctx.hold_ms(0, 600).await;
    let installed_before = ctx
        .cluster
        .metric(follower, "llmgw_raft_snapshots_installed_total")
        .await;
    cut(ctx, follower)?;
    ctx.log_fault(format!(
        "peer {follower} had installed {installed_before:?} snapshot(s) when the power went"
    ));
    ctx.hold_ms(500, 1500).await;
    ctx.restart_peer(follower)?;
    ctx.hold_ms(2000, 3000).await;
    check_restarted(ctx, &[follower]).await;
    Ok(())
}
