//! A model's lifecycle across a leader failover: a rolling update whose
//! leader dies with a replacement in flight, and an autoscaled scale-up
//! whose leader dies right after placing the new replica.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use llmgw_api::{RolloutPhase, RolloutView, paths};
use rand::Rng;

use super::ctx::{latest, promise};
use super::fleet_faults::{one_replacement_each, wait_successor};
use super::leadership::{LONG_REQUEST_TOKENS, long_request};
use super::{Ctx, ScenarioError};
use crate::fleet::{self, FleetSample};

/// How long the rollout may take once the old leader is back: two
/// replacements, each an engine start and a drain, on a loaded host.
const ROLLOUT_WITHIN: Duration = Duration::from_secs(120);

/// Fewest samples listing replicas a check over the rollout stands on:
/// the sampler takes one every 250 ms.
const MIN_SAMPLES: usize = 20;

/// The small model's rollout as the leader reports it.
async fn rollout_view(ctx: &Ctx) -> Result<RolloutView, String> {
    let (_, text) = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::GET,
        &paths::rollout(fleet::SMALL),
        None,
        Duration::from_secs(20),
    )
    .await?;
    serde_json::from_str(&text).map_err(|e| format!("GET rollout ({e}): {text}"))
}

fn small_replicas(sample: &FleetSample) -> impl Iterator<Item = &fleet::ReplicaObs> {
    sample
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.model == fleet::SMALL)
}

/// Change the small model's engine environment, so every replica must be
/// replaced make-before-break; a seeded moment after the first
/// replacement is placed (just placed, loading or ready), SIGKILL the
/// leader, restart it. The new leader carries the rollout on: every old
/// replica is replaced exactly once, the model never has fewer ready
/// replicas than it wants, and no request fails for it.
pub(super) async fn failover_during_rollout(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let old: BTreeSet<String> = small_replicas(&latest(ctx)?)
        .map(|r| r.id.clone())
        .collect();
    let want = ctx.desired.get(fleet::SMALL).copied().unwrap_or(0);
    let revision = format!("r{}", ctx.rng.random::<u32>());
    let changed = fleet::small_model_revised(
        u32::try_from(want).expect("a handful of replicas"),
        &revision,
    );
    let changed_at_us = ctx.history.now_us();
    ctx.rolled_out.insert(fleet::SMALL.to_owned());
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::PUT,
        &paths::model(fleet::SMALL),
        Some(&changed),
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("change {}: {why}", fleet::SMALL)))?;
    let target = rollout_view(ctx)
        .await
        .map_err(ScenarioError::Setup)?
        .fingerprint;
    ctx.fault(format!(
        "change {}'s engine environment (revision {revision}, spec {target}): a rolling update of {want} replicas {old:?}",
        fleet::SMALL
    ));

    let first = wait_small_replica(ctx, Duration::from_secs(30), "a replacement", |r| {
        r.replaces.as_ref().is_some_and(|o| old.contains(o))
    })
    .await?;
    // The new spec loads for 4 s: the kill lands while this replacement
    // loads, or soon after it took over.
    ctx.hold(0, 3000).await;
    let leader = ctx.leader().await?;
    let progress = rollout_view(ctx).await.map_or_else(
        |why| format!("unknown: {why}"),
        |v| {
            format!(
                "{} on the new spec ({} ready), {} on the old",
                v.updated, v.updated_ready, v.outdated
            )
        },
    );
    kill_and_restart_leader(
        ctx,
        leader,
        format!("(replacement {first} placed; the rollout then: {progress})"),
    )
    .await?;

    rollout_completes(ctx, &old, &target).await;
    one_replacement_each(ctx, "replaced by the rollout", &old);
    ready_never_below(ctx, want, changed_at_us);
    Ok(())
}

/// The first replica of the small model the sampler shows that `wanted`
/// picks, within `within`; `what` names it for the error.
async fn wait_small_replica(
    ctx: &Ctx,
    within: Duration,
    what: &str,
    wanted: impl Fn(&fleet::ReplicaObs) -> bool,
) -> Result<String, ScenarioError> {
    let started = Instant::now();
    loop {
        if let Some(found) = small_replicas(&latest(ctx)?).find(|r| wanted(r)) {
            return Ok(found.id.clone());
        }
        if started.elapsed() > within {
            return Err(ScenarioError::Setup(format!(
                "{what} was not placed within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILLs `leader`, noting `why` in the fault log, waits for one of the
/// others to lead, and restarts it 1-3 s later.
async fn kill_and_restart_leader(
    ctx: &mut Ctx,
    leader: u64,
    why: String,
) -> Result<(), ScenarioError> {
    let followers = ctx.followers(leader);
    ctx.kill(leader);
    ctx.fault(why);
    wait_successor(ctx, &followers, "the leader's SIGKILL").await?;
    ctx.hold(1000, 3000).await;
    ctx.restart(leader)
}

/// The rollout finishes: the model's wanted replicas all ready, none of
/// `old` left, and the leader reports every replica on spec `target`.
async fn rollout_completes(ctx: &mut Ctx, old: &BTreeSet<String>, target: &str) {
    let desired = ctx.desired.clone();
    let done = ctx
        .wait_fleet(ROLLOUT_WITHIN, |s| {
            fleet::fleet_ready(s, &desired)?;
            let left: Vec<&String> = small_replicas(s)
                .map(|r| &r.id)
                .filter(|id| old.contains(*id))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?} not replaced yet"))
            }
        })
        .await;
    let want = desired[fleet::SMALL];
    let outcome = match done {
        Err(why) => Err(format!("within {ROLLOUT_WITHIN:?} of the restart: {why}")),
        // The leader marks the rollout complete in a command of its own,
        // a round after the last old replica went: a few seconds' grace.
        Ok(_) => {
            let started = Instant::now();
            loop {
                let verdict = match rollout_view(ctx).await {
                    Err(why) => Err(why),
                    Ok(view)
                        if view.fingerprint == target
                            && view.phase == RolloutPhase::Complete
                            && view.outdated == 0
                            && u64::from(view.updated_ready) == want =>
                    {
                        Ok(())
                    }
                    Ok(view) => Err(format!(
                        "the leader reports spec {} ({}), {} updated ({} ready), {} outdated; want {target}, complete",
                        view.fingerprint,
                        view.phase.as_str(),
                        view.updated,
                        view.updated_ready,
                        view.outdated
                    )),
                };
                if verdict.is_ok() || started.elapsed() > Duration::from_secs(10) {
                    break verdict;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    promise(
        ctx,
        "rollout-completed",
        format!("{} to spec {target}", fleet::SMALL),
        outcome,
    );
}

/// From the change on, every sample that listed replicas had at least
/// `want` ready replicas of the small model: make-before-break, with
/// `rollout.max_unavailable` at its default of 0.
fn ready_never_below(ctx: &mut Ctx, want: u64, from_us: u64) {
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let short: Vec<String> = log
        .iter()
        .filter(|s| s.at_us >= from_us && s.replicas.is_some())
        .filter_map(|s| {
            let ready: Vec<&str> = small_replicas(s)
                .filter(|r| r.state == "ready")
                .map(|r| r.id.as_str())
                .collect();
            (ready.len() < usize::try_from(want).unwrap_or(usize::MAX)).then(|| {
                format!(
                    "{} ready at {:.1}s: {ready:?}",
                    ready.len(),
                    s.at_us as f64 / 1e6
                )
            })
        })
        .collect();
    let listed = log
        .iter()
        .filter(|s| s.at_us >= from_us && s.replicas.is_some())
        .count();
    let mut problems: Vec<String> = short.into_iter().take(8).collect();
    if listed < MIN_SAMPLES {
        problems.push(format!(
            "only {listed} samples listed replicas (at least {MIN_SAMPLES} wanted)"
        ));
    }
    promise(
        ctx,
        "ready-never-below-desired",
        format!("{want} replicas of {}, {listed} samples", fleet::SMALL),
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        },
    );
}

/// Long chats at once through the routers: with a target of 2 requests a
/// replica, 6 of them make two replicas want three.
const LONG_CHATS: usize = 6;

/// Make the small model autoscale (2 to 3 replicas, sized for 2 requests
/// each, a 2 s window to grow), then hold 6 long chats on it through the
/// routers of the peers that do not lead; a seeded moment after the
/// third replica shows placed, SIGKILL the leader, restart it. The new
/// leader carries the scale-up on: the replica placed before the kill
/// becomes ready, no second one is placed, the model never lists more
/// replicas than its maximum, and every long chat is answered.
pub(super) async fn failover_during_scale_up(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before: BTreeSet<String> = small_replicas(&latest(ctx)?)
        .map(|r| r.id.clone())
        .collect();
    let min = ctx.desired.get(fleet::SMALL).copied().unwrap_or(0);
    let min = u32::try_from(min).expect("a handful of replicas");
    let max = min + 1;
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::PUT,
        &paths::model(fleet::SMALL),
        Some(&fleet::small_model_autoscaled(min, max, 2)),
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("autoscale {}: {why}", fleet::SMALL)))?;
    ctx.fault(format!(
        "autoscale {} between {min} and {max} replicas, 2 requests a replica, grow after 2s",
        fleet::SMALL
    ));
    let first_leader = ctx.leader().await?;
    let chat_routers: Vec<(u64, String)> = ctx
        .followers(first_leader)
        .into_iter()
        .map(|id| (id, ctx.cluster.router_url(id)))
        .collect();
    // Stopped with the burst, so a schedule that ends early leaves none
    // running.
    let answered = ChatLog::default();
    for i in 0..LONG_CHATS {
        let (peer, router) = chat_routers[i % chat_routers.len()].clone();
        let handle = tokio::spawn(long_chats(
            peer,
            router,
            ctx.burst_stop.clone(),
            answered.clone(),
        ));
        ctx.burst.push(handle);
    }
    ctx.fault(format!(
        "{LONG_CHATS} long chats ({LONG_REQUEST_TOKENS} tokens each, one after another) through the routers of peers {:?}",
        ctx.followers(first_leader)
    ));

    let placed = wait_small_replica(
        ctx,
        Duration::from_secs(60),
        "the autoscaler's replica",
        |r| !before.contains(&r.id),
    )
    .await?;
    ctx.desired.insert(fleet::SMALL.to_owned(), u64::from(max));
    ctx.hold(0, 500).await;
    let leader = ctx.leader().await?;
    kill_and_restart_leader(
        ctx,
        leader,
        format!("(replica {placed} placed by the autoscaler)"),
    )
    .await?;

    let desired = ctx.desired.clone();
    let ready = ctx
        .wait_fleet(Duration::from_secs(90), |s| fleet::fleet_ready(s, &desired))
        .await;
    ctx.stop_burst().await;
    let answered = std::mem::take(&mut *answered.lock().unwrap_or_else(|p| p.into_inner()));
    let outcome = match ready {
        Err(why) => Err(format!(
            "{max} ready replicas within 90s of the restart: {why}"
        )),
        Ok(sample) if small_replicas(&sample).any(|r| r.id == placed && r.state == "ready") => {
            Ok(())
        }
        Ok(sample) => Err(format!(
            "replica {placed}, placed before the kill, is not among the ready ones: {:?}",
            small_replicas(&sample)
                .map(|r| format!("{} {}", r.id, r.state))
                .collect::<Vec<_>>()
        )),
    };
    promise(
        ctx,
        "scale-up-carried-on",
        format!("replica {placed} of {}", fleet::SMALL),
        outcome,
    );
    one_scale_up(ctx, &before, max);
    long_chats_answered(ctx, &answered, leader);
    Ok(())
}

/// Each long chat's answer, with the peer whose router it went through.
type ChatLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, Result<(), String>)>>>;

/// One long chat after another through `router` until `stop`.
async fn long_chats(
    peer: u64,
    router: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answered: ChatLog,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let result = long_request(router.clone(), LONG_REQUEST_TOKENS).await;
        answered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((peer, result));
    }
}

/// Across every sample, one replica beside `before` (the one scale-up,
/// placed once: not again by the new leader) and never more than `max`.
fn one_scale_up(ctx: &mut Ctx, before: &BTreeSet<String>, max: u32) {
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut added = BTreeSet::new();
    let mut crowded = Vec::new();
    for s in log.iter().filter(|s| s.replicas.is_some()) {
        let listed: Vec<&str> = small_replicas(s).map(|r| r.id.as_str()).collect();
        added.extend(listed.iter().filter(|id| !before.contains(**id)).copied());
        if listed.len() > max as usize {
            crowded.push(format!("{listed:?} at {:.1}s", s.at_us as f64 / 1e6));
        }
    }
    let mut problems = Vec::new();
    if added.len() != 1 {
        problems.push(format!(
            "{} replicas added beside {before:?}: {added:?}",
            added.len()
        ));
    }
    if !crowded.is_empty() {
        problems.push(format!("more than {max} listed: {}", crowded.join("; ")));
    }
    let added = added.len();
    promise(
        ctx,
        "one-replica-added",
        format!("{added} added beside {} of {}", before.len(), fleet::SMALL),
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        },
    );
}

/// Every long chat got all its tokens; none went through the killed
/// peer's router (they avoid the first leader), unless leadership moved
/// before the kill, in which case those through `killed` are excused.
fn long_chats_answered(ctx: &mut Ctx, answered: &[(u64, Result<(), String>)], killed: u64) {
    let ok = answered.iter().filter(|(_, r)| r.is_ok()).count();
    let failed: Vec<String> = answered
        .iter()
        .filter(|(peer, r)| r.is_err() && *peer != killed)
        .map(|(peer, r)| {
            format!(
                "via peer {peer}: {}",
                r.as_ref().err().map_or("", String::as_str)
            )
        })
        .collect();
    let mut problems: Vec<String> = failed.into_iter().take(6).collect();
    if ok == 0 {
        problems.push(format!("none of {} long chats answered", answered.len()));
    }
    promise(
        ctx,
        "long-chats-answered",
        format!("{} long chats, {ok} answered in full", answered.len()),
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        },
    );
}
