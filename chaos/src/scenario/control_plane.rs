//! Fault schedules of the control plane alone (no fleet): kills,
//! pauses, partitions, loss, membership changes.

use std::time::{Duration, Instant};

use llmgw_api::{AddPeer, Membership, paths};
use rand::Rng;
use rand::seq::SliceRandom;

use super::silent_peers::{check_rejoined, hold_requiring_failover};
use super::{Ctx, ScenarioError};
use crate::invariants::{self, Checked};

pub(super) async fn leader_sigkill(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    for _ in 0..2 {
        let leader = ctx.leader().await?;
        ctx.kill(leader);
        ctx.hold(2500, 5000).await;
        ctx.restart(leader)?;
        ctx.hold(1500, 3000).await;
    }
    Ok(())
}

pub(super) async fn follower_kill_restart(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    for _ in 0..2 {
        let leader = ctx.leader().await?;
        let followers = ctx.followers(leader);
        let victim = ctx.pick(&followers);
        ctx.kill(victim);
        ctx.hold(2000, 5000).await;
        ctx.restart(victim)?;
        ctx.hold(1500, 3000).await;
    }
    Ok(())
}

pub(super) async fn leader_isolated_minority(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    ctx.cluster.net.isolate(&[leader])?;
    let followers = ctx.followers(leader);
    let cut: Vec<(u64, u64)> = followers
        .iter()
        .flat_map(|&f| [(leader, f), (f, leader)])
        .collect();
    let proof = probe_cut(ctx, &cut, &both_ways(&followers));
    ctx.confirmed(
        format!("isolate leader {leader} from both followers"),
        proof,
    );
    hold_for_failover(ctx, &followers, 4000, 8000).await;
    ctx.heal()?;
    check_rejoined(ctx, leader);
    ctx.hold(1500, 3000).await;
    Ok(())
}

pub(super) async fn one_way_partition(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    for &follower in &followers {
        ctx.cluster.net.block(leader, follower)?;
    }
    let cut: Vec<(u64, u64)> = followers.iter().map(|&f| (leader, f)).collect();
    let proof = probe_cut(ctx, &cut, &both_ways(&followers));
    ctx.confirmed(
        format!("drop all traffic from leader {leader} to the followers"),
        proof,
    );
    // The followers hear nothing from the leader: they must elect.
    hold_for_failover(ctx, &followers, 4000, 7000).await;
    ctx.heal()?;
    check_rejoined(ctx, leader);
    ctx.hold(1500, 3000).await;
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let sender = ctx.pick(&followers);
    let others: Vec<u64> = ctx
        .cluster
        .member_ids()
        .into_iter()
        .filter(|id| *id != sender)
        .collect();
    for &other in &others {
        ctx.cluster.net.block(sender, other)?;
    }
    let cut: Vec<(u64, u64)> = others.iter().map(|&o| (sender, o)).collect();
    let proof = probe_cut(ctx, &cut, &both_ways(&others));
    ctx.confirmed(
        format!("drop all traffic from follower {sender} to the others"),
        proof,
    );
    ctx.hold(4000, 7000).await;
    ctx.heal()?;
    check_rejoined(ctx, sender);
    ctx.hold(1500, 3000).await;
    Ok(())
}

pub(super) async fn lossy_links(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    for id in ctx.cluster.member_ids() {
        let loss = ctx.rng.random_range(10..30);
        let delay = ctx.rng.random_range(20..80);
        let how = ctx.cluster.net.degrade(id, loss, delay)?;
        let proof = match ctx.cluster.net.degradation(id) {
            Ok(Some(rule)) => Ok(format!("the kernel shows `{rule}`")),
            Ok(None) => Err("the kernel shows no loss rule".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        ctx.confirmed(format!("peer {id}: {how}"), proof);
    }
    ctx.hold(6000, 10000).await;
    ctx.heal()?;
    ctx.hold(1500, 3000).await;
    Ok(())
}

/// Holds a fault that silenced the leader for a seeded time in
/// `[min_ms, max_ms)` (as `Ctx::hold` would), and requires `followers`
/// to have elected a leader of their own within it.
async fn hold_for_failover(ctx: &mut Ctx, followers: &[u64], min_ms: u64, max_ms: u64) {
    let ms = ctx.rng.random_range(min_ms..max_ms);
    hold_requiring_failover(ctx, followers, Duration::from_millis(ms)).await;
}

/// Every ordered pair of distinct peers in `ids`.
fn both_ways(ids: &[u64]) -> Vec<(u64, u64)> {
    ids.iter()
        .flat_map(|&a| ids.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        .collect()
}

/// Probes a cut the schedule just made, all at once (about a second):
/// from every `(from, to)` of `cut` no connection opens to `to`'s gRPC
/// port, and from every pair of `open` one does, which shows the probe
/// itself works. A cut that did not take effect must not pass as a
/// partition the cluster survived.
fn probe_cut(ctx: &Ctx, cut: &[(u64, u64)], open: &[(u64, u64)]) -> Result<String, String> {
    let net = &ctx.cluster.net;
    let probe = |pairs: &[(u64, u64)]| -> Vec<((u64, u64), bool)> {
        std::thread::scope(|scope| {
            let asked: Vec<_> = pairs
                .iter()
                .map(|&(from, to)| {
                    let ask = scope.spawn(move || net.reaches(from, to, crate::cluster::GRPC_PORT));
                    ((from, to), ask)
                })
                .collect();
            asked
                .into_iter()
                .map(|(pair, ask)| (pair, ask.join().unwrap_or(false)))
                .collect()
        })
    };
    let mut wrong: Vec<String> = probe(cut)
        .into_iter()
        .filter(|(_, reached)| *reached)
        .map(|((from, to), _)| format!("peer {from} still reaches peer {to}"))
        .collect();
    wrong.extend(
        probe(open)
            .into_iter()
            .filter(|(_, reached)| !*reached)
            .map(|((from, to), _)| format!("peer {from} cannot reach peer {to}, which is not cut")),
    );
    if wrong.is_empty() {
        Ok(format!(
            "probed: {} cut direction(s) open no connection, {} open one(s) do",
            cut.len(),
            open.len()
        ))
    } else {
        Err(wrong.join("; "))
    }
}

pub(super) async fn leader_sigstop(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let proof = ctx.cluster.pause(leader);
    ctx.confirmed(format!("SIGSTOP leader {leader}"), proof);
    let followers = ctx.followers(leader);
    hold_for_failover(ctx, &followers, 3000, 6000).await;
    let proof = ctx.cluster.resume(leader);
    ctx.confirmed(format!("SIGCONT peer {leader}"), proof);
    check_rejoined(ctx, leader);
    ctx.hold(2000, 4000).await;
    Ok(())
}

pub(super) async fn write_burst_crash(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.start_burst(6);
    ctx.hold(300, 1500).await;
    let leader = ctx.leader().await?;
    ctx.kill(leader);
    ctx.hold(2000, 4000).await;
    ctx.restart(leader)?;
    ctx.hold(1000, 2000).await;
    ctx.stop_burst().await;
    ctx.fault("stop the burst");
    Ok(())
}

pub(super) async fn whole_cluster_restart(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let mut ids = ctx.cluster.member_ids();
    ids.shuffle(&mut ctx.rng);
    for &id in &ids {
        ctx.kill(id);
        ctx.hold(0, 300).await;
    }
    ctx.hold(1000, 3000).await;
    ids.shuffle(&mut ctx.rng);
    for &id in &ids {
        ctx.restart(id)?;
        ctx.hold(0, 1500).await;
    }
    ctx.leader().await?;
    ctx.hold(1500, 3000).await;
    Ok(())
}

pub(super) async fn follower_lag_snapshot(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let lagging = ctx.pick(&followers);
    let installed_before = ctx
        .cluster
        .metric(lagging, "llmgw_raft_snapshots_installed_total")
        .await
        .unwrap_or(0.0);
    let applied_before = ctx
        .cluster
        .own_state(lagging)
        .await
        .map(|(applied, _)| applied)
        .unwrap_or(0);
    ctx.cluster.net.isolate(&[lagging])?;
    ctx.fault(format!("isolate follower {lagging}"));
    ctx.start_burst_avoiding(3, Some(lagging));
    // Until the leader has purged its log well past what the follower
    // holds, bounded. A snapshot alone is not enough: the leader purges
    // only once no replication is reading those entries, and the isolated
    // follower's append stays in flight until it times out; healed
    // earlier, the follower catches up from the log and needs no snapshot.
    let deadline = Instant::now() + Duration::from_secs(45);
    let (mut snapshot, mut purged) = (0.0, 0.0);
    while Instant::now() < deadline {
        let leader = ctx.cluster.wait_leader_among(&followers).await;
        if let Some(leader) = leader {
            snapshot = ctx
                .cluster
                .metric(leader, "llmgw_raft_snapshot_index")
                .await
                .unwrap_or(0.0);
            purged = ctx
                .cluster
                .metric(leader, "llmgw_raft_purged_index")
                .await
                .unwrap_or(0.0);
            if purged >= (applied_before + 40) as f64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.fault(format!(
        "leader snapshot at index {snapshot}, log purged to {purged}, follower {lagging} applied {applied_before}"
    ));
    ctx.stop_burst().await;
    ctx.heal()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut installed = installed_before;
    while Instant::now() < deadline {
        installed = ctx
            .cluster
            .metric(lagging, "llmgw_raft_snapshots_installed_total")
            .await
            .unwrap_or(installed);
        if installed > installed_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.extra_checks.push(Checked::new(
        invariants::SNAPSHOT_INSTALLED,
        format!("follower {lagging}"),
        if installed > installed_before {
            Vec::new()
        } else {
            vec![format!(
                "follower {lagging} installed no snapshot within 30s of healing \
                 (leader snapshot index {snapshot}, follower had applied {applied_before})"
            )]
        },
    ));
    ctx.hold(1000, 2000).await;
    Ok(())
}

pub(super) async fn peer_replacement(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    const NEW: u64 = 4;
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let retiring = ctx.pick(&followers);
    ctx.cluster.prepare_new_peer(NEW, &[1, 2, 3])?;
    ctx.cluster.spawn(NEW)?;
    ctx.fault(format!("start new peer {NEW}"));
    let http = ctx.cluster.admin_client(Duration::from_secs(75));
    let body = serde_json::to_string(&AddPeer {
        id: NEW,
        grpc: ctx.cluster.grpc(NEW),
        admin: ctx.cluster.admin(NEW),
    })
    .expect("a request of strings and numbers encodes");
    let via = ctx.cluster.admin(retiring);
    let add = {
        let http = http.clone();
        let body = body.clone();
        let url = format!("{via}{}", paths::CLUSTER_PEERS);
        tokio::spawn(async move {
            http.post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    ctx.fault(format!("ask peer {retiring} to add peer {NEW}"));
    ctx.hold(0, 800).await;
    ctx.kill(leader);
    ctx.hold(2000, 4000).await;
    ctx.restart(leader)?;
    let first = add.await;
    ctx.fault(format!("the first add answered {first:?}"));
    // Until peer 4 is a voter, asking again (the change may or may not
    // have survived the crash).
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if ctx.cluster.membership_of(NEW).await == Ok(Some(Membership::Voter)) {
            break;
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Setup(format!(
                "peer {NEW} did not become a voter within 90s"
            )));
        }
        let leader = ctx.leader().await?;
        let url = format!("{}{}", ctx.cluster.admin(leader), paths::CLUSTER_PEERS);
        let answer = http
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .map(|r| r.status().as_u16());
        ctx.fault(format!("ask leader {leader} to add peer {NEW}: {answer:?}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ctx.cluster.set_member(NEW, true);
    ctx.fault(format!("peer {NEW} is a voter"));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let leader = ctx.leader().await?;
        let url = format!("{}{}", ctx.cluster.admin(leader), paths::peer(retiring));
        let answer = http.delete(url).send().await.map(|r| r.status().as_u16());
        ctx.fault(format!(
            "ask leader {leader} to remove peer {retiring}: {answer:?}"
        ));
        if matches!(answer, Ok(200)) || ctx.cluster.membership_of(retiring).await == Ok(None) {
            break;
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Setup(format!(
                "peer {retiring} was not removed within 90s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ctx.cluster.set_member(retiring, false);
    ctx.kill(retiring);
    ctx.hold(1500, 3000).await;
    Ok(())
}
