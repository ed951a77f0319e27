//! Peers that go silent under a fleet (agents, engines, routers attached,
//! liveness short: `node_ttl` 2 s, `lost_after` 6 s, `leader_grace` 4 s):
//! a paused leader or follower, a leader cut off from its peers while
//! agents and clients still reach it, one-way partitions, a long
//! partition, a rolling restart.
//!
//! None of these faults touches a node: the agents' streams and the
//! engines stay reachable from some peer throughout. So the fleet
//! invariants hold them to the strictest reading: no node is marked
//! unreachable or lost, no replica is retired, every router request is
//! served except through a router whose own peer was down.

use std::time::{Duration, Instant};

use llmgw_api::{ClusterView, paths};
use rand::Rng;
use rand::seq::SliceRandom;

use super::{Ctx, ScenarioError};
use crate::fleet::{self, Subject};
use crate::invariants;

/// After a fault heals, how long the schedule keeps watching before the
/// runner heals and settles: long enough for a woken or reconnected peer
/// to disturb the others (an election timeout is at most 1.6 s), and for
/// a wrong liveness decision to be taken (`node_ttl` + `lost_after`).
const WATCH_AFTER: (u64, u64) = (6000, 8000);

/// How soon after its fault heals a cut-off or woken leader must name its
/// successor (election timeouts are 250-450 ms, heartbeats 80 ms).
const REJOIN_WITHIN_US: u64 = 10_000_000;

/// Checks later that `peer` named the others' leader within
/// `REJOIN_WITHIN_US` of now (its fault just healed).
pub(super) fn check_rejoined(ctx: &mut Ctx, peer: u64) {
    let healed_us = ctx.history.now_us();
    ctx.check_later(move |ev| {
        invariants::rejoined_after_healing(&ev.leader_samples, peer, healed_us, REJOIN_WITHIN_US)
    });
}

/// Sleeps `total`, noting the first moment at which one of `among`
/// names a leader of `among` (a new leader on the majority side): how
/// long into the fault that was, if it happened.
pub(super) async fn hold_watching_majority(
    ctx: &mut Ctx,
    among: &[u64],
    total: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut seen = None;
    while started.elapsed() < total {
        if seen.is_none()
            && let Some(leader) = ctx.cluster.wait_leader_among(among).await
            && among.contains(&leader)
        {
            seen = Some(started.elapsed());
            ctx.fault(format!(
                "peer {leader} leads the majority ({:.1}s into the fault)",
                started.elapsed().as_secs_f64()
            ));
        }
        let left = total.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(Duration::from_millis(250))).await;
    }
    if seen.is_none() {
        ctx.fault(format!(
            "no peer of {among:?} led during the {:.0}s fault",
            total.as_secs_f64()
        ));
    }
    seen
}

/// Holds the fault like [`hold_watching_majority`], and requires the
/// majority `among` to have failed over within [`Ctx::failover_bound`]: a
/// scenario whose point is a failover fails when none happens.
pub(super) async fn hold_requiring_failover(ctx: &mut Ctx, among: &[u64], total: Duration) {
    let led = hold_watching_majority(ctx, among, total).await;
    let bound = ctx.failover_bound();
    let verdict = match (led, &bound) {
        (_, Err(why)) => Err(format!("no bound to hold the failover to: {why}")),
        (Some(after), Ok(bound)) if after <= *bound => Ok(()),
        (Some(after), Ok(bound)) => Err(format!(
            "peers {among:?} first named a leader of their own {:.1}s into the fault, later than \
             {bound:?}",
            after.as_secs_f64()
        )),
        (None, _) => Err(format!(
            "no peer of {among:?} led during the {:.0}s fault: the majority never failed over",
            total.as_secs_f64()
        )),
    };
    super::ctx::promise(
        ctx,
        invariants::MAJORITY_FAILED_OVER,
        format!(
            "peers {among:?} name a leader of their own within {:.1}s of the fault",
            bound.map_or(0.0, |b| b.as_secs_f64())
        ),
        verdict,
    );
}

/// The harness's own check of a cut between `leader` and its peers: every
/// agent's namespace still opens a connection to the leader's gRPC port
/// (the agents' streams are untouched), and no peer's does (the cut is
/// real, whichever way it drops). Clients on the host are checked by the
/// caller. `Err` says what the network does instead.
fn check_cut(ctx: &Ctx, leader: u64) -> Result<String, ScenarioError> {
    let net = &ctx.cluster.net;
    let target = net.peer_ip(leader);
    let mut wrong = Vec::new();
    let nodes: Vec<(String, u64)> = ctx
        .fleet
        .iter()
        .flat_map(|f| f.agents.iter().map(|(id, a)| (id.clone(), a.addr)))
        .collect();
    for (node, addr) in &nodes {
        if !crate::netns::connects(net.namespace(*addr), target, fleet::STREAM_PORT) {
            wrong.push(format!("agent {node} cannot reach leader {leader}"));
        }
    }
    for peer in ctx.followers(leader) {
        if net.reaches(peer, leader, fleet::STREAM_PORT) {
            wrong.push(format!("peer {peer} still reaches leader {leader}"));
        }
    }
    if wrong.is_empty() {
        Ok(format!(
            "checked: {} agents reach leader {leader}'s gRPC port, its peers do not",
            nodes.len()
        ))
    } else {
        Err(ScenarioError::Setup(format!(
            "the harness's cut is not what it should be: {}",
            wrong.join("; ")
        )))
    }
}

/// SIGSTOP the leader for `secs` seconds, SIGCONT, watch.
async fn pause_leader(ctx: &mut Ctx, secs: u64) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    ctx.pause(leader);
    ctx.fault(format!(
        "leader {leader} paused for {secs} s (node_ttl {:?}, lost_after {:?})",
        fleet::NODE_TTL,
        fleet::LOST_AFTER
    ));
    hold_requiring_failover(ctx, &followers, Duration::from_secs(secs)).await;
    ctx.resume(leader);
    check_rejoined(ctx, leader);
    ctx.hold(WATCH_AFTER.0, WATCH_AFTER.1).await;
    Ok(())
}

pub(super) async fn leader_sigstop_10s(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    pause_leader(ctx, 10).await
}

pub(super) async fn leader_sigstop_30s(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    pause_leader(ctx, 30).await
}

/// SIGSTOP a follower for 10 s while the leader stays healthy: nothing
/// may change, neither while it sleeps nor when it wakes.
pub(super) async fn follower_sigstop_10s(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let Some((term, Some(named))) = ctx.cluster.leader_view(leader).await else {
        return Err(ScenarioError::Setup(format!(
            "leader {leader} did not say its term"
        )));
    };
    if named != leader {
        return Err(ScenarioError::Setup(format!(
            "peer {leader} names {named} as leader"
        )));
    }
    let followers = ctx.followers(leader);
    let paused = ctx.pick(&followers);
    let from_us = ctx.history.now_us();
    ctx.pause(paused);
    ctx.fault(format!(
        "follower {paused} paused for 10 s; leader {leader} of term {term} stays healthy"
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    ctx.resume(paused);
    ctx.hold(WATCH_AFTER.0, WATCH_AFTER.1).await;
    let to_us = ctx.history.now_us();
    ctx.check_later(move |ev| {
        invariants::no_term_change_while_follower_paused(
            &ev.leader_samples,
            paused,
            leader,
            term,
            from_us,
            to_us,
        )
    });
    ctx.check_later(move |ev| {
        invariants::healthy_leader_kept_streams(
            &ev.peer_logs,
            &ev.agent_logs,
            ev.wall_zero_us,
            from_us,
            to_us,
        )
    });
    Ok(())
}

/// Cuts `leader` off from both peers for `hold`: nftables rules in the
/// peers' namespaces only, so the agents' streams, the engines and the
/// clients on the host still reach it. Checks the client path itself.
async fn cut_leader_from_peers(
    ctx: &mut Ctx,
    leader: u64,
    hold: Duration,
) -> Result<(), ScenarioError> {
    let followers = ctx.followers(leader);
    ctx.cluster.net.isolate(&[leader])?;
    // Control plane only: the leader's router serves from its state.
    ctx.open_window(Subject::Peer(leader), false);
    ctx.fault(format!(
        "cut leader {leader} off from peers {followers:?} for {:.0} s (2 x lost_after is {:?}); agents, engines and clients still reach it",
        hold.as_secs_f64(),
        fleet::LOST_AFTER * 2
    ));
    if let Err(why) = ctx.cluster.get::<ClusterView>(leader, paths::CLUSTER).await {
        return Err(ScenarioError::Setup(format!(
            "the harness cut clients off too: peer {leader} does not answer the host: {why}"
        )));
    }
    hold_cut_then_heal(ctx, leader, &followers, hold).await
}

pub(super) async fn leader_cut_from_peers(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    cut_leader_from_peers(ctx, leader, fleet::LOST_AFTER * 2).await
}

pub(super) async fn partition_60s(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    cut_leader_from_peers(ctx, leader, Duration::from_secs(60)).await
}

/// Drops, for 2 x lost_after, every packet between the leader and both
/// peers in one direction only (`to_peers`: what the leader sends;
/// otherwise what the peers send it). Agents and clients are untouched.
async fn one_way(ctx: &mut Ctx, to_peers: bool) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    for &f in &followers {
        if to_peers {
            ctx.cluster.net.block(leader, f)?;
        } else {
            ctx.cluster.net.block(f, leader)?;
        }
    }
    ctx.open_window(Subject::Peer(leader), false);
    let hold = fleet::LOST_AFTER * 2;
    ctx.fault(if to_peers {
        format!(
            "drop everything leader {leader} sends to peers {followers:?} for {:.0} s",
            hold.as_secs_f64()
        )
    } else {
        format!(
            "drop everything peers {followers:?} send to leader {leader} for {:.0} s",
            hold.as_secs_f64()
        )
    });
    hold_cut_then_heal(ctx, leader, &followers, hold).await
}

pub(super) async fn one_way_leader_to_peers(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    one_way(ctx, true).await
}

pub(super) async fn one_way_peers_to_leader(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    one_way(ctx, false).await
}

/// Every peer in turn, in a seeded order: SIGTERM, a pause, start again
/// with the same config and data, wait until it has caught up and the
/// fleet is ready, then the next. The admin and router load run
/// throughout.
pub(super) async fn rolling_restart(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let mut order = ctx.cluster.member_ids();
    order.shuffle(&mut ctx.rng);
    ctx.fault(format!("rolling restart in the order {order:?}"));
    for id in order {
        let leading = ctx.leader().await? == id;
        ctx.open_window(Subject::Peer(id), true);
        let (clean, took) = ctx.cluster.terminate(id, Duration::from_secs(15));
        ctx.fault(format!(
            "SIGTERM peer {id}{}: {} after {} ms",
            if leading { " (the leader)" } else { "" },
            if clean {
                "exited"
            } else {
                "killed with SIGKILL"
            },
            took.as_millis()
        ));
        let pause = ctx.rng.random_range(1000..2000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        ctx.cluster.spawn(id)?;
        ctx.fault(format!("restart peer {id}"));
        // Caught up: it names a leader and has applied what the leader
        // had applied when it was asked.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let leader = ctx.cluster.wait_leader(Duration::from_secs(30)).await?;
            let target = ctx.cluster.own_state(leader).await.map(|(a, _)| a);
            let mine = ctx.cluster.own_state(id).await.map(|(a, _)| a);
            if let (Some(target), Some(mine)) = (target, mine)
                && mine >= target
            {
                // Its router serves from the state it has caught up to.
                ctx.close_window(&Subject::Peer(id));
                ctx.fault(format!(
                    "peer {id} caught up (applied {mine}; leader {leader})"
                ));
                break;
            }
            if Instant::now() > deadline {
                return Err(ScenarioError::Setup(format!(
                    "peer {id} did not catch up within 60s of its restart: applied {mine:?}, leader {leader} {target:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let desired = ctx.desired.clone();
        ctx.wait_fleet(Duration::from_secs(60), |s| fleet::fleet_ready(s, &desired))
            .await
            .map_err(|why| {
                ScenarioError::Setup(format!(
                    "the fleet was not ready within 60s of peer {id}'s restart: {why}"
                ))
            })?;
        ctx.hold(2000, 3000).await;
    }
    Ok(())
}

/// With the leader cut off (both ways or one): checks the cut spares
/// agents and clients, holds it while watching the majority, heals, and
/// checks that the old leader rejoins.
async fn hold_cut_then_heal(
    ctx: &mut Ctx,
    leader: u64,
    followers: &[u64],
    hold: Duration,
) -> Result<(), ScenarioError> {
    let checked = check_cut(ctx, leader)?;
    ctx.fault(checked);
    hold_requiring_failover(ctx, followers, hold).await;
    ctx.heal()?;
    ctx.close_window(&Subject::Peer(leader));
    check_rejoined(ctx, leader);
    ctx.hold(WATCH_AFTER.0, WATCH_AFTER.1).await;
    Ok(())
}
