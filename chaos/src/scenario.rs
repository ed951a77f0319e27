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
use crate::history::{History, OpRecord};
use crate::invariants::{self, Checked};
use crate::linearizability::RegOp;
use crate::load::{self, LeaderSample};
use crate::netns::{Net, NetError};

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    /// Appended to every peer's server.yaml.
    pub extra_yaml: &'static str,
}

const SMALL_SNAPSHOTS: &str = "raft:\n  snapshot_after_logs: 20\n  keep_logs_after_snapshot: 5\n";

pub const CATALOGUE: &[Scenario] = &[
    Scenario {
        name: "leader-sigkill",
        about: "SIGKILL the leader, restart it; twice",
        extra_yaml: "",
    },
    Scenario {
        name: "follower-kill-restart",
        about: "SIGKILL a follower, restart it; twice",
        extra_yaml: "",
    },
    Scenario {
        name: "leader-isolated-minority",
        about: "cut the leader off from both followers (clients still reach it), then heal",
        extra_yaml: "",
    },
    Scenario {
        name: "one-way-partition",
        about: "drop everything the leader sends to the followers, heal; then everything one follower sends",
        extra_yaml: "",
    },
    Scenario {
        name: "lossy-links",
        about: "10-30% packet loss (and delay where the kernel has netem) on every peer",
        extra_yaml: "",
    },
    Scenario {
        name: "leader-sigstop",
        about: "SIGSTOP the leader past the election timeout, then SIGCONT",
        extra_yaml: "",
    },
    Scenario {
        name: "write-burst-crash",
        about: "a burst of concurrent writes, SIGKILL the leader in the middle of it, restart",
        extra_yaml: "",
    },
    Scenario {
        name: "whole-cluster-restart",
        about: "SIGKILL all three peers, restart them spread out",
        extra_yaml: "",
    },
    Scenario {
        name: "follower-lag-snapshot",
        about: "isolate a follower while writes purge the log (tiny snapshot thresholds), heal: it must catch up by snapshot",
        extra_yaml: SMALL_SNAPSHOTS,
    },
    Scenario {
        name: "peer-replacement-with-leader-killed",
        about: "add peer 4 and SIGKILL the leader while the change is in flight, then remove a follower",
        extra_yaml: "",
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
        self.cluster.kill(id);
        self.fault(format!("SIGKILL peer {id}"));
    }

    fn restart(&mut self, id: u64) -> Result<(), ScenarioError> {
        self.cluster.spawn(id)?;
        self.fault(format!("restart peer {id}"));
        Ok(())
    }

    fn heal(&mut self) -> Result<(), ScenarioError> {
        self.cluster.net.heal()?;
        self.fault("heal the network");
        Ok(())
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
    let mut cluster = Cluster::create(net, &dir, &options.bin, 3, scenario.extra_yaml)?;
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
    ctx.hold(2000, 3000).await;
    ctx.stop_burst().await;
    stop_load.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }

    let mut checked = Vec::new();
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

    let ops = history.ops();
    checked.push(invariants::single_leader(&samples));
    checked.push(invariants::state_hashes(&states));
    checked.push(invariants::acknowledged_writes(&ops, &catalogs));
    checked.push(invariants::linearizable(&ops));
    checked.append(&mut ctx.extra_checks);

    let mut leftovers = ctx.cluster.shutdown();
    leftovers.extend(ctx.cluster.net.destroy());
    let listed = crate::netns::run("ip", &["netns", "list"]).unwrap_or_default();
    leftovers.extend(
        listed
            .lines()
            .filter(|l| l.contains(&format!("llmgw-chaos-{run_id}-")))
            .map(|l| format!("namespace {} was not removed", l.trim())),
    );
    checked.push(Checked::new(
        invariants::NO_LEFTOVERS,
        format!("{} processes started", ctx.cluster.spawned.len()),
        leftovers,
    ));

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
        checked,
        seconds: started.elapsed().as_secs_f64(),
        kept: None,
    };
    if report.violations() > 0 || options.keep {
        write_history(&dir, &ops, &samples, &report);
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
        "peer-replacement-with-leader-killed" => peer_replacement(ctx).await?,
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
