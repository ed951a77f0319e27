//! Data disks filling up under a fleet.
//!
//! * The leader's: while it is short of space it refuses writes with
//!   `507 disk_full`, hands leadership to a peer with room (agents
//!   re-home, routers keep serving, no node is marked down), and once
//!   space returns it takes writes again by itself.
//! * Every peer's: no peer has room to lead, so leadership stays where it
//!   is (at most one change), writes are refused, and the leader's own
//!   decisions (liveness verdicts) go on from the reserve: a node whose
//!   agent was killed still goes unreachable, then lost.
//!
//! The peers' data directories are small tmpfs disks
//! (`crate::small_disks`); `raft.min_free_disk_mb` is [`RESERVE_MB`].

use std::time::{Duration, Instant};

use super::ctx::{pick_small_node, promise, write_through};
use super::silent_peers::{hold_requiring_failover, hold_watching_majority};
use super::{Ctx, ScenarioError};
use crate::fleet::{self, Subject};
use crate::invariants::Checked;
use crate::load::{self, LeaderSample};

pub const FULL_PEER_REFUSED_WRITES: &str = "full-peer-refused-writes";
pub const FULL_PEER_GAVE_UP_LEADERSHIP: &str = "full-peer-gave-up-leadership";
pub const FULL_PEER_WRITES_AGAIN: &str = "full-peer-writes-again";
pub const ALL_FULL_LEADERSHIP_KEPT: &str = "all-full-leadership-kept";
pub const ALL_FULL_NODE_LOST: &str = "all-full-killed-agent-node-lost";

/// `raft.min_free_disk_mb` in this scenario.
pub const RESERVE_MB: u64 = 32;
/// The fleet's short liveness (`fleet::LIVENESS_YAML`) and the reserve.
pub const YAML: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 6s\n  leader_grace: 4s\nraft:\n  min_free_disk_mb: 32\n";
/// What filling leaves free: below the reserve, with room for the entries
/// the peer still appends as a follower.
const LEAVE_MB: u64 = 16;
/// How long the disk stays full: twice `lost_after`, so a node wrongly
/// judged by a leader that cannot write would be lost meanwhile.
const FULL_FOR: Duration = Duration::from_secs(12);
/// The full leader checks its disk every second, then hands over.
const HAND_OVER_WITHIN_US: u64 = 5_000_000;
/// How long the peer has to take a write once space returns.
const WRITES_AGAIN_WITHIN: Duration = Duration::from_secs(30);

pub(super) async fn leader_disk_full(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let full = ctx.leader().await?;
    let free_mb = ctx
        .cluster
        .small_disk(full)
        .and_then(|disk| disk.fill(LEAVE_MB))
        .map_err(ScenarioError::Setup)?;
    let full_us = ctx.history.now_us();
    ctx.fault(format!(
        "peer {full}'s data disk filled: {free_mb} MiB free, below raft.min_free_disk_mb {RESERVE_MB}"
    ));
    let refused = refuses_writes(ctx, full).await;
    ctx.extra_checks.push(refused);
    let others = ctx.followers(full);
    hold_requiring_failover(ctx, &others, FULL_FOR).await;

    let freed_us = ctx.history.now_us();
    ctx.cluster
        .small_disk(full)
        .and_then(|disk| disk.free())
        .map_err(ScenarioError::Setup)?;
    ctx.fault(format!("peer {full}'s data disk has room again"));
    ctx.check_later(move |ev| gave_up_leadership(&ev.leader_samples, full, full_us, freed_us));
    let again = writes_again(ctx, full).await;
    ctx.extra_checks.push(again);
    ctx.hold(6000, 8000).await;
    Ok(())
}

/// What filling every disk leaves free: below the reserve, above half of
/// it, which the leader's own decisions may still use.
const LEAVE_ALL_MB: u64 = 24;
/// At most this many leadership changes while every disk is full.
const MAX_CHANGES_ALL_FULL: usize = 1;
/// Fewer leader samples than this while every disk is full prove nothing.
const MIN_SAMPLES_ALL_FULL: usize = 100;

pub(super) async fn every_disk_full(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = super::ctx::latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let peers = ctx.cluster.member_ids();
    // The leader's last: a leader filled first would rightly hand over to
    // a follower that still has room for a moment.
    let first_leader = ctx.leader().await?;
    let mut order = ctx.followers(first_leader);
    order.push(first_leader);
    for &id in &order {
        let free_mb = ctx
            .cluster
            .small_disk(id)
            .and_then(|disk| disk.fill(LEAVE_ALL_MB))
            .map_err(ScenarioError::Setup)?;
        ctx.fault(format!(
            "peer {id}'s data disk filled: {free_mb} MiB free, below raft.min_free_disk_mb {RESERVE_MB}"
        ));
    }
    let full_us = ctx.history.now_us();
    let leader = ctx.leader().await?;
    let refused = refuses_writes(ctx, leader).await;
    ctx.extra_checks.push(refused);

    // Its replicas are retired once it is lost: requests to them may fail.
    ctx.open_window(Subject::Node(node.clone()), true);
    ctx.fleet
        .as_mut()
        .expect("a fleet scenario")
        .kill_agent(&node);
    ctx.fault(format!(
        "SIGKILL the agent of node {node} (its engines keep running)"
    ));
    let seen = node_goes_unreachable_then_lost(ctx, &node).await;
    promise(
        ctx,
        ALL_FULL_NODE_LOST,
        format!("node {node}, its agent killed while every disk was full"),
        seen,
    );
    // Any leader will do here: no peer has room to lead anew.
    hold_watching_majority(ctx, &peers, Duration::from_secs(3)).await;

    let freed_us = ctx.history.now_us();
    for &id in &peers {
        ctx.cluster
            .small_disk(id)
            .and_then(|disk| disk.free())
            .map_err(ScenarioError::Setup)?;
    }
    ctx.fault("every data disk has room again");
    ctx.check_later(move |ev| leadership_kept(&ev.leader_samples, full_us, freed_us));
    ctx.fleet
        .as_mut()
        .expect("a fleet scenario")
        .spawn(&ctx.cluster, &node)?;
    ctx.close_window(&Subject::Node(node.clone()));
    ctx.fault(format!("restart the agent of node {node}"));
    let again = writes_again(ctx, leader).await;
    ctx.extra_checks.push(again);
    ctx.hold(3000, 5000).await;
    Ok(())
}

/// The node is seen `unreachable` within `node_ttl` and some slack, then
/// `lost` within `lost_after` and some slack.
async fn node_goes_unreachable_then_lost(ctx: &mut Ctx, node: &str) -> Result<(), String> {
    let started = Instant::now();
    let mut seen = Vec::new();
    for (status, bound) in [
        ("unreachable", fleet::NODE_TTL + Duration::from_secs(10)),
        ("lost", fleet::LOST_AFTER + Duration::from_secs(15)),
    ] {
        let reached = ctx
            .wait_fleet(bound, |s| {
                match s.nodes.as_ref().and_then(|n| n.get(node)) {
                    Some((now, _))
                        if now == status || (status == "unreachable" && now == "lost") =>
                    {
                        Ok(())
                    }
                    other => Err(format!("node {node} is {other:?}")),
                }
            })
            .await;
        match reached {
            Ok(_) => {
                ctx.fault(format!(
                    "node {node} {status} {:.1}s after its agent was killed",
                    started.elapsed().as_secs_f64()
                ));
                seen.push(status);
            }
            Err(why) => {
                return Err(format!(
                    "node {node} was not {status} within {bound:?} (seen so far: {seen:?}): {why}"
                ));
            }
        }
    }
    Ok(())
}

/// While every disk was full, leadership changed at most
/// `MAX_CHANGES_ALL_FULL` times: every leadership named after the first
/// counts as one change.
fn leadership_kept(samples: &[LeaderSample], full_us: u64, freed_us: u64) -> Checked {
    let window: Vec<&LeaderSample> = samples
        .iter()
        .filter(|s| s.at_us >= full_us && s.answered_us <= freed_us)
        .collect();
    let mut leaderships: Vec<(u64, u64)> = window
        .iter()
        .filter_map(|s| s.leader.map(|leader| (s.term, leader)))
        .collect();
    leaderships.sort_unstable();
    leaderships.dedup();
    let mut violations = Vec::new();
    let changes = leaderships.len().saturating_sub(1);
    if changes > MAX_CHANGES_ALL_FULL {
        let named: Vec<String> = leaderships
            .iter()
            .map(|(term, leader)| format!("{leader} (term {term})"))
            .collect();
        violations.push(format!(
            "{changes} leadership changes, more than {MAX_CHANGES_ALL_FULL}: leaders {}",
            named.join(", ")
        ));
    }
    if window.len() < MIN_SAMPLES_ALL_FULL {
        violations.push(format!(
            "only {} leader samples while every disk was full, fewer than the \
             {MIN_SAMPLES_ALL_FULL} that show where leadership was",
            window.len()
        ));
    }
    Checked::new(
        ALL_FULL_LEADERSHIP_KEPT,
        format!(
            "{} leader samples from {:.1}s (every disk full) to {:.1}s (space returned)",
            window.len(),
            full_us as f64 / 1e6,
            freed_us as f64 / 1e6
        ),
        violations,
    )
}

/// A write through the full peer is refused as `disk_full`, naming its
/// data directory.
async fn refuses_writes(ctx: &mut Ctx, full: u64) -> Checked {
    let url = format!(
        "{}{}",
        ctx.cluster.admin(full),
        llmgw_api::paths::model("chaos-disk-full-refused")
    );
    let answer = ctx
        .cluster
        .http
        .put(&url)
        .header("content-type", "application/json")
        .body(load::model_body("chaos-disk-full-refused", "1"))
        .send()
        .await;
    let violations = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            if status == 507 && body.contains("disk_full") && body.contains("min_free_disk_mb") {
                Vec::new()
            } else {
                vec![format!("HTTP {status}: {body}")]
            }
        }
        Err(e) => vec![format!("no answer: {e}")],
    };
    Checked::new(
        FULL_PEER_REFUSED_WRITES,
        format!("a write through peer {full} while its disk was full"),
        violations,
    )
}

/// From `HAND_OVER_WITHIN_US` after the disk filled until space returned,
/// no peer names the full peer as its leader.
fn gave_up_leadership(samples: &[LeaderSample], full: u64, full_us: u64, freed_us: u64) -> Checked {
    let from = full_us + HAND_OVER_WITHIN_US;
    let led: Vec<String> = samples
        .iter()
        .filter(|s| s.at_us >= from && s.answered_us <= freed_us && s.leader == Some(full))
        .map(|s| {
            format!(
                "peer {} named peer {full} leader of term {} at {:.1}s",
                s.peer,
                s.term,
                s.at_us as f64 / 1e6
            )
        })
        .collect();
    let scope = format!(
        "leaders named from {:.1}s (the disk filled at {:.1}s) to {:.1}s (space returned)",
        from as f64 / 1e6,
        full_us as f64 / 1e6,
        freed_us as f64 / 1e6
    );
    let violations = match led.len() {
        0 => Vec::new(),
        n if n > 5 => {
            let mut first = led[..5].to_vec();
            first.push(format!("... {} more", n - 5));
            first
        }
        _ => led,
    };
    Checked::new(FULL_PEER_GAVE_UP_LEADERSHIP, scope, violations)
}

/// Once space returned, a write through the full peer succeeds within
/// `WRITES_AGAIN_WITHIN`, with no restart.
async fn writes_again(ctx: &mut Ctx, full: u64) -> Checked {
    let taken = write_through(ctx, full, "chaos-disk-full-again", WRITES_AGAIN_WITHIN).await;
    if let Ok(took) = &taken {
        ctx.fault(format!(
            "peer {full} took a write again {:.1}s after space returned",
            took.as_secs_f64()
        ));
    }
    Checked::new(
        FULL_PEER_WRITES_AGAIN,
        format!("writes through peer {full} after space returned"),
        taken.err().into_iter().collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, peer: u64, leader: u64) -> LeaderSample {
        LeaderSample::at_seconds(at_s, peer, 1, Some(leader))
    }

    #[test]
    fn a_full_peer_still_named_leader_after_the_hand_over_time_is_a_violation() {
        // Full at 10 s, freed at 30 s: named leader until 14 s is allowed.
        let (full_us, freed_us) = (10_000_000, 30_000_000);
        let handed_over = [sample(9.0, 2, 1), sample(14.0, 2, 1), sample(15.0, 2, 3)];
        let checked = gave_up_leadership(&handed_over, 1, full_us, freed_us);
        assert!(checked.violations.is_empty(), "{:?}", checked.violations);

        let kept = [sample(15.0, 2, 3), sample(16.0, 3, 1), sample(31.0, 2, 1)];
        let checked = gave_up_leadership(&kept, 1, full_us, freed_us);
        assert_eq!(
            checked.violations,
            ["peer 3 named peer 1 leader of term 1 at 16.0s"]
        );
    }

    #[test]
    fn more_than_one_leadership_change_while_every_disk_is_full_is_a_violation() {
        let (full_us, freed_us) = (10_000_000, 30_000_000);
        let mut samples: Vec<LeaderSample> = (0..120)
            .map(|i| sample(10.0 + i as f64 * 0.1, 1 + i % 3, 1))
            .collect();
        let kept = leadership_kept(&samples, full_us, freed_us);
        assert!(kept.violations.is_empty(), "{:?}", kept.violations);

        // One hand-over is allowed.
        let mut moved = sample(25.0, 2, 3);
        moved.term = 2;
        samples.push(moved);
        assert!(
            leadership_kept(&samples, full_us, freed_us)
                .violations
                .is_empty()
        );

        let mut again = sample(26.0, 3, 1);
        again.term = 3;
        samples.push(again);
        let churned = leadership_kept(&samples, full_us, freed_us);
        assert_eq!(
            churned.violations,
            ["2 leadership changes, more than 1: leaders 1 (term 1), 3 (term 2), 1 (term 3)"]
        );

        let empty = leadership_kept(&[], full_us, freed_us);
        assert!(
            empty.violations[0].contains("only 0 leader samples"),
            "{:?}",
            empty.violations
        );
    }

    #[test]
    fn the_yaml_is_the_fleets_liveness_and_the_reserve() {
        assert_eq!(
            YAML,
            format!(
                "{}raft:\n  min_free_disk_mb: {RESERVE_MB}\n",
                crate::fleet::LIVENESS_YAML
            )
        );
    }
}
