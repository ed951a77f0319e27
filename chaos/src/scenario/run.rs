//! The runner: one scenario with one seed, in named phases.
//!
//! 1. **set up**: network, peers, a leader, the fleet when the scenario
//!    has one;
//! 2. **start load**: the leader sampler, the fleet sampler, the admin
//!    load and the router load;
//! 3. **inject**: the scenario's own schedule;
//! 4. **heal**: network rules flushed, link delays and the load's pause
//!    lifted, filled disks freed, paused peers continued, killed peers and
//!    agents restarted, every fault window closed;
//! 5. **settle**: the load runs on, the fleet must be ready again, the
//!    load stops;
//! 6. **close**: a leader, converged state hashes, final reads, catalogs;
//! 7. **collect**: the samplers stop; the evidence (samples, logs, router
//!    requests, fault windows) is gathered;
//! 8. **check**: every invariant, then the scenario's own checks;
//! 9. **tear down**: agents, engines, peers and namespaces, and the check
//!    that nothing was left behind;
//! 10. **report**: counts, and the history files when the run is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::task::JoinHandle;

use super::ctx::Evidence;
use super::record::{forge, forge_gpu, write_fleet_history, write_history};
use super::setup::{Catalog, catalogs, final_reads, setup_fleet, wait_converged};
use super::{Ctx, Disks, Links, RunOptions, RunReport, Scenario, ScenarioError};
use crate::cluster::{Cluster, Members};
use crate::fleet::{self, FleetLog, FleetSample, RouterLog};
use crate::history::{History, OpRecord, Outcome};
use crate::invariants::{self, Checked};
use crate::load::{self, LeaderSample};
use crate::netns::Net;

/// Runs one scenario with one seed.
pub async fn run(
    scenario: &'static Scenario,
    seed: u64,
    options: &RunOptions,
) -> Result<RunReport, ScenarioError> {
    let started = Instant::now();
    let (mut ctx, dir) = set_up(scenario, seed, options).await?;
    let mut load = start_load(&ctx, scenario, seed, options);

    ctx.hold(1500, 2500).await;
    let injected = (scenario.schedule)(&mut ctx).await;

    let healed_at = heal(&mut ctx)?;
    let mut checked = settle(&mut ctx, scenario, healed_at).await;
    load.stop_clients().await;
    if let Err(error) = injected {
        checked.push(Checked::new(
            "scenario-ran",
            "the fault schedule",
            vec![error.to_string()],
        ));
    }

    let closing = close(&ctx, &mut checked).await;
    let evidence = collect(&mut ctx, load, options).await;
    check(&mut ctx, &evidence, &closing, &mut checked);
    tear_down(&mut ctx, &dir, &evidence, &mut checked);
    Ok(report(
        &ctx, scenario, seed, options, dir, &evidence, checked, started,
    ))
}

/// Phase 1: the network, three peers, an agreed leader, and the fleet when
/// the scenario has one.
async fn set_up(
    scenario: &'static Scenario,
    seed: u64,
    options: &RunOptions,
) -> Result<(Ctx, PathBuf), ScenarioError> {
    let run_id = format!("{:06x}", rand::random::<u32>() & 0x00ff_ffff);
    let dir = options
        .work_dir
        .join(format!("{}-seed{seed}-{run_id}", scenario.name));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ScenarioError::Setup(format!("cannot create {}: {e}", dir.display())))?;
    if !options.bin.exists() {
        return Err(ScenarioError::Setup(format!(
            "{} does not exist: build it with `cargo build -p llmgw-cli` or pass --llmgw-bin",
            options.bin.display()
        )));
    }
    let net = Net::create(&run_id)?;
    let mut cluster = Cluster::create(
        net,
        &dir,
        &options.bin,
        3,
        scenario.extra_yaml,
        scenario.fleet,
    )?;
    match scenario.disks {
        Disks::Host => {}
        Disks::Lazy => cluster.mount_lazy_disks()?,
        Disks::Small => cluster.mount_small_disks()?,
    }
    match scenario.links {
        Links::Direct => {}
        Links::Delayed => cluster.put_peers_behind_proxies()?,
    }
    for id in 1..=3 {
        cluster.spawn(id)?;
    }
    let history = History::new(Instant::now());
    let mut ctx = Ctx {
        cluster,
        rng: StdRng::seed_from_u64(seed),
        faults: Vec::new(),
        history,
        verbose: options.verbose,
        burst: Vec::new(),
        burst_stop: Arc::new(AtomicBool::new(false)),
        seed,
        run_id: run_id.clone(),
        extra_checks: Vec::new(),
        fleet: None,
        fleet_log: FleetLog::default(),
        windows: Vec::new(),
        desired: BTreeMap::new(),
        rolled_out: BTreeSet::new(),
        later: Vec::new(),
        load_quiet: Arc::new(AtomicBool::new(false)),
        faults_confirmed: 0,
        faults_unconfirmed: Vec::new(),
    };
    if options.verbose {
        println!(
            "{} seed {seed}: run {run_id}, 10.77.{}.0/24, logs in {}",
            scenario.name,
            ctx.cluster.net.subnet,
            dir.display()
        );
    }
    let first_leader = ctx.cluster.wait_leader(Duration::from_secs(90)).await?;
    if scenario.fleet {
        setup_fleet(&mut ctx).await?;
    }
    if options.verbose {
        println!("  leader {first_leader} elected; load starts");
    }
    Ok((ctx, dir))
}

/// The samplers and the load while they run.
struct Load {
    stop_load: Arc<AtomicBool>,
    stop_sampler: Arc<AtomicBool>,
    sampler: JoinHandle<Vec<LeaderSample>>,
    fleet_sampler: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    router_workers: Vec<JoinHandle<()>>,
    router_log: RouterLog,
}

/// Phase 2: the leader sampler, the fleet sampler, the admin load and,
/// with a fleet, the router load.
fn start_load(ctx: &Ctx, scenario: &Scenario, seed: u64, options: &RunOptions) -> Load {
    let history = &ctx.history;
    let stop_load = Arc::new(AtomicBool::new(false));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(load::sampler(
        ctx.cluster.admin_client(Duration::from_secs(3)),
        ctx.cluster.members.clone(),
        history.clone(),
        stop_sampler.clone(),
        Duration::from_millis(150),
    ));
    let fleet_sampler = ctx.fleet.as_ref().map(|f| {
        tokio::spawn(fleet::sampler(
            ctx.cluster.admin_client(Duration::from_millis(800)),
            ctx.cluster.members.clone(),
            f.work_dirs(),
            history.clone(),
            ctx.fleet_log.clone(),
            stop_sampler.clone(),
            Duration::from_millis(250),
        ))
    });
    let workers: Vec<_> = (0..options.workers)
        .map(|w| {
            tokio::spawn(load::worker(
                load::client(&ctx.cluster),
                w,
                seed,
                ctx.run_id.clone(),
                ctx.cluster.members.clone(),
                history.clone(),
                stop_load.clone(),
                ctx.load_quiet.clone(),
                Duration::from_millis(30),
            ))
        })
        .collect();
    let router_log = RouterLog::default();
    let router_workers: Vec<_> = if scenario.fleet {
        let routers = Members::default();
        routers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend((1..=3).map(|id| (id, ctx.cluster.router_url(id))));
        (0..2)
            .map(|w| {
                tokio::spawn(fleet::router_worker(
                    w,
                    seed,
                    routers.clone(),
                    vec![fleet::SMALL.to_owned(), fleet::LARGE.to_owned()],
                    history.clone(),
                    router_log.clone(),
                    stop_load.clone(),
                    Duration::from_millis(60),
                ))
            })
            .collect()
    } else {
        Vec::new()
    };
    Load {
        stop_load,
        stop_sampler,
        sampler,
        fleet_sampler,
        workers,
        router_workers,
        router_log,
    }
}

impl Load {
    /// Stops the admin and router load (the samplers run on).
    async fn stop_clients(&mut self) {
        self.stop_load.store(true, Ordering::Relaxed);
        for worker in self.workers.drain(..) {
            let _ = worker.await;
        }
        for worker in self.router_workers.drain(..) {
            let _ = worker.await;
        }
    }
}

/// Phase 4: heals whatever the schedule left, even when it stopped early,
/// and closes every fault window. Returns when that was.
fn heal(ctx: &mut Ctx) -> Result<Instant, ScenarioError> {
    let _ = ctx.cluster.net.heal();
    ctx.cluster.clear_link_delay();
    ctx.load_quiet.store(false, Ordering::Relaxed);
    for id in ctx.cluster.free_small_disks() {
        ctx.fault(format!("peer {id}'s data disk freed (healing)"));
    }
    let restarted = match ctx.fleet.as_mut() {
        Some(fleet) => fleet.restart_killed(&ctx.cluster)?,
        None => Vec::new(),
    };
    for node in restarted {
        ctx.fault(format!("restart the agent of node {node} (healing)"));
    }
    for id in ctx.cluster.member_ids() {
        if ctx.cluster.peers[&id].stopped {
            let proof = ctx.cluster.resume(id);
            ctx.confirmed(format!("SIGCONT peer {id} (healing)"), proof);
        }
        if !ctx.cluster.is_running(id) {
            ctx.restart(id)?;
        }
    }
    let healed_at = Instant::now();
    let now = ctx.history.now_us();
    for window in &mut ctx.windows {
        window.to_us.get_or_insert(now);
    }
    Ok(healed_at)
}

/// Phase 5: the load runs on for a few seconds; with a fleet, every
/// desired replica must be ready again (the router load runs meanwhile).
async fn settle(ctx: &mut Ctx, scenario: &Scenario, healed_at: Instant) -> Vec<Checked> {
    ctx.hold(2000, 3000).await;
    ctx.stop_burst().await;
    let mut checked = Vec::new();
    if scenario.fleet {
        let desired = ctx.desired.clone();
        let bound = Duration::from_secs(60);
        // Every member's own view, one after another: the first member
        // that answers may be a peer that has not caught up yet (a
        // minority that just healed), whose view says nothing of what
        // the leader has decided meanwhile.
        let mut problems = Vec::new();
        for id in ctx.cluster.member_ids() {
            let one = Members::default();
            one.write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, ctx.cluster.admin(id));
            let ready = fleet::wait_sample(
                &ctx.cluster.admin_client(Duration::from_millis(1500)),
                &one,
                &[],
                &ctx.history,
                bound.saturating_sub(healed_at.elapsed()),
                |s| fleet::fleet_ready(s, &desired),
            )
            .await;
            if let Err(why) = ready {
                problems.push(format!(
                    "not every desired replica was ready on peer {id} {}s after healing: {why}",
                    bound.as_secs()
                ));
            }
        }
        checked.push(Checked::new(
            invariants::REPLICAS_READY_AFTER_HEALING,
            format!(
                "{desired:?} on every member within {}s of healing",
                bound.as_secs()
            ),
            problems,
        ));
        if ctx.verbose {
            println!(
                "  fleet ready again {:.1}s after healing",
                healed_at.elapsed().as_secs_f64()
            );
        }
    }
    checked
}

/// What the cluster said once the load stopped.
struct Closing {
    states: BTreeMap<u64, Option<(u64, String)>>,
    catalogs: BTreeMap<u64, Result<Catalog, String>>,
}

/// Phase 6: an agreed leader, converged state, a consistent read of every
/// key on every member, every member's catalog.
async fn close(ctx: &Ctx, checked: &mut Vec<Checked>) -> Closing {
    let leader_after = ctx.cluster.wait_leader(Duration::from_secs(60)).await;
    checked.push(Checked::new(
        invariants::LEADER_AFTER_HEALING,
        "within 60s of healing",
        match &leader_after {
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        },
    ));
    let states = wait_converged(&ctx.cluster, Duration::from_secs(60)).await;
    final_reads(&ctx.cluster, &ctx.history).await;
    let catalogs = catalogs(&ctx.cluster).await;
    Closing { states, catalogs }
}

/// Phase 7: stops the samplers and gathers the evidence: samples (with
/// the test-only forgeries), every peer's and agent's log, the router
/// requests, the fault windows.
async fn collect(ctx: &mut Ctx, load: Load, options: &RunOptions) -> Evidence {
    load.stop_sampler.store(true, Ordering::Relaxed);
    let mut leader_samples = load.sampler.await.unwrap_or_default();
    if options.forge_leader_sample {
        forge(&mut leader_samples);
    }
    if let Some(fleet_sampler) = load.fleet_sampler {
        let _ = fleet_sampler.await;
    }
    let mut fleet_samples: Vec<FleetSample> =
        std::mem::take(&mut *ctx.fleet_log.lock().unwrap_or_else(|p| p.into_inner()));
    if options.forge_gpu_double {
        forge_gpu(&mut fleet_samples);
    }
    let peer_logs: Vec<(String, String)> = ctx
        .cluster
        .peers
        .iter()
        .flat_map(|(&id, peer)| (1..=peer.starts).map(move |start| (id, start)))
        .map(|(id, start)| {
            let path = ctx.cluster.log_path(id, start);
            (
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap_or_default(),
            )
        })
        .collect();
    let agent_logs: Vec<(String, String)> = ctx
        .fleet
        .iter()
        .flat_map(|fleet| fleet.agents.iter())
        .map(|(id, a)| (id.clone(), a.log_text()))
        .collect();
    let witnesses = ctx
        .fleet
        .iter()
        .flat_map(|fleet| fleet.work_dirs())
        .map(|(node, dir)| {
            let mut lines = Vec::new();
            for file in ["commands.jsonl.1", "commands.jsonl"] {
                let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                lines.extend(invariants::parse_witness(&text));
            }
            (node, lines)
        })
        .collect();
    let router_ops = load
        .router_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let wall_now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    Evidence {
        leader_samples,
        fleet_samples,
        peer_logs,
        agent_logs,
        witnesses,
        router_ops,
        windows: ctx.windows.clone(),
        wall_zero_us: wall_now_us.saturating_sub(ctx.history.now_us()),
    }
}

/// Phase 8: the invariants every run checks, the fleet's when it has one,
/// then the scenario's own.
fn check(ctx: &mut Ctx, evidence: &Evidence, closing: &Closing, checked: &mut Vec<Checked>) {
    let ops = ctx.history.ops();
    checked.push(invariants::leaderships_move_forward(
        &evidence.leader_samples,
    ));
    checked.push(invariants::state_hashes(&closing.states));
    checked.push(invariants::acknowledged_writes(&ops, &closing.catalogs));
    checked.push(invariants::linearizable(&ops));
    checked.push(match ctx.failover_bound() {
        Ok(bound) => invariants::leader_followed(
            &evidence.leader_samples,
            ctx.cluster.member_ids().len(),
            &evidence.windows,
            u64::try_from(bound.as_micros()).unwrap_or(u64::MAX),
        ),
        Err(why) => Checked::new(
            invariants::LEADER_FOLLOWED,
            "the configured election timeout",
            vec![why],
        ),
    });
    if ctx.fleet.is_some() {
        checked.push(invariants::no_gpu_twice(&evidence.fleet_samples));
        checked.push(invariants::no_unreachable_while_healthy(
            &evidence.peer_logs,
            &evidence.fleet_samples,
            &evidence.windows,
            evidence.wall_zero_us,
        ));
        checked.push(match ctx.agent_reconnect_bound() {
            Ok(bound) => invariants::agents_found_the_leader(
                &evidence.agent_logs,
                &evidence.windows,
                ctx.cluster.member_ids().len(),
                evidence.wall_zero_us,
                u64::try_from(bound.as_micros()).unwrap_or(u64::MAX),
            ),
            Err(why) => Checked::new(
                invariants::AGENTS_FOUND_THE_LEADER,
                "the configured reconnect backoff",
                vec![why],
            ),
        });
        checked.push(invariants::router_healthy(
            &evidence.router_ops,
            &evidence.fleet_samples,
            &evidence.windows,
        ));
        checked.push(invariants::no_deposed_command(
            &evidence.leader_samples,
            &evidence.witnesses,
            evidence.wall_zero_us,
        ));
        let models: Vec<&str> = ctx.desired.keys().map(String::as_str).collect();
        let rolled_out: Vec<&str> = ctx.rolled_out.iter().map(String::as_str).collect();
        checked.push(invariants::no_retirement_while_reachable(
            &evidence.fleet_samples,
            &evidence.windows,
            &models,
            &rolled_out,
        ));
    }
    if ctx.faults_confirmed + ctx.faults_unconfirmed.len() > 0 {
        checked.push(Checked::new(
            invariants::FAULTS_TOOK_EFFECT,
            format!(
                "{} fault(s) read back (/proc, connection probes, the kernel's rules)",
                ctx.faults_confirmed + ctx.faults_unconfirmed.len()
            ),
            ctx.faults_unconfirmed.clone(),
        ));
    }
    checked.append(&mut ctx.extra_checks);
    for later in std::mem::take(&mut ctx.later) {
        checked.push(later(evidence));
    }
}

/// Phase 9: stops agents, engines and peers, deletes the network, and
/// checks that nothing the run started is left.
fn tear_down(ctx: &mut Ctx, dir: &Path, evidence: &Evidence, checked: &mut Vec<Checked>) {
    let engine_groups: Vec<i32> = evidence
        .fleet_samples
        .iter()
        .flat_map(|s| s.agents.iter())
        .flat_map(|a| a.shards.iter())
        .flat_map(|s| s.pgids.iter().copied())
        .collect();
    let mut leftovers = match ctx.fleet.as_mut() {
        Some(fleet) => fleet.shutdown(&engine_groups),
        None => Vec::new(),
    };
    let agents_started = ctx.fleet.as_ref().map_or(0, |f| f.spawned.len());
    leftovers.extend(ctx.cluster.shutdown());
    leftovers.extend(ctx.cluster.net.destroy());
    // Unmount the lazy disks before the run directory can be removed.
    ctx.cluster.disks.clear();
    leftovers.extend(crate::powercut::mounts_under(dir));
    let listed = crate::netns::run("ip", &["netns", "list"]).unwrap_or_default();
    leftovers.extend(
        listed
            .lines()
            .filter(|l| l.contains(&format!("llmgw-chaos-{}-", ctx.run_id)))
            .map(|l| format!("namespace {} was not removed", l.trim())),
    );
    let mut groups = engine_groups;
    groups.sort_unstable();
    groups.dedup();
    let mut left_nothing = Checked::new(
        invariants::NO_LEFTOVERS,
        format!(
            "{} peer processes, {agents_started} agents, {} engine process groups started",
            ctx.cluster.spawned.len(),
            groups.len()
        ),
        leftovers,
    )
    .needs("peer processes started", ctx.cluster.spawned.len(), 3);
    if ctx.fleet.is_some() {
        left_nothing = left_nothing
            .needs("agents started", agents_started, 1)
            .needs("engine process groups started", groups.len(), 1);
    }
    checked.push(left_nothing);
}

/// Phase 10: the counts, and the history files when the run is kept.
#[allow(clippy::too_many_arguments)]
fn report(
    ctx: &Ctx,
    scenario: &'static Scenario,
    seed: u64,
    options: &RunOptions,
    dir: PathBuf,
    evidence: &Evidence,
    checked: Vec<Checked>,
    started: Instant,
) -> RunReport {
    let ops = ctx.history.ops();
    let router_ops = &evidence.router_ops;
    let count = |f: fn(&OpRecord) -> bool| ops.iter().filter(|o| f(o)).count();
    let mut report = RunReport {
        scenario: scenario.name,
        seed,
        run_id: ctx.run_id.clone(),
        faults: ctx.faults.clone(),
        ops: ops.len(),
        ops_ok: count(|o| matches!(o.outcome, Outcome::Ok(_))),
        ops_failed: count(|o| matches!(o.outcome, Outcome::Failed(_))),
        ops_unknown: count(|o| matches!(o.outcome, Outcome::Unknown(_))),
        router_ops: router_ops.len(),
        router_ok: router_ops.iter().filter(|o| o.result.is_ok()).count(),
        checked,
        seconds: started.elapsed().as_secs_f64(),
        kept: None,
    };
    if report.violations() > 0 || options.keep {
        write_history(&dir, &ops, &evidence.leader_samples, &report);
        write_fleet_history(&dir, &evidence.fleet_samples, router_ops, &evidence.windows);
        report.kept = Some(dir);
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    report
}
