//! The scenario catalogue and the runner that sets a cluster up, runs the
//! load, injects one scenario's faults, heals, and checks every invariant.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, ClusterError};
use crate::fleet::{self, Fleet, FleetLog, FleetSample, RouterLog, Subject, Window};
use crate::history::{History, OpRecord};
use crate::invariants::{self, Checked};
use crate::linearizability::RegOp;
use crate::load::{self, LeaderSample};
use crate::netns::{Net, NetError};

#[path = "scenario_powercut.rs"]
mod powercut_scenarios;

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Appended to every peer's server.yaml.
    pub extra_yaml: &'static str,
    /// Whether the run has a fleet: agents, engines, models, routers.
    pub fleet: bool,
}

const SMALL_SNAPSHOTS: &str = "raft:\n  snapshot_after_logs: 20\n  keep_logs_after_snapshot: 5\n";

pub const CATALOGUE: &[Scenario] = &[
    Scenario {
        name: "leader-sigkill",
        about: "SIGKILL the leader, restart it; twice",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "follower-kill-restart",
        about: "SIGKILL a follower, restart it; twice",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "leader-isolated-minority",
        about: "cut the leader off from both followers (clients still reach it), then heal",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "one-way-partition",
        about: "drop everything the leader sends to the followers, heal; then everything one follower sends",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "lossy-links",
        about: "10-30% packet loss (and delay where the kernel has netem) on every peer",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "leader-sigstop",
        about: "SIGSTOP the leader past the election timeout, then SIGCONT",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "write-burst-crash",
        about: "a burst of concurrent writes, SIGKILL the leader in the middle of it, restart",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "whole-cluster-restart",
        about: "SIGKILL all three peers, restart them spread out",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "follower-lag-snapshot",
        about: "isolate a follower while writes purge the log (tiny snapshot thresholds), heal: it must catch up by snapshot",
        extra_yaml: SMALL_SNAPSHOTS,
        fleet: false,
    },
    Scenario {
        name: "agent-cut-below-ttl",
        about: "cut one agent's control stream for less than node_ttl: the node never goes unreachable, its replicas are untouched",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
    },
    Scenario {
        name: "agent-cut-past-lost",
        about: "cut one agent's control stream past lost_after, heal: its replicas are re-placed, the returning node stops its old shards",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
    },
    Scenario {
        name: "leader-failover-during-drain",
        about: "drain a node, SIGKILL the leader mid-drain, restart it: the drain completes with exactly one replacement",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
    },
    Scenario {
        name: "engine-crash-loop",
        about: "add a model whose engine crashes while loading: it is retried with backoff while the other models keep serving",
        extra_yaml: fleet::LIVENESS_YAML,
        fleet: true,
    },
    Scenario {
        name: "peer-replacement-with-leader-killed",
        about: "add peer 4 and SIGKILL the leader while the change is in flight, then remove a follower",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "power-cut-one-peer",
        about: "lazy disks: cut the power of the leader or a follower under load (unsynced writes dropped, sometimes torn), restart; twice",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "power-cut-all-peers",
        about: "lazy disks: cut the power of all three peers at once during a write burst, restart them",
        extra_yaml: "",
        fleet: false,
    },
    Scenario {
        name: "power-cut-during-snapshot-install",
        about: "lazy disks, tiny snapshot thresholds: isolate a follower until the log is purged past it, heal, cut its power while the snapshot arrives, restart",
        extra_yaml: SMALL_SNAPSHOTS,
        fleet: false,
    },
];

pub fn find(name: &str) -> Option<&'static Scenario> {
    CATALOGUE.iter().find(|s| s.name == name)
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{0}")]
    Setup(String),
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The `llmgw` binary the peers run.
    pub bin: PathBuf,
    /// Runs' logs and data go under here; a run without violations is
    /// removed, a failed one kept.
    pub work_dir: PathBuf,
    pub keep: bool,
    /// Load workers.
    pub workers: usize,
    /// Prints faults as they happen.
    pub verbose: bool,
    /// Test-only: adds one fabricated leader sample (a second leader for
    /// the highest term seen), to show the checks can fail.
    pub forge_leader_sample: bool,
    /// Test-only: adds one fabricated replica sample in which a second
    /// replica holds a GPU a live shard holds, to show the GPU check fails.
    pub forge_gpu_double: bool,
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub scenario: &'static str,
    pub seed: u64,
    pub run_id: String,
    pub faults: Vec<String>,
    pub ops: usize,
    pub ops_ok: usize,
    pub ops_failed: usize,
    pub ops_unknown: usize,
    /// Chat completions through the routers, and how many succeeded.
    pub router_ops: usize,
    pub router_ok: usize,
    pub checked: Vec<Checked>,
    pub seconds: f64,
    /// Where logs were kept, if they were.
    pub kept: Option<PathBuf>,
}

impl RunReport {
    pub fn violations(&self) -> usize {
        self.checked.iter().map(|c| c.violations.len()).sum()
    }
}

/// The fault-injection side of a run: the cluster, the seeded schedule,
/// and the log of what was done.
pub struct Ctx {
    pub cluster: Cluster,
    rng: StdRng,
    faults: Vec<String>,
    history: History,
    verbose: bool,
    /// Extra load started by the scenario (a burst).
    burst: Vec<JoinHandle<()>>,
    burst_stop: Arc<AtomicBool>,
    seed: u64,
    run_id: String,
    extra_checks: Vec<Checked>,
    /// The agents and their engines, in fleet scenarios.
    pub fleet: Option<Fleet>,
    fleet_log: FleetLog,
    /// What each fault touched and when.
    windows: Vec<Window>,
    /// Fleet models and their desired replica counts.
    desired: BTreeMap<String, u64>,
}

impl Ctx {
    fn fault(&mut self, what: impl Into<String>) {
        let what = what.into();
        let line = format!("{:6.1}s {what}", self.history.elapsed().as_secs_f64());
        if self.verbose {
            println!("  {line}");
        }
        self.faults.push(line);
    }

    /// Waits a seeded time in `[min_ms, max_ms)`.
    async fn hold(&mut self, min_ms: u64, max_ms: u64) {
        let ms = self.rng.random_range(min_ms..max_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    async fn leader(&self) -> Result<u64, ScenarioError> {
        Ok(self.cluster.wait_leader(Duration::from_secs(60)).await?)
    }

    fn followers(&self, leader: u64) -> Vec<u64> {
        self.cluster
            .member_ids()
            .into_iter()
            .filter(|id| *id != leader)
            .collect()
    }

    fn pick(&mut self, from: &[u64]) -> u64 {
        from[self.rng.random_range(0..from.len())]
    }

    fn kill(&mut self, id: u64) {
        // Opened before the signal: a request cut by the kill completes
        // before `kill` returns.
        self.open_window(Subject::Peer(id), true);
        self.cluster.kill(id);
        self.fault(format!("SIGKILL peer {id}"));
    }

    fn restart(&mut self, id: u64) -> Result<(), ScenarioError> {
        self.cluster.spawn(id)?;
        self.close_window(&Subject::Peer(id));
        self.fault(format!("restart peer {id}"));
        Ok(())
    }

    fn heal(&mut self) -> Result<(), ScenarioError> {
        self.cluster.net.heal()?;
        let now = self.history.now_us();
        for window in &mut self.windows {
            if !matches!(window.subject, Subject::Peer(_)) {
                window.to_us.get_or_insert(now);
            }
        }
        self.fault("heal the network");
        Ok(())
    }

    fn open_window(&mut self, subject: Subject, data_plane: bool) {
        self.windows.push(Window {
            subject,
            from_us: self.history.now_us(),
            to_us: None,
            data_plane,
        });
    }

    fn close_window(&mut self, subject: &Subject) {
        let now = self.history.now_us();
        for window in &mut self.windows {
            if &window.subject == subject {
                window.to_us.get_or_insert(now);
            }
        }
    }

    fn work_dirs(&self) -> Vec<(String, PathBuf)> {
        self.fleet
            .as_ref()
            .map(Fleet::work_dirs)
            .unwrap_or_default()
    }

    /// A fresh fleet sample that passes `check`, within `within`.
    async fn wait_fleet<F>(&self, within: Duration, check: F) -> Result<FleetSample, String>
    where
        F: FnMut(&FleetSample) -> Result<(), String>,
    {
        fleet::wait_sample(
            &self.cluster.members,
            &self.work_dirs(),
            &self.history,
            within,
            check,
        )
        .await
    }

    /// Starts `n` extra workers with no pause between requests.
    fn start_burst(&mut self, n: usize) {
        self.start_burst_avoiding(n, None);
    }

    /// Like `start_burst`, with workers that never send to `avoid`.
    fn start_burst_avoiding(&mut self, n: usize, avoid: Option<u64>) {
        let targets = crate::cluster::Members::default();
        {
            let members = self
                .cluster
                .members
                .read()
                .unwrap_or_else(|p| p.into_inner());
            let mut targets = targets.write().unwrap_or_else(|p| p.into_inner());
            targets.extend(
                members
                    .iter()
                    .filter(|(id, _)| Some(**id) != avoid)
                    .map(|(id, url)| (*id, url.clone())),
            );
        }
        for i in 0..n {
            self.burst.push(tokio::spawn(load::worker(
                100 + i,
                self.seed,
                self.run_id.clone(),
                targets.clone(),
                self.history.clone(),
                self.burst_stop.clone(),
                Duration::ZERO,
            )));
        }
        match avoid {
            Some(peer) => self.fault(format!("start a burst of {n} writers, none to peer {peer}")),
            None => self.fault(format!("start a burst of {n} writers")),
        }
    }

    async fn stop_burst(&mut self) {
        self.burst_stop.store(true, Ordering::Relaxed);
        for handle in self.burst.drain(..) {
            let _ = handle.await;
        }
    }
}

/// Runs one scenario with one seed.
pub async fn run(
    scenario: &'static Scenario,
    seed: u64,
    options: &RunOptions,
) -> Result<RunReport, ScenarioError> {
    let started = Instant::now();
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
    if scenario.name.starts_with(powercut_scenarios::PREFIX) {
        cluster.mount_lazy_disks()?;
    }
    for id in 1..=3 {
        cluster.spawn(id)?;
    }
    let history = History::new(Instant::now());
    let mut ctx = Ctx {
        cluster,
        rng: StdRng::seed_from_u64(seed),
        faults: Vec::new(),
        history: history.clone(),
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

    let stop_load = Arc::new(AtomicBool::new(false));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(load::sampler(
        ctx.cluster.members.clone(),
        history.clone(),
        stop_sampler.clone(),
        Duration::from_millis(150),
    ));
    let fleet_sampler = ctx.fleet.as_ref().map(|f| {
        tokio::spawn(fleet::sampler(
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
                w,
                seed,
                run_id.clone(),
                ctx.cluster.members.clone(),
                history.clone(),
                stop_load.clone(),
                Duration::from_millis(30),
            ))
        })
        .collect();
    let router_log = RouterLog::default();
    let router_workers: Vec<_> = if scenario.fleet {
        let routers = crate::cluster::Members::default();
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

    ctx.hold(1500, 2500).await;
    let injected = inject(scenario.name, &mut ctx).await;
    // Heal whatever the scenario left, even when it stopped early.
    let _ = ctx.cluster.net.heal();
    for id in ctx.cluster.member_ids() {
        if ctx.cluster.peers[&id].stopped {
            ctx.cluster.resume(id);
            ctx.fault(format!("SIGCONT peer {id} (healing)"));
        }
        if !ctx.cluster.is_running(id) {
            ctx.restart(id)?;
        }
    }
    let healed_at = Instant::now();
    let now = history.now_us();
    for window in &mut ctx.windows {
        window.to_us.get_or_insert(now);
    }
    ctx.hold(2000, 3000).await;
    ctx.stop_burst().await;
    let mut checked = Vec::new();
    if scenario.fleet {
        // Router load runs on while the fleet settles.
        let desired = ctx.desired.clone();
        let bound = Duration::from_secs(60);
        let ready = ctx
            .wait_fleet(bound.saturating_sub(healed_at.elapsed()), |s| {
                fleet::fleet_ready(s, &desired)
            })
            .await;
        checked.push(Checked::new(
            invariants::REPLICAS_READY_AFTER_HEALING,
            format!("{desired:?} within {}s of healing", bound.as_secs()),
            match ready {
                Ok(_) => Vec::new(),
                Err(why) => vec![format!(
                    "not every desired replica was ready {}s after healing: {why}",
                    bound.as_secs()
                )],
            },
        ));
        if ctx.verbose {
            println!(
                "  fleet ready again {:.1}s after healing",
                healed_at.elapsed().as_secs_f64()
            );
        }
    }
    stop_load.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    for worker in router_workers {
        let _ = worker.await;
    }

    if let Err(error) = injected {
        checked.push(Checked::new(
            "scenario-ran",
            "the fault schedule",
            vec![error.to_string()],
        ));
    }
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
    final_reads(&ctx.cluster, &history).await;
    let catalogs = catalogs(&ctx.cluster).await;
    stop_sampler.store(true, Ordering::Relaxed);
    let mut samples = sampler.await.unwrap_or_default();
    if options.forge_leader_sample {
        forge(&mut samples);
    }
    if let Some(fleet_sampler) = fleet_sampler {
        let _ = fleet_sampler.await;
    }
    let mut fleet_samples =
        std::mem::take(&mut *ctx.fleet_log.lock().unwrap_or_else(|p| p.into_inner()));
    if options.forge_gpu_double {
        forge_gpu(&mut fleet_samples);
    }

    let ops = history.ops();
    checked.push(invariants::single_leader(&samples));
    checked.push(invariants::state_hashes(&states));
    checked.push(invariants::acknowledged_writes(&ops, &catalogs));
    checked.push(invariants::linearizable(&ops));
    if let Some(fleet) = &ctx.fleet {
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
        let agent_logs: Vec<(String, String)> = fleet
            .agents
            .iter()
            .map(|(id, a)| (id.clone(), a.log_text()))
            .collect();
        let router_ops = router_log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        checked.push(invariants::no_gpu_twice(&fleet_samples));
        checked.push(invariants::no_unreachable_while_healthy(
            &peer_logs,
            &fleet_samples,
            &ctx.windows,
        ));
        checked.push(invariants::router_healthy(
            &router_ops,
            &fleet_samples,
            &ctx.windows,
        ));
        checked.push(invariants::no_deposed_command(&fleet_samples, &agent_logs));
    }
    checked.append(&mut ctx.extra_checks);

    let engine_groups: Vec<i32> = fleet_samples
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
    leftovers.extend(crate::powercut::mounts_under(&dir));
    let listed = crate::netns::run("ip", &["netns", "list"]).unwrap_or_default();
    leftovers.extend(
        listed
            .lines()
            .filter(|l| l.contains(&format!("llmgw-chaos-{run_id}-")))
            .map(|l| format!("namespace {} was not removed", l.trim())),
    );
    {
        let mut groups = engine_groups.clone();
        groups.sort_unstable();
        groups.dedup();
        checked.push(Checked::new(
            invariants::NO_LEFTOVERS,
            format!(
                "{} peer processes, {agents_started} agents, {} engine process groups started",
                ctx.cluster.spawned.len(),
                groups.len()
            ),
            leftovers,
        ));
    }

    let router_ops = router_log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let count = |f: fn(&OpRecord) -> bool| ops.iter().filter(|o| f(o)).count();
    let mut report = RunReport {
        scenario: scenario.name,
        seed,
        run_id,
        faults: ctx.faults.clone(),
        ops: ops.len(),
        ops_ok: count(|o| matches!(o.outcome, crate::history::Outcome::Ok(_))),
        ops_failed: count(|o| matches!(o.outcome, crate::history::Outcome::Failed(_))),
        ops_unknown: count(|o| matches!(o.outcome, crate::history::Outcome::Unknown(_))),
        router_ops: router_ops.len(),
        router_ok: router_ops.iter().filter(|o| o.result.is_ok()).count(),
        checked,
        seconds: started.elapsed().as_secs_f64(),
        kept: None,
    };
    if report.violations() > 0 || options.keep {
        write_history(&dir, &ops, &samples, &report);
        write_fleet_history(&dir, &fleet_samples, &router_ops, &ctx.windows);
        report.kept = Some(dir);
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report)
}

/// The test-only forged sample: some peer claims a second leader for the
/// highest term seen.
fn forge(samples: &mut Vec<LeaderSample>) {
    let Some(real) = samples
        .iter()
        .filter(|s| s.leader.is_some())
        .max_by_key(|s| s.term)
        .cloned()
    else {
        return;
    };
    let leader = real.leader.expect("filtered");
    samples.push(LeaderSample {
        at_us: real.at_us,
        peer: real.peer,
        term: real.term,
        leader: Some(if leader == 1 { 2 } else { 1 }),
    });
}

/// The test-only forged fleet sample: a second replica claims a GPU that
/// a live shard holds, in the last sample that has one.
fn forge_gpu(samples: &mut Vec<FleetSample>) {
    let Some(mut forged) = samples
        .iter()
        .rev()
        .find(|s| {
            s.replicas
                .iter()
                .flatten()
                .any(|r| r.shards.iter().any(|sh| sh.live() && !sh.gpus.is_empty()))
        })
        .cloned()
    else {
        return;
    };
    let replicas = forged.replicas.as_mut().expect("found with replicas");
    let victim = replicas
        .iter()
        .find(|r| r.shards.iter().any(|sh| sh.live() && !sh.gpus.is_empty()))
        .cloned()
        .expect("found with a live shard");
    // One shard on one GPU of the victim's first live shard.
    let mut twin = victim;
    twin.id = format!("{}-forged", twin.id);
    let mut shard = twin
        .shards
        .iter()
        .find(|sh| sh.live() && !sh.gpus.is_empty())
        .cloned()
        .expect("found with a live shard");
    shard.gpus.truncate(1);
    twin.shards = vec![shard];
    replicas.push(twin);
    forged.agents.clear();
    samples.push(forged);
}

/// Agents up and registered, the catalog written, every desired replica
/// ready: the state every fleet scenario starts from.
async fn setup_fleet(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    ctx.fleet = Some(Fleet::start(&mut ctx.cluster)?);
    let expected = fleet::NODES.len();
    ctx.wait_fleet(Duration::from_secs(90), |s| {
        let ready = fleet::ready_nodes(s);
        if ready.len() == expected {
            Ok(())
        } else {
            Err(format!("nodes ready: {ready:?}"))
        }
    })
    .await
    .map_err(|why| ScenarioError::Setup(format!("agents did not register within 90s: {why}")))?;
    for (model, replicas) in fleet::catalog() {
        let name = model["name"].as_str().expect("named").to_owned();
        fleet::send_to_leader(
            &ctx.cluster,
            reqwest::Method::PUT,
            &format!("/api/v1/models/{name}"),
            Some(&model),
            Duration::from_secs(60),
        )
        .await
        .map_err(|why| ScenarioError::Setup(format!("cannot write model {name}: {why}")))?;
        ctx.desired.insert(name, replicas);
        // One model at a time, the two-node one first: single-node
        // replicas spread onto the H100s would leave no fabric with two
        // free 8-GPU nodes (the scheduler does not pack for later models).
        let desired = ctx.desired.clone();
        ctx.wait_fleet(Duration::from_secs(120), |s| {
            fleet::fleet_ready(s, &desired)
        })
        .await
        .map_err(|why| {
            ScenarioError::Setup(format!("the catalog was not ready within 120s: {why}"))
        })?;
    }
    let desired = ctx.desired.clone();
    ctx.wait_fleet(Duration::from_secs(120), |s| {
        fleet::fleet_ready(s, &desired)
    })
    .await
    .map_err(|why| ScenarioError::Setup(format!("the catalog was not ready within 120s: {why}")))?;
    // Every peer's router serves from its own applied state (its table is
    // rebuilt within 100 ms of an apply): each peer must see the catalog
    // ready before the router load starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in ctx.cluster.member_ids() {
        let one = crate::cluster::Members::default();
        one.write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, ctx.cluster.admin(id));
        fleet::wait_sample(
            &one,
            &[],
            &ctx.history,
            deadline.saturating_duration_since(Instant::now()),
            |s| fleet::fleet_ready(s, &desired),
        )
        .await
        .map_err(|why| {
            ScenarioError::Setup(format!("peer {id} did not see the catalog ready: {why}"))
        })?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if ctx.verbose {
        println!(
            "  {} agents registered, {:?} ready on every peer",
            expected, ctx.desired
        );
    }
    Ok(())
}

/// Waits for every member to report the same applied index and hash;
/// returns the last states seen either way.
async fn wait_converged(
    cluster: &Cluster,
    within: Duration,
) -> BTreeMap<u64, Option<(u64, String)>> {
    let started = Instant::now();
    loop {
        let mut states = BTreeMap::new();
        for id in cluster.member_ids() {
            states.insert(id, cluster.own_state(id).await);
        }
        let distinct: BTreeSet<_> = states.values().collect();
        if (distinct.len() == 1 && !distinct.contains(&None)) || started.elapsed() > within {
            return states;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A consistent read of every key on every member, once the load has
/// stopped; recorded like any other operation.
async fn final_reads(cluster: &Cluster, history: &History) {
    let keys: BTreeSet<String> = history.ops().into_iter().map(|op| op.key).collect();
    let http = load::client();
    for id in cluster.member_ids() {
        let base = cluster.admin(id);
        for key in &keys {
            let op_id = history.next_id();
            let invoke_us = history.now_us();
            let outcome = load::perform(&http, &base, key, &RegOp::Read).await;
            history.record(OpRecord {
                id: op_id,
                worker: usize::MAX,
                peer: id,
                key: key.clone(),
                op: RegOp::Read,
                invoke_us,
                complete_us: history.now_us(),
                outcome,
            });
        }
    }
}

type Catalog = BTreeMap<String, Option<String>>;

/// Every member's catalog from its own applied state.
async fn catalogs(cluster: &Cluster) -> BTreeMap<u64, Result<Catalog, String>> {
    let mut out = BTreeMap::new();
    for id in cluster.member_ids() {
        let result = match cluster.get(id, "/api/v1/models").await {
            Ok((200, serde_json::Value::Array(models))) => Ok(models
                .iter()
                .filter_map(|m| Some((m["name"].as_str()?.to_owned(), load::value_of(m))))
                .collect()),
            Ok((status, body)) => Err(format!("GET /api/v1/models: HTTP {status}: {body}")),
            Err(e) => Err(format!("GET /api/v1/models: {e}")),
        };
        out.insert(id, result);
    }
    out
}

fn write_fleet_history(
    dir: &std::path::Path,
    samples: &[FleetSample],
    router_ops: &[fleet::RouterOp],
    windows: &[Window],
) {
    let mut text = String::from("# fault windows\n");
    for w in windows {
        text.push_str(&format!("{w:?}\n"));
    }
    text.push_str("# router requests: peer model invoke_us complete_us result\n");
    for op in router_ops {
        text.push_str(&format!(
            "{} {} {} {} {:?}\n",
            op.peer, op.model, op.invoke_us, op.complete_us, op.result
        ));
    }
    text.push_str("# fleet samples\n");
    for s in samples {
        text.push_str(&format!("{s:?}\n"));
    }
    let _ = std::fs::write(dir.join("fleet.txt"), text);
}

fn write_history(
    dir: &std::path::Path,
    ops: &[OpRecord],
    samples: &[LeaderSample],
    report: &RunReport,
) {
    let mut text = String::new();
    text.push_str(&format!(
        "# {} seed {} run {}\n# faults\n",
        report.scenario, report.seed, report.run_id
    ));
    for fault in &report.faults {
        text.push_str(&format!("{fault}\n"));
    }
    text.push_str("# operations: id worker peer key op invoke_us complete_us outcome\n");
    for op in ops {
        text.push_str(&format!(
            "{} {} {} {} {:?} {} {} {:?}\n",
            op.id, op.worker, op.peer, op.key, op.op, op.invoke_us, op.complete_us, op.outcome
        ));
    }
    text.push_str("# leader samples: at_us peer term leader\n");
    for s in samples {
        text.push_str(&format!(
            "{} {} {} {:?}\n",
            s.at_us, s.peer, s.term, s.leader
        ));
    }
    let _ = std::fs::write(dir.join("history.txt"), text);
}

/// The fault schedule of each scenario. Every choice (which follower, how
/// long) comes from the seeded generator; "the leader" is whichever peer
/// leads at that moment.
async fn inject(name: &str, ctx: &mut Ctx) -> Result<(), ScenarioError> {
    match name {
        "leader-sigkill" => {
            for _ in 0..2 {
                let leader = ctx.leader().await?;
                ctx.kill(leader);
                ctx.hold(2500, 5000).await;
                ctx.restart(leader)?;
                ctx.hold(1500, 3000).await;
            }
        }
        "follower-kill-restart" => {
            for _ in 0..2 {
                let leader = ctx.leader().await?;
                let followers = ctx.followers(leader);
                let victim = ctx.pick(&followers);
                ctx.kill(victim);
                ctx.hold(2000, 5000).await;
                ctx.restart(victim)?;
                ctx.hold(1500, 3000).await;
            }
        }
        "leader-isolated-minority" => {
            let leader = ctx.leader().await?;
            ctx.cluster.net.isolate(&[leader])?;
            ctx.fault(format!("isolate leader {leader} from both followers"));
            ctx.hold(4000, 8000).await;
            ctx.heal()?;
            ctx.hold(1500, 3000).await;
        }
        "one-way-partition" => {
            let leader = ctx.leader().await?;
            for follower in ctx.followers(leader) {
                ctx.cluster.net.block(leader, follower)?;
            }
            ctx.fault(format!(
                "drop all traffic from leader {leader} to the followers"
            ));
            ctx.hold(4000, 7000).await;
            ctx.heal()?;
            ctx.hold(1500, 3000).await;
            let leader = ctx.leader().await?;
            let followers = ctx.followers(leader);
            let sender = ctx.pick(&followers);
            for other in ctx.cluster.member_ids() {
                if other != sender {
                    ctx.cluster.net.block(sender, other)?;
                }
            }
            ctx.fault(format!(
                "drop all traffic from follower {sender} to the others"
            ));
            ctx.hold(4000, 7000).await;
            ctx.heal()?;
            ctx.hold(1500, 3000).await;
        }
        "lossy-links" => {
            for id in ctx.cluster.member_ids() {
                let loss = ctx.rng.random_range(10..30);
                let delay = ctx.rng.random_range(20..80);
                let how = ctx.cluster.net.degrade(id, loss, delay)?;
                ctx.fault(format!("peer {id}: {how}"));
            }
            ctx.hold(6000, 10000).await;
            ctx.heal()?;
            ctx.hold(1500, 3000).await;
        }
        "leader-sigstop" => {
            let leader = ctx.leader().await?;
            ctx.cluster.pause(leader);
            ctx.fault(format!("SIGSTOP leader {leader}"));
            // The election timeout is at most 1.6 s.
            ctx.hold(3000, 6000).await;
            ctx.cluster.resume(leader);
            ctx.fault(format!("SIGCONT peer {leader}"));
            ctx.hold(2000, 4000).await;
        }
        "write-burst-crash" => {
            ctx.start_burst(6);
            ctx.hold(300, 1500).await;
            let leader = ctx.leader().await?;
            ctx.kill(leader);
            ctx.hold(2000, 4000).await;
            ctx.restart(leader)?;
            ctx.hold(1000, 2000).await;
            ctx.stop_burst().await;
            ctx.fault("stop the burst");
        }
        "whole-cluster-restart" => {
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
        }
        "follower-lag-snapshot" => follower_lag_snapshot(ctx).await?,
        "agent-cut-below-ttl" => agent_cut_below_ttl(ctx).await?,
        "agent-cut-past-lost" => agent_cut_past_lost(ctx).await?,
        "leader-failover-during-drain" => failover_during_drain(ctx).await?,
        "engine-crash-loop" => engine_crash_loop(ctx).await?,
        "peer-replacement-with-leader-killed" => peer_replacement(ctx).await?,
        "power-cut-one-peer" => powercut_scenarios::one_peer(ctx).await?,
        "power-cut-all-peers" => powercut_scenarios::all_peers(ctx).await?,
        "power-cut-during-snapshot-install" => {
            powercut_scenarios::during_snapshot_install(ctx).await?
        }
        other => {
            return Err(ScenarioError::Setup(format!(
                "no fault schedule for scenario {other}"
            )));
        }
    }
    Ok(())
}

async fn follower_lag_snapshot(ctx: &mut Ctx) -> Result<(), ScenarioError> {
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
    // Until the leader's snapshot is well past what the follower holds
    // (the log behind it purged), bounded.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut snapshot = 0.0;
    while Instant::now() < deadline {
        let leader = ctx.cluster.wait_leader_among(&followers).await;
        if let Some(leader) = leader {
            snapshot = ctx
                .cluster
                .metric(leader, "llmgw_raft_snapshot_index")
                .await
                .unwrap_or(0.0);
            if snapshot >= (applied_before + 40) as f64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ctx.fault(format!(
        "leader snapshot at index {snapshot}, follower {lagging} applied {applied_before}"
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

async fn peer_replacement(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    const NEW: u64 = 4;
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    let retiring = ctx.pick(&followers);
    ctx.cluster.prepare_new_peer(NEW, &[1, 2, 3])?;
    ctx.cluster.spawn(NEW)?;
    ctx.fault(format!("start new peer {NEW}"));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(75))
        .build()
        .expect("an HTTP client with default TLS settings");
    let body = serde_json::json!({
        "id": NEW,
        "grpc": ctx.cluster.grpc(NEW),
        "admin": ctx.cluster.admin(NEW),
    })
    .to_string();
    let via = ctx.cluster.admin(retiring);
    let add = {
        let http = http.clone();
        let body = body.clone();
        let url = format!("{via}/api/v1/cluster/peers");
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
        if ctx.cluster.membership_of(NEW).await == Ok(Some("voter".to_owned())) {
            break;
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Setup(format!(
                "peer {NEW} did not become a voter within 90s"
            )));
        }
        let leader = ctx.leader().await?;
        let url = format!("{}/api/v1/cluster/peers", ctx.cluster.admin(leader));
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
        let url = format!(
            "{}/api/v1/cluster/peers/{retiring}",
            ctx.cluster.admin(leader)
        );
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

/// A check of this scenario's own promise.
fn promise(ctx: &mut Ctx, name: &'static str, scope: String, result: Result<(), String>) {
    ctx.extra_checks.push(Checked::new(
        name,
        scope,
        result.err().into_iter().collect(),
    ));
}

/// The latest fleet sample; an error when the sampler has none yet.
fn latest(ctx: &Ctx) -> Result<FleetSample, ScenarioError> {
    fleet::latest(&ctx.fleet_log)
        .ok_or_else(|| ScenarioError::Setup("the fleet sampler has no sample yet".into()))
}

/// A seeded node among those that hold a shard of the small model.
fn pick_small_node(ctx: &mut Ctx, sample: &FleetSample) -> Result<String, ScenarioError> {
    let nodes = fleet::nodes_of(sample, fleet::SMALL);
    if nodes.is_empty() {
        return Err(ScenarioError::Setup(format!(
            "no node holds a shard of {}",
            fleet::SMALL
        )));
    }
    Ok(nodes[ctx.rng.random_range(0..nodes.len())].clone())
}

fn node_addr(ctx: &Ctx, node: &str) -> u64 {
    ctx.fleet.as_ref().expect("a fleet scenario").agents[node].addr
}

/// Replica ids and the shards (node, GPUs) of every replica.
fn placements(sample: &FleetSample) -> BTreeMap<String, Vec<(String, Vec<u32>)>> {
    sample
        .replicas
        .iter()
        .flatten()
        .map(|r| {
            (
                r.id.clone(),
                r.shards
                    .iter()
                    .map(|s| (s.node.clone(), s.gpus.clone()))
                    .collect(),
            )
        })
        .collect()
}

/// The engine process groups of `node`'s shards, from its state files.
fn shard_groups(sample: &FleetSample, node: &str) -> BTreeMap<String, Vec<i32>> {
    sample
        .agents
        .iter()
        .filter(|a| a.node == node)
        .flat_map(|a| a.shards.iter())
        .map(|s| (s.shard_id.clone(), s.pgids.clone()))
        .collect()
}

async fn agent_cut_below_ttl(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let addr = node_addr(ctx, &node);
    let peers = ctx.cluster.member_ids();
    let groups_before = shard_groups(&before, &node);
    // Well below the TTL: TCP retransmission after the heal adds up to
    // a few hundred ms, a heartbeat interval (500 ms) more.
    let cut_ms = ctx.rng.random_range(500..900);
    ctx.cluster
        .net
        .cut_stream(addr, &peers, fleet::STREAM_PORT)?;
    ctx.open_window(Subject::Node(node.clone()), false);
    ctx.fault(format!(
        "cut node {node}'s control stream for {cut_ms} ms (node_ttl {:?})",
        fleet::NODE_TTL
    ));
    tokio::time::sleep(Duration::from_millis(cut_ms)).await;
    ctx.heal()?;
    ctx.hold(3000, 4000).await;
    let after = latest(ctx)?;
    // The node was never anything but ready, in any sample or any log.
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let marked: Vec<String> = log
        .iter()
        .filter_map(|s| {
            let (status, _) = s.nodes.as_ref()?.get(&node)?;
            (status != "ready").then(|| format!("{status} at {:.1}s", s.at_us as f64 / 1e6))
        })
        .collect();
    let logged: Vec<String> = ctx
        .cluster
        .peers
        .iter()
        .flat_map(|(&id, p)| (1..=p.starts).map(move |n| (id, n)))
        .flat_map(|(id, n)| {
            std::fs::read_to_string(ctx.cluster.log_path(id, n))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("node status changed") && l.contains(&node))
                .map(|l| format!("peer {id}: {}", l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    promise(
        ctx,
        "cut-node-stayed-ready",
        format!("node {node}, cut {cut_ms} ms"),
        if marked.is_empty() && logged.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "node {node} was marked down after a {cut_ms} ms cut: samples {marked:?}, logs {logged:?}"
            ))
        },
    );
    let (p0, p1) = (placements(&before), placements(&after));
    let groups_after = shard_groups(&after, &node);
    promise(
        ctx,
        "replicas-untouched",
        format!(
            "{} replicas, node {node}'s engines {:?}",
            p0.len(),
            groups_before
        ),
        if p0 == p1 && groups_before == groups_after {
            Ok(())
        } else {
            Err(format!(
                "placements before {p0:?} after {p1:?}; node {node}'s engines before {groups_before:?} after {groups_after:?}"
            ))
        },
    );
    Ok(())
}

async fn agent_cut_past_lost(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let addr = node_addr(ctx, &node);
    let peers = ctx.cluster.member_ids();
    let old_replicas: BTreeSet<String> = before
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.shards.iter().any(|s| s.node == node))
        .map(|r| r.id.clone())
        .collect();
    let old_groups = shard_groups(&before, &node);
    ctx.cluster
        .net
        .cut_stream(addr, &peers, fleet::STREAM_PORT)?;
    // Its replicas are retired once it is lost: requests to them may fail.
    ctx.open_window(Subject::Node(node.clone()), true);
    ctx.fault(format!(
        "cut node {node}'s control stream (node_ttl {:?}, lost_after {:?}); it runs {old_replicas:?}",
        fleet::NODE_TTL,
        fleet::LOST_AFTER
    ));
    let bound = fleet::NODE_TTL + fleet::LOST_AFTER + Duration::from_secs(15);
    let lost = ctx
        .wait_fleet(bound, |s| {
            match s.nodes.as_ref().and_then(|n| n.get(&node)) {
                Some((status, _)) if status == "lost" => Ok(()),
                other => Err(format!("node {node} is {other:?}")),
            }
        })
        .await;
    ctx.fault(format!("node {node} lost: {}", lost.is_ok()));
    let desired = ctx.desired.clone();
    let replaced = ctx
        .wait_fleet(Duration::from_secs(30), |s| {
            fleet::fleet_ready(s, &desired)?;
            let left: Vec<&String> = s
                .replicas
                .iter()
                .flatten()
                .filter(|r| old_replicas.contains(&r.id))
                .map(|r| &r.id)
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("old replicas still listed: {left:?}"))
            }
        })
        .await;
    // The two-node model has nowhere else to go when an H100 is lost.
    let movable = !node.starts_with("h100");
    promise(
        ctx,
        "lost-node-replicas-replaced",
        format!("node {node}, replicas {old_replicas:?}"),
        match (&lost, &replaced) {
            (Err(why), _) => Err(format!("node {node} was not lost within {bound:?}: {why}")),
            (Ok(_), Err(why)) if movable => Err(format!(
                "{node}'s replicas were not replaced elsewhere within 30s: {why}"
            )),
            _ => Ok(()),
        },
    );
    ctx.hold(500, 1500).await;
    ctx.heal()?;
    let stopped = ctx
        .wait_fleet(Duration::from_secs(30), |s| {
            let status = s.nodes.as_ref().and_then(|n| n.get(&node)).cloned();
            if status.as_ref().map(|(st, _)| st.as_str()) != Some("ready") {
                return Err(format!("node {node} is {status:?}"));
            }
            let still = shard_groups(s, &node);
            let kept: Vec<&String> = old_groups
                .keys()
                .filter(|k| still.contains_key(*k))
                .collect();
            if !kept.is_empty() {
                return Err(format!("node {node} still runs its old shards {kept:?}"));
            }
            Ok(())
        })
        .await;
    let alive: Vec<i32> = old_groups
        .values()
        .flatten()
        .copied()
        .filter(|g| crate::cluster::is_alive(*g as u32))
        .collect();
    promise(
        ctx,
        "returning-node-stopped-old-shards",
        format!(
            "node {node}, shards {:?}",
            old_groups.keys().collect::<Vec<_>>()
        ),
        match stopped {
            Err(why) => Err(format!("within 30s of healing: {why}")),
            Ok(_) if !alive.is_empty() => Err(format!(
                "the old shards' state files are gone but process groups {alive:?} live"
            )),
            Ok(_) => Ok(()),
        },
    );
    Ok(())
}

async fn failover_during_drain(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let before = latest(ctx)?;
    let node = pick_small_node(ctx, &before)?;
    let drained: BTreeSet<String> = before
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.model == fleet::SMALL && r.shards.iter().any(|s| s.node == node))
        .map(|r| r.id.clone())
        .collect();
    let answer = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::POST,
        &format!("/api/v1/nodes/{node}/drain?deadline_s=30"),
        None,
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("drain {node}: {why}")))?;
    ctx.fault(format!(
        "drain node {node} (replicas {drained:?}): HTTP {}",
        answer.0
    ));
    ctx.hold(0, 1500).await;
    let leader = ctx.leader().await?;
    let followers = ctx.followers(leader);
    ctx.kill(leader);
    // A failover must happen: until a follower leads (openraft's leader
    // lease can outlast a short kill, and a quick restart would resume
    // the old leadership).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut successor = None;
    while successor.is_none() && Instant::now() < deadline {
        successor = ctx
            .cluster
            .wait_leader_among(&followers)
            .await
            .filter(|l| followers.contains(l));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match successor {
        Some(new) => ctx.fault(format!("peer {new} leads")),
        None => {
            return Err(ScenarioError::Setup(format!(
                "no follower of {followers:?} took over within 30s of the leader's SIGKILL"
            )));
        }
    }
    ctx.hold(1000, 3000).await;
    ctx.restart(leader)?;
    let desired = ctx.desired.clone();
    let done = ctx
        .wait_fleet(Duration::from_secs(60), |s| {
            fleet::fleet_ready(s, &desired)?;
            match s.nodes.as_ref().and_then(|n| n.get(&node)) {
                Some((_, false)) => {}
                other => return Err(format!("node {node} is {other:?}")),
            }
            let on_node: Vec<&String> = s
                .replicas
                .iter()
                .flatten()
                .filter(|r| r.model == fleet::SMALL && r.shards.iter().any(|sh| sh.node == node))
                .map(|r| &r.id)
                .collect();
            if on_node.is_empty() {
                Ok(())
            } else {
                Err(format!("{on_node:?} still on {node}"))
            }
        })
        .await;
    promise(
        ctx,
        "drain-completed",
        format!("node {node}"),
        done.map(|_| ())
            .map_err(|why| format!("within 60s of the restart: {why}")),
    );
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut replacements: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in log.iter().flat_map(|s| s.replicas.iter().flatten()) {
        if let Some(old) = &r.replaces
            && drained.contains(old)
        {
            replacements
                .entry(old.clone())
                .or_default()
                .insert(r.id.clone());
        }
    }
    let wrong: Vec<String> = drained
        .iter()
        .filter(|old| replacements.get(*old).map_or(0, BTreeSet::len) != 1)
        .map(|old| format!("{old} replaced by {:?}", replacements.get(old)))
        .collect();
    promise(
        ctx,
        "exactly-one-replacement",
        format!("{} drained replicas", drained.len()),
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        },
    );
    // Leave the node usable for the checks after healing.
    let _ = fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::POST,
        &format!("/api/v1/nodes/{node}/uncordon"),
        None,
        Duration::from_secs(20),
    )
    .await;
    ctx.fault(format!("uncordon node {node}"));
    Ok(())
}

async fn engine_crash_loop(ctx: &mut Ctx) -> Result<(), ScenarioError> {
    let term_before = ctx.cluster.leader_view(ctx.leader().await?).await;
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::PUT,
        &format!("/api/v1/models/{}", fleet::CRASHING),
        Some(&fleet::crashing_model()),
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("PUT {}: {why}", fleet::CRASHING)))?;
    let from_us = ctx.history.now_us();
    ctx.fault(format!(
        "add model {} whose engine crashes while loading",
        fleet::CRASHING
    ));
    let watch_ms = ctx.rng.random_range(12_000..16_000);
    tokio::time::sleep(Duration::from_millis(watch_ms)).await;
    let to_us = ctx.history.now_us();
    // Every replica of the crashing model, first seen when.
    let log = ctx
        .fleet_log
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut first_seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed_seen = false;
    for s in log
        .iter()
        .filter(|s| s.at_us >= from_us && s.at_us <= to_us)
    {
        for r in s
            .replicas
            .iter()
            .flatten()
            .filter(|r| r.model == fleet::CRASHING)
        {
            first_seen.entry(r.id.clone()).or_insert(s.at_us);
            failed_seen |= r.state == "failed" || r.shards.iter().any(|sh| sh.state == "failed");
        }
    }
    let mut starts: Vec<u64> = first_seen.values().copied().collect();
    starts.sort_unstable();
    let gaps: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]) / 1000).collect();
    // With no backoff a round every 250 ms would try ~50 times.
    let max_attempts = 8;
    let (_, explain) = ctx
        .cluster
        .get(
            ctx.leader().await?,
            &format!("/api/v1/models/{}/explain", fleet::CRASHING),
        )
        .await
        .map_err(ScenarioError::Setup)?;
    let failure = explain["last_failure"].to_string();
    promise(
        ctx,
        "crash-loop-backed-off",
        format!(
            "{} attempts in {watch_ms} ms, gaps {gaps:?} ms",
            starts.len()
        ),
        if starts.len() < 2 {
            Err(format!(
                "{} was tried {} time(s) in {watch_ms} ms: not retried",
                fleet::CRASHING,
                starts.len()
            ))
        } else if starts.len() > max_attempts {
            Err(format!(
                "{} was tried {} times in {watch_ms} ms (gaps {gaps:?} ms): no backoff",
                fleet::CRASHING,
                starts.len()
            ))
        } else if !failure.contains("No available memory for the cache blocks") {
            Err(format!(
                "explain does not carry the engine's failure: last_failure {failure}"
            ))
        } else if !failed_seen {
            Err("no sample showed the replica failed".into())
        } else {
            Ok(())
        },
    );
    let term_after = ctx.cluster.leader_view(ctx.leader().await?).await;
    promise(
        ctx,
        "control-plane-undisturbed",
        format!("term and leader before {term_before:?}, after {term_after:?}"),
        if term_before == term_after && term_before.is_some() {
            Ok(())
        } else {
            Err(format!(
                "the leader or term changed while an engine crashed in a loop: {term_before:?} -> {term_after:?}"
            ))
        },
    );
    fleet::send_to_leader(
        &ctx.cluster,
        reqwest::Method::DELETE,
        &format!("/api/v1/models/{}", fleet::CRASHING),
        None,
        Duration::from_secs(30),
    )
    .await
    .map_err(|why| ScenarioError::Setup(format!("DELETE {}: {why}", fleet::CRASHING)))?;
    ctx.fault(format!("delete model {}", fleet::CRASHING));
    Ok(())
}
