//! Restore after elections, with the fleet attached: a backup is saved,
//! two elections follow (the agents obey both), then every peer is
//! stopped, its data directory moved aside, restored from the backup and
//! started again. Terms start again from the backup's, below what the
//! agents have obeyed; the restored cluster begins a later epoch, which
//! they take as newer, so they obey it: a model scaled up after the
//! restore gets its new replica started by an agent.
//!
//! The admin load pauses before the save and resumes when the run heals:
//! a write acknowledged after the save is lost by the restore, as an
//! operator restoring a backup expects, and the run's history must not
//! count it.

use std::path::Path;
use std::time::{Duration, Instant};

use llmgw_api::{ClusterView, paths};

use super::ctx::{latest, promise, scale_small_up};
use super::fleet_faults::wait_successor;
use super::{Ctx, ScenarioError};
use crate::cluster::get_view;
use crate::fleet::{self, FleetSample};
use crate::load::CLIENT_TIMEOUT;

pub const RESTORED_EPOCH_LATER: &str = "restored-cluster-begins-a-later-epoch";
pub const RESTORED_CLUSTER_OBEYED: &str = "agents-obey-the-restored-cluster";

/// How long in-flight admin requests get to finish once the load pauses:
/// past the client timeout, every one has its outcome.
const LOAD_DRAINS: Duration = Duration::from_secs(CLIENT_TIMEOUT.as_secs() + 1);
/// How long the restored cluster has to begin its epoch.
const EPOCH_WITHIN: Duration = Duration::from_secs(60);
/// How long an agent has to start the replica of the scale-up.
const OBEYED_WITHIN: Duration = Duration::from_secs(90);

pub(super) async fn restore_after_elections(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.quiet_load();
    tokio::time::sleep(LOAD_DRAINS).await;
    let leader = ctx.leader().await?;
    let before = epoch_of(ctx, leader).await?;
    let backup = ctx.cluster.dir.join("backup.json");
    let bytes = save_backup(ctx, leader, &backup).await?;
    ctx.fault(format!(
        "backup saved through peer {leader}: {bytes} bytes, epoch {before}"
    ));

    for election in 1..=2 {
        let leader = ctx.leader().await?;
        let followers = ctx.followers(leader);
        ctx.kill(leader);
        wait_successor(ctx, &followers, &format!("election {election}")).await?;
        ctx.restart(leader)?;
        ctx.hold(2000, 3000).await;
    }
    let obeyed_terms = agent_terms(&latest(ctx)?);
    ctx.fault(format!("the agents have obeyed terms {obeyed_terms:?}"));

    let peers = ctx.cluster.member_ids();
    for &id in &peers {
        ctx.kill(id);
    }
    for &id in &peers {
        let restored = restore_peer(ctx, id, &backup)?;
        ctx.fault(restored);
    }
    for &id in &peers {
        ctx.restart(id)?;
    }
    let leader = ctx.leader().await?;
    let after = later_epoch(ctx, before).await;
    promise(
        ctx,
        RESTORED_EPOCH_LATER,
        format!("the restored cluster's epoch against the backup's {before}"),
        after.map(|_| ()),
    );
    ctx.fault(format!("peer {leader} leads the restored cluster"));

    let obeyed = obeys_a_scale_up(ctx).await;
    promise(
        ctx,
        RESTORED_CLUSTER_OBEYED,
        format!(
            "{} scaled up by the restored cluster, its agents having obeyed terms {obeyed_terms:?}",
            fleet::SMALL
        ),
        obeyed,
    );
    Ok(())
}

async fn epoch_of(ctx: &Ctx, peer: u64) -> Result<u64, ScenarioError> {
    get_view::<ClusterView>(&ctx.cluster.http, &ctx.cluster.admin(peer), paths::CLUSTER)
        .await
        .map(|view| view.epoch.unwrap_or(0))
        .map_err(|e| ScenarioError::Setup(format!("peer {peer}'s cluster view: {e}")))
}

/// `GET /api/v1/snapshot` through `peer`, written to `file` (what `llmgw
/// ctl snapshot save` does); its size.
async fn save_backup(ctx: &Ctx, peer: u64, file: &Path) -> Result<usize, ScenarioError> {
    let url = format!("{}{}", ctx.cluster.admin(peer), paths::SNAPSHOT);
    let failed = |e: String| ScenarioError::Setup(format!("backup through peer {peer}: {e}"));
    let response = ctx
        .cluster
        .admin_client(Duration::from_secs(30))
        .get(&url)
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        return Err(failed(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    std::fs::write(file, &body).map_err(|e| failed(format!("{}: {e}", file.display())))?;
    Ok(body.len())
}

/// The term in every agent's `leader-term`.
fn agent_terms(sample: &FleetSample) -> Vec<(String, u64)> {
    sample
        .agents
        .iter()
        .map(|agent| (agent.node.clone(), agent.leader_term))
        .collect()
}

/// Moves peer `id`'s data directory aside and restores it from `backup`
/// with `llmgw server --restore`; what the restore printed.
fn restore_peer(ctx: &Ctx, id: u64, backup: &Path) -> Result<String, ScenarioError> {
    let layout = &ctx.cluster.peers[&id].layout;
    let aside = layout.data_dir.with_extension("before-restore");
    std::fs::rename(&layout.data_dir, &aside).map_err(|e| {
        ScenarioError::Setup(format!("moving {} aside: {e}", layout.data_dir.display()))
    })?;
    let out = std::process::Command::new(&ctx.cluster.bin)
        .args(["server", "--config"])
        .arg(&layout.config)
        .arg("--restore")
        .arg(backup)
        .output()
        .map_err(|e| ScenarioError::Setup(format!("running the restore of peer {id}: {e}")))?;
    let printed = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(ScenarioError::Setup(format!(
            "the restore of peer {id} failed: {printed}{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(printed.lines().next().unwrap_or_default().to_owned())
}

/// The restored cluster's epoch, once a peer names one later than
/// `before`.
async fn later_epoch(ctx: &Ctx, before: u64) -> Result<u64, String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < EPOCH_WITHIN {
        if let Ok(leader) = ctx.cluster.wait_leader(Duration::from_secs(5)).await {
            match epoch_of(ctx, leader).await {
                Ok(epoch) if epoch > before => return Ok(epoch),
                Ok(epoch) => last = format!("epoch {epoch}"),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "no epoch later than {before} within {EPOCH_WITHIN:?}; the last seen: {last}"
    ))
}

/// Scales the small model up by one through the restored cluster; an
/// agent must start the new replica (a fenced-out agent refuses every
/// command), so every desired replica is ready, the new one included.
async fn obeys_a_scale_up(ctx: &mut Ctx) -> Result<(), String> {
    scale_small_up(ctx).await?;
    let desired = ctx.desired.clone();
    let started = Instant::now();
    let done = ctx
        .wait_fleet(OBEYED_WITHIN, |sample| fleet::fleet_ready(sample, &desired))
        .await;
    match done {
        Ok(_) => {
            ctx.fault(format!(
                "an agent started the new replica: ready {:.1}s after the scale-up",
                started.elapsed().as_secs_f64()
            ));
            Ok(())
        }
        Err(why) => Err(format!(
            "the new replica was not ready within {OBEYED_WITHIN:?}: {why}"
        )),
    }
}
