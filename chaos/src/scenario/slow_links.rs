//! Peers far apart: every peer link gains [`ONE_WAY`] (plus up to
//! [`JITTER`]) each way for a minute under a fleet, first with the
//! cluster idle, then under load. The peers declare the round trip
//! (`raft.peer_round_trip`), so heartbeats are given the time to cross it:
//! one leadership holds throughout, a write after the idle half is taken
//! at once, and every write under load is answered. With timings the round
//! trip cannot carry, an idle leader's heartbeats all time out, its lease
//! lapses and never comes back (a permanent `503 no_leader`) while the
//! followers, still hearing it, elect no one.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ctx::write_through;
use super::{Ctx, ScenarioError};
use crate::history::{OpRecord, Outcome};
use crate::invariants::Checked;
use crate::linearizability::RegOp;
use crate::load::{self, LeaderSample};
use crate::slow_links::PROXY_PORT;

pub const SLOW_LINKS_DELAY_IN_EFFECT: &str = "slow-links-delay-in-effect";
pub const SLOW_LINKS_ONE_LEADERSHIP: &str = "slow-links-one-leadership";
pub const SLOW_LINKS_WRITE_AFTER_IDLE: &str = "slow-links-write-after-idle";
pub const SLOW_LINKS_WRITES_UNDER_LOAD: &str = "slow-links-writes-under-load";

/// Each way, on every peer link.
pub const ONE_WAY: Duration = Duration::from_millis(60);
/// Up to this much more each way, per chunk (never reordering bytes).
pub const JITTER: Duration = Duration::from_millis(10);
/// The fleet's short liveness, and the round trip the peers are told:
/// twice (`ONE_WAY` + `JITTER`).
pub const YAML: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 6s\n  leader_grace: 4s\nraft:\n  peer_round_trip: 140ms\n";
/// How long the cluster idles over slow links: many heartbeat intervals
/// and election timeouts of either timing.
const IDLE_FOR: Duration = Duration::from_secs(30);
/// How long the load then runs over slow links.
const LOADED_FOR: Duration = Duration::from_secs(30);
/// How long the first write after the idle half may take.
const WRITE_AFTER_IDLE_WITHIN: Duration = Duration::from_secs(10);
/// Fewer leader samples than this over the slow minute prove nothing
/// (the sampler asks every peer every 150 ms).
const MIN_LEADER_SAMPLES: usize = 100;
/// Fewer answered writes than this under load prove nothing.
const MIN_WRITES_UNDER_LOAD: usize = 20;

pub(super) async fn peers_far_apart(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let leader = ctx.leader().await?;
    let (term, _) = ctx
        .cluster
        .leader_view(leader)
        .await
        .ok_or_else(|| ScenarioError::Setup(format!("leader {leader} does not answer")))?;
    ctx.cluster
        .set_link_delay(ONE_WAY, JITTER)
        .map_err(ScenarioError::Setup)?;
    let slow_from_us = ctx.history.now_us();
    ctx.fault(format!(
        "every peer link slowed to {ONE_WAY:?} + up to {JITTER:?} each way (leader {leader}, term {term})"
    ));
    let in_effect = delay_in_effect(ctx).await;
    ctx.extra_checks.push(in_effect);

    ctx.quiet_load();
    tokio::time::sleep(IDLE_FOR).await;
    let after_idle = write_after_idle(ctx, leader).await;
    ctx.extra_checks.push(after_idle);

    ctx.resume_load();
    let loaded_from_us = ctx.history.now_us();
    tokio::time::sleep(LOADED_FOR).await;
    let slow_to_us = ctx.history.now_us();
    ctx.cluster.clear_link_delay();
    ctx.fault("every peer link direct again");

    // Every request sent over the slow links has an outcome once the
    // client timeout has passed: one still hanging at the end counts.
    tokio::time::sleep(load::CLIENT_TIMEOUT + Duration::from_secs(1)).await;
    let ops: Vec<OpRecord> = ctx
        .history
        .ops()
        .into_iter()
        .filter(|op| (loaded_from_us..slow_to_us).contains(&op.invoke_us))
        .collect();
    ctx.extra_checks.push(writes_under_load(&ops));
    ctx.check_later(move |evidence| {
        one_leadership(
            &evidence.leader_samples,
            (leader, term),
            slow_from_us,
            slow_to_us,
        )
    });
    Ok(())
}

/// Proof that the links are slow: a round trip through every peer's proxy
/// (a few bytes that are not TLS, answered by an alert or a close) takes
/// at least twice `ONE_WAY`.
async fn delay_in_effect(ctx: &mut Ctx) -> Checked {
    let mut violations = Vec::new();
    let mut measured = Vec::new();
    for id in ctx.cluster.member_ids() {
        let proxy = std::net::SocketAddr::new(ctx.cluster.net.peer_ip(id).into(), PROXY_PORT);
        match round_trip(proxy).await {
            Ok(took) if took >= ONE_WAY * 2 => measured.push(format!("peer {id} {took:.0?}")),
            Ok(took) => violations.push(format!(
                "a round trip through peer {id}'s proxy took {took:?}, under twice {ONE_WAY:?}: \
                 the delay is not in effect"
            )),
            Err(e) => violations.push(format!("peer {id}'s proxy {proxy}: {e}")),
        }
    }
    ctx.fault(format!(
        "round trips through the proxies: {}",
        measured.join(", ")
    ));
    Checked::new(
        SLOW_LINKS_DELAY_IN_EFFECT,
        "a round trip through every peer's proxy",
        violations,
    )
}

async fn round_trip(proxy: std::net::SocketAddr) -> std::io::Result<Duration> {
    let mut stream = tokio::net::TcpStream::connect(proxy).await?;
    stream.set_nodelay(true)?;
    let started = Instant::now();
    stream.write_all(b"not tls\r\n\r\n").await?;
    let mut answer = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .map_err(|_| std::io::Error::other("no answer within 5s"))??;
    Ok(started.elapsed())
}

/// After the idle half, a write through the leader of before is taken
/// within `WRITE_AFTER_IDLE_WITHIN`.
async fn write_after_idle(ctx: &mut Ctx, leader: u64) -> Checked {
    let taken = write_through(
        ctx,
        leader,
        "chaos-slow-links-after-idle",
        WRITE_AFTER_IDLE_WITHIN,
    )
    .await;
    match &taken {
        Ok(took) => ctx.fault(format!(
            "a write after the idle half taken in {:.2}s",
            took.as_secs_f64()
        )),
        Err(why) => ctx.fault(format!("no write taken after the idle half: {why}")),
    }
    Checked::new(
        SLOW_LINKS_WRITE_AFTER_IDLE,
        format!("a write through peer {leader} after {IDLE_FOR:?} idle over slow links"),
        taken.err().into_iter().collect(),
    )
}

/// Every admin request of the loaded half was answered, and enough of them
/// were writes to show it.
fn writes_under_load(ops: &[OpRecord]) -> Checked {
    let writes = ops
        .iter()
        .filter(|op| matches!(op.op, RegOp::Write(_)) && matches!(op.outcome, Outcome::Ok(_)))
        .count();
    let failed: Vec<String> = ops
        .iter()
        .filter(|op| !matches!(op.outcome, Outcome::Ok(_)))
        .map(|op| {
            format!(
                "{:?} {} through peer {}: {:?}",
                op.op, op.key, op.peer, op.outcome
            )
        })
        .collect();
    let mut violations: Vec<String> = failed.iter().take(5).cloned().collect();
    if failed.len() > 5 {
        violations.push(format!("... {} more", failed.len() - 5));
    }
    if writes < MIN_WRITES_UNDER_LOAD {
        violations.push(format!(
            "only {writes} writes answered under load, fewer than the {MIN_WRITES_UNDER_LOAD} \
             that show writes flowing"
        ));
    }
    Checked::new(
        SLOW_LINKS_WRITES_UNDER_LOAD,
        format!(
            "{} admin requests under load over slow links, {writes} writes taken",
            ops.len()
        ),
        violations,
    )
}

/// Over the slow minute every peer names the leadership of before: the
/// same leader, the same term.
fn one_leadership(
    samples: &[LeaderSample],
    (leader, term): (u64, u64),
    from_us: u64,
    to_us: u64,
) -> Checked {
    let window: Vec<&LeaderSample> = samples
        .iter()
        .filter(|s| s.at_us >= from_us && s.answered_us <= to_us)
        .collect();
    let other: Vec<String> = window
        .iter()
        .filter(|s| s.leader != Some(leader) || s.term != term)
        .map(|s| {
            format!(
                "peer {} named {:?} in term {} at {:.1}s",
                s.peer,
                s.leader,
                s.term,
                s.at_us as f64 / 1e6
            )
        })
        .collect();
    let mut violations: Vec<String> = other.iter().take(5).cloned().collect();
    if other.len() > 5 {
        violations.push(format!("... {} more", other.len() - 5));
    }
    if window.len() < MIN_LEADER_SAMPLES {
        violations.push(format!(
            "only {} leader samples over the slow minute, fewer than the {MIN_LEADER_SAMPLES} \
             that show one leadership",
            window.len()
        ));
    }
    Checked::new(
        SLOW_LINKS_ONE_LEADERSHIP,
        format!(
            "{} leader samples from {:.1}s to {:.1}s: leader {leader}, term {term}",
            window.len(),
            from_us as f64 / 1e6,
            to_us as f64 / 1e6
        ),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::RegRet;

    fn sample(at_s: f64, peer: u64, term: u64, leader: Option<u64>) -> LeaderSample {
        LeaderSample::at_seconds(at_s, peer, term, leader)
    }

    fn steady(from_s: f64, count: usize) -> Vec<LeaderSample> {
        (0..count)
            .map(|i| sample(from_s + i as f64 * 0.05, 1 + i as u64 % 3, 2, Some(1)))
            .collect()
    }

    #[test]
    fn one_leadership_fails_on_a_new_term_a_lost_leader_and_on_no_evidence() {
        let mut samples = steady(10.0, 150);
        let held = one_leadership(&samples, (1, 2), 10_000_000, 20_000_000);
        assert!(held.violations.is_empty(), "{:?}", held.violations);

        samples.push(sample(12.0, 3, 3, Some(3)));
        samples.push(sample(12.5, 2, 2, None));
        let changed = one_leadership(&samples, (1, 2), 10_000_000, 20_000_000);
        assert_eq!(
            changed.violations,
            [
                "peer 3 named Some(3) in term 3 at 12.0s",
                "peer 2 named None in term 2 at 12.5s"
            ]
        );

        let empty = one_leadership(&[], (1, 2), 10_000_000, 20_000_000);
        assert_eq!(empty.violations.len(), 1, "{:?}", empty.violations);
        assert!(empty.violations[0].contains("only 0 leader samples"));
    }

    fn op(op: RegOp, outcome: Outcome) -> OpRecord {
        OpRecord {
            id: 0,
            worker: 0,
            peer: 1,
            key: "k".into(),
            op,
            invoke_us: 0,
            complete_us: 1,
            outcome,
        }
    }

    #[test]
    fn writes_under_load_fail_on_an_unanswered_request_and_on_too_few_writes() {
        let written = || op(RegOp::Write("v".into()), Outcome::Ok(RegRet::Ok));
        let ops: Vec<OpRecord> = (0..MIN_WRITES_UNDER_LOAD).map(|_| written()).collect();
        assert!(writes_under_load(&ops).violations.is_empty());

        let mut refused = ops.clone();
        refused.push(op(
            RegOp::Read,
            Outcome::Unknown("HTTP 503: no_leader".into()),
        ));
        let checked = writes_under_load(&refused);
        assert_eq!(checked.violations.len(), 1, "{:?}", checked.violations);
        assert!(checked.violations[0].contains("no_leader"));

        let few = writes_under_load(&ops[..3]);
        assert!(
            few.violations[0].contains("only 3 writes"),
            "{:?}",
            few.violations
        );
    }

    #[test]
    fn the_declared_round_trip_carries_the_slowest_link() {
        let declared = YAML
            .lines()
            .find_map(|l| l.trim().strip_prefix("peer_round_trip: "))
            .and_then(|v| v.strip_suffix("ms"))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("peer_round_trip in ms");
        assert_eq!(
            Duration::from_millis(declared),
            (ONE_WAY + JITTER) * 2,
            "the peers must be told the slowest round trip the proxies make"
        );
        assert!(YAML.starts_with(crate::fleet::LIVENESS_YAML));
    }
}
