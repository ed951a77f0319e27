//! The fleet benchmark: a 3-peer control plane of real `llmgw server`
//! processes on this machine and thousands of simulated agents. Prints:
//! time to register the fleet, the leader's CPU and memory at steady state,
//! the time for the whole fleet to re-home after the leader is SIGKILLed
//! (and how many nodes were marked unreachable meanwhile), placement:
//! replicas committed per second, in-process decision rate included, the
//! snapshot at this size (bytes, build, install, hash) and a follower
//! catching up by snapshot, and the whole cluster killed and restarted.
//!
//!     cargo build --release -p llmgw-cli -p llmgw-fleet-sim
//!     target/release/fleet-bench --nodes 5000 --replicas 2000

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use llmgw_api::{Model, NodeStatus, Readiness, ReplicaState, paths};
use llmgw_fleet_sim::{Fleet, metric};
use llmgw_procfs::{cpu_seconds, rss_kib, to_pid};
use llmgw_test_kit::{llmgw_bin, poll_until_ok};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    #[arg(long, default_value_t = 5000)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 2000)]
    replicas: u32,
    /// Seconds of steady state over which the leader's CPU is measured.
    #[arg(long, default_value_t = 20)]
    steady_s: u64,
    /// The peers' `raft.snapshot_after_logs`; the catch-up phase writes
    /// more entries than this (plus the kept ones) while a follower is
    /// down, so that it catches up by snapshot.
    #[arg(long, default_value_t = 200)]
    snapshot_after_logs: u64,
    /// The peers' `raft.keep_logs_after_snapshot`.
    #[arg(long, default_value_t = 50)]
    keep_logs_after_snapshot: u64,
    /// Keep the peers' directory (configs, data, logs) after the run.
    #[arg(long)]
    keep: bool,
}

struct Peer {
    id: u64,
    admin: String,
    child: Option<Child>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `/readyz` answers its `Readiness` with 200 and with 503 alike.
async fn readiness(http: &reqwest::Client, admin: &str) -> Result<Readiness> {
    let url = format!("{admin}{}", paths::READYZ);
    Ok(http.get(url).send().await?.json().await?)
}

/// The leader a live peer names. `/readyz` is asked rather than the cluster
/// view: it is cheap, and the bench asks many times a second.
async fn leader(http: &reqwest::Client, peers: &[Peer]) -> Result<u64, String> {
    for peer in peers.iter().filter(|p| p.child.is_some()) {
        if let Ok(readiness) = readiness(http, &peer.admin).await
            && let Some(id) = readiness.leader_id
            && peers.iter().any(|p| p.id == id && p.child.is_some())
        {
            return Ok(id);
        }
    }
    Err("no running peer names a running leader".to_owned())
}

/// `Ok` once `seen` reached `wanted`; otherwise how far it is.
fn at_least(seen: f64, wanted: f64, what: &str) -> Result<(), String> {
    if seen >= wanted {
        Ok(())
    } else {
        Err(format!("{seen} of {wanted} {what}"))
    }
}

/// A metric the bench cannot go on without: its value, or why not.
async fn required_metric(http: &reqwest::Client, admin: &str, name: &str) -> Result<f64, String> {
    metric(http, admin, name)
        .await
        .ok_or_else(|| format!("{admin}{} has no {name}", paths::METRICS))
}

/// How often a phase is asked whether it is done; placement is asked more
/// often (see `measure_placement`).
const POLL: Duration = Duration::from_millis(100);

/// Polls `check` every `every` until it answers `Ok`; after `within`, an
/// error with `what` and the last reason `check` gave.
async fn wait_for<T, F, Fut>(what: &str, within: Duration, every: Duration, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    poll_until_ok(within, every, check)
        .await
        .map_err(|last| anyhow!("{what}: not within {within:?}; last seen: {last}"))
}

async fn unhealthy_nodes(http: &reqwest::Client, admin: &str) -> Option<usize> {
    let mut down = 0.0;
    for status in [NodeStatus::Unreachable, NodeStatus::Lost] {
        let name = format!("llmgw_nodes{{status=\"{}\"}}", status.as_str());
        down += metric(http, admin, &name).await.unwrap_or(0.0);
    }
    Some(down as usize)
}

/// The catalog allows 1,000 replicas per model: larger counts are split
/// across models `bench-0`, `bench-1`, ...
fn bench_models(replicas: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut left = replicas;
    while left > 0 {
        let count = left.min(1000);
        out.push((format!("bench-{}", out.len()), count));
        left -= count;
    }
    out
}

fn bench_model(name: &str, replicas: u32) -> Model {
    let entry = serde_json::json!({
        "name": name,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": replicas,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16}]
    });
    serde_json::from_value(entry).expect("the bench's catalog entry is well formed")
}

/// The leader's pure placement round on an in-memory fleet: how fast
/// decisions are made, before any Raft write.
fn decide_in_process(nodes: usize, replicas: u32) -> Result<llmgw_state::FleetState> {
    use llmgw_state::{Command, FleetState, Gpu, ModelSpec, NodeInventory};
    let mut fleet = FleetState::default();
    for i in 0..nodes {
        fleet.apply(&Command::RegisterNode {
            id: format!("sim-{i:05}"),
            mgmt_addr: format!("10.{}.{}.{}", 100 + i / 65_536, (i / 256) % 256, i % 256),
            inventory: NodeInventory {
                hostname: format!("sim-{i:05}"),
                gpus: (0..8)
                    .map(|index| Gpu {
                        index,
                        model: "NVIDIA H100 80GB HBM3".into(),
                        memory_mb: 81_559,
                        nvlink_peers: (0..8).filter(|p| *p != index).collect(),
                        ..Gpu::default()
                    })
                    .collect(),
                engines: vec!["vllm".into()],
                ..NodeInventory::default()
            },
            fabrics: vec![format!("ib-{}", i % 4)],
            labels: [("rack".to_owned(), format!("r{}", i % 50))].into(),
            at_ms: 1,
        });
    }
    for (name, count) in bench_models(replicas) {
        fleet.apply(&Command::PutModel {
            name: name.clone(),
            spec: ModelSpec::new(bench_model(&name, count)),
            replicas: count,
            at_ms: 1,
        });
    }
    let mut memory = llmgw_reconcile::Memory::default();
    let settings = llmgw_reconcile::PlanSettings::default();
    let started = Instant::now();
    let commands = llmgw_reconcile::decide(&fleet, &mut memory, &settings, 2);
    let took = started.elapsed().as_secs_f64();
    if commands.len() != replicas as usize {
        bail!("decide placed {} of {replicas}", commands.len());
    }
    println!(
        "decide (in process): {replicas} placements on {nodes} nodes in {:.1} ms ({:.0} decisions/s)",
        took * 1000.0,
        f64::from(replicas) / took
    );
    // In batches of 256, as the leader proposes them.
    let batches: Vec<Command> = commands
        .chunks(256)
        .map(|chunk| Command::Batch {
            commands: chunk.to_vec(),
            at_ms: 2,
        })
        .collect();
    let started = Instant::now();
    for batch in &batches {
        fleet.apply(batch);
    }
    let took = started.elapsed().as_secs_f64();
    if fleet.replicas.len() != replicas as usize {
        bail!("apply placed {} of {replicas}", fleet.replicas.len());
    }
    println!(
        "apply (in process): {replicas} placements in batches of 256 in {:.1} ms ({:.0} placements/s)",
        took * 1000.0,
        f64::from(replicas) / took
    );
    Ok(fleet)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let fleet_state = decide_in_process(args.nodes, args.replicas)?;
    snapshot_in_process(&fleet_state)?;
    drop(fleet_state);
    llmgw_runtime::multi_thread_runtime()?.block_on(bench_cluster(&args))
}

/// The three peers as processes, and how to reach them.
struct Cluster {
    bin: PathBuf,
    layouts: Vec<llmgw_dev::PeerLayout>,
    peers: Vec<Peer>,
    http: reqwest::Client,
}

impl Cluster {
    fn peer(&self, id: u64) -> &Peer {
        &self.peers[(id - 1) as usize]
    }

    fn admin(&self, id: u64) -> String {
        self.peer(id).admin.clone()
    }

    fn kill(&mut self, id: u64) -> Result<()> {
        if let Some(mut child) = self.peers[(id - 1) as usize].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    fn restart(&mut self, id: u64) -> Result<()> {
        let index = (id - 1) as usize;
        self.peers[index].child = Some(start_peer(&self.bin, &self.layouts[index])?);
        Ok(())
    }
}

/// Every measurement against a real cluster, in order: registration,
/// steady state, placement, failover, catch-up by snapshot, whole-cluster
/// restart.
async fn bench_cluster(args: &Args) -> Result<()> {
    let mut dir = tempfile::tempdir()?;
    if args.keep {
        dir.disable_cleanup(true);
        println!("peer configs, data and logs: {}", dir.path().display());
    }
    let mut cluster = start_cluster(args, dir.path())?;
    let first = wait_for("a leader", Duration::from_secs(60), POLL, || {
        leader(&cluster.http, &cluster.peers)
    })
    .await?;
    let servers: Vec<String> = cluster.layouts.iter().map(|l| l.grpc.to_string()).collect();
    println!(
        "fleet-bench: {} nodes, heartbeat {} ms, 3 peers, leader {first}",
        args.nodes, args.heartbeat_ms
    );

    let started = Instant::now();
    let fleet = Fleet::spawn(
        "sim",
        args.nodes,
        &servers,
        Duration::from_millis(args.heartbeat_ms),
    );
    let first = fleet_back(
        &cluster.http,
        &cluster.peers,
        args.nodes,
        "the whole fleet registered",
    )
    .await?;
    let admin = cluster.admin(first);
    let changes = metric(&cluster.http, &admin, "llmgw_raft_leader_changes_total").await;
    println!(
        "register: {} nodes ready with open streams in {:.2} s (leader {first}, leader changes seen: {})",
        args.nodes,
        started.elapsed().as_secs_f64(),
        changes.map_or("?".to_owned(), |c| c.to_string())
    );

    measure_steady_state(&cluster, first, args).await?;
    measure_placement(&cluster.http, &admin, args.replicas).await?;
    let next = measure_failover(&mut cluster, first, args.nodes).await?;
    measure_catch_up(&mut cluster, first, next, args).await?;
    measure_whole_restart(&mut cluster, args.nodes).await?;
    let stats = fleet.stats();
    println!(
        "fleet: {} registered, {} reconnects, {} commands, {} refused",
        stats.registered, stats.reconnects, stats.commands, stats.refused
    );
    fleet.stop();
    Ok(())
}

/// Writes the peers' configs under `dir` and starts them.
fn start_cluster(args: &Args, dir: &std::path::Path) -> Result<Cluster> {
    let bin = llmgw_bin();
    let layouts = llmgw_dev::plan_peers(dir, 3, false)?;
    let raft = format!(
        "raft:\n  snapshot_after_logs: {}\n  keep_logs_after_snapshot: {}\n",
        args.snapshot_after_logs, args.keep_logs_after_snapshot
    );
    let mut peers = Vec::new();
    for layout in &layouts {
        std::fs::write(
            &layout.config,
            llmgw_dev::server_yaml(layout, &layouts, &raft),
        )?;
        peers.push(Peer {
            id: layout.id,
            admin: layout.admin_url(),
            child: Some(start_peer(&bin, layout)?),
        });
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    Ok(Cluster {
        bin,
        layouts,
        peers,
        http,
    })
}

/// The leader's CPU and memory with the whole fleet heartbeating.
async fn measure_steady_state(cluster: &Cluster, leader: u64, args: &Args) -> Result<()> {
    let pid = cluster
        .peer(leader)
        .child
        .as_ref()
        .map(|child| to_pid(child.id()))
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu0 = cpu_seconds(pid).context("leader /proc")?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.steady_s)).await;
    let cpu1 = cpu_seconds(pid).context("leader /proc")?;
    let rss = rss_kib(pid).context("leader /proc")? as f64 / 1024.0;
    println!(
        "steady state: leader CPU {:.1}% of one core, RSS {:.0} MiB ({} heartbeats/s)",
        100.0 * (cpu1 - cpu0) / t0.elapsed().as_secs_f64(),
        rss,
        (args.nodes as f64 * 1000.0 / args.heartbeat_ms as f64) as u64
    );
    Ok(())
}

/// SIGKILLs the leader with the whole fleet connected; returns the new
/// leader once every stream is back on it.
async fn measure_failover(cluster: &mut Cluster, killed: u64, nodes: usize) -> Result<u64> {
    let killed_at = Instant::now();
    cluster.kill(killed)?;
    let next = wait_for("a new leader", Duration::from_secs(60), POLL, || {
        leader(&cluster.http, &cluster.peers)
    })
    .await?;
    let elected = killed_at.elapsed().as_secs_f64();
    let admin = cluster.admin(next);
    let http = &cluster.http;
    wait_for(
        "the fleet re-homed",
        Duration::from_secs(120),
        POLL,
        || async {
            let streams = required_metric(http, &admin, "llmgw_agent_streams").await?;
            at_least(streams, nodes as f64, "streams on the new leader")
        },
    )
    .await?;
    let rehomed = killed_at.elapsed().as_secs_f64();
    let worst = watch_unhealthy(http, &admin, Duration::from_secs(35)).await;
    println!(
        "failover: new leader {next} after {elected:.2} s, all {nodes} streams re-homed after {rehomed:.2} s, \
         nodes marked not ready during the next 35 s: {worst}"
    );
    Ok(next)
}

/// The killed peer missed more entries than the leader keeps after a
/// snapshot: it comes back by snapshot.
async fn measure_catch_up(
    cluster: &mut Cluster,
    killed: u64,
    leader: u64,
    args: &Args,
) -> Result<()> {
    let admin = cluster.admin(leader);
    let writes = args.snapshot_after_logs + args.keep_logs_after_snapshot + 50;
    write_entries(&cluster.http, &admin, writes).await?;
    let restarted = Instant::now();
    cluster.restart(killed)?;
    let http = &cluster.http;
    let target = metric(http, &admin, "llmgw_raft_commit_index")
        .await
        .context("leader commit index")?;
    let back = cluster.admin(killed);
    wait_for(
        "the restarted peer caught up",
        Duration::from_secs(300),
        POLL,
        || async {
            let applied = required_metric(http, &back, "llmgw_raft_apply_index").await?;
            at_least(applied, target, "applied index")
        },
    )
    .await?;
    let installed = metric(http, &back, "llmgw_raft_snapshots_installed_total")
        .await
        .unwrap_or(0.0);
    let caught_up = restarted.elapsed().as_secs_f64();
    let built = metric(http, &admin, "llmgw_raft_snapshot_build_seconds")
        .await
        .unwrap_or(0.0);
    let installed_in = metric(http, &back, "llmgw_raft_snapshot_install_seconds")
        .await
        .unwrap_or(0.0);
    let bytes = metric(http, &back, "llmgw_raft_snapshot_bytes")
        .await
        .unwrap_or(0.0);
    println!(
        "catch-up: peer {killed} restarted after {writes} entries it missed, applied up to the \
         leader's commit index {target} in {caught_up:.2} s, snapshots installed: {installed} \
         ({:.1} MiB; the leader built its last in {:.0} ms, the peer installed it in {:.0} ms)",
        bytes / (1024.0 * 1024.0),
        built * 1000.0,
        installed_in * 1000.0
    );
    Ok(())
}

/// Every peer SIGKILLed at once, then all restarted.
async fn measure_whole_restart(cluster: &mut Cluster, nodes: usize) -> Result<()> {
    let ids: Vec<u64> = cluster.peers.iter().map(|p| p.id).collect();
    for &id in &ids {
        cluster.kill(id)?;
    }
    let down_at = Instant::now();
    for &id in &ids {
        cluster.restart(id)?;
    }
    let http = &cluster.http;
    let leader_now = fleet_back(
        http,
        &cluster.peers,
        nodes,
        "the fleet back after a whole-cluster restart",
    )
    .await?;
    let back_after = down_at.elapsed().as_secs_f64();
    let admin = cluster.admin(leader_now);
    let term = metric(http, &admin, "llmgw_raft_term").await.unwrap_or(0.0);
    let lost = metric(http, &admin, "llmgw_nodes{status=\"lost\"}")
        .await
        .unwrap_or(0.0);
    let worst = watch_unhealthy(http, &admin, Duration::from_secs(20)).await;
    println!(
        "whole-cluster restart: all {nodes} nodes ready with open streams {back_after:.2} s after all three \
         peers were killed (leader {leader_now}, term {term}), lost: {lost}, not ready during the next 20 s: {worst}"
    );
    Ok(())
}

fn start_peer(bin: &std::path::Path, layout: &llmgw_dev::PeerLayout) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&layout.log)?;
    Command::new(bin)
        .args(["server", "--config"])
        .arg(&layout.config)
        .env(
            "RUST_LOG",
            std::env::var("FLEET_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("start llmgw server")
}

/// Waits until the leader holds a stream of every node and sees all of
/// them ready; answers the leader's id.
async fn fleet_back(
    http: &reqwest::Client,
    peers: &[Peer],
    nodes: usize,
    what: &str,
) -> Result<u64> {
    let want = nodes as f64;
    wait_for(what, Duration::from_secs(600), POLL, || async {
        // The leader may change under a registration storm: follow it.
        let now = leader(http, peers).await?;
        let admin = &peers[(now - 1) as usize].admin;
        let streams = required_metric(http, admin, "llmgw_agent_streams").await?;
        let ready = required_metric(http, admin, "llmgw_nodes{status=\"ready\"}").await?;
        at_least(streams, want, &format!("streams on leader {now}"))?;
        at_least(ready, want, &format!("nodes ready on leader {now}"))?;
        Ok(now)
    })
    .await
}

/// The most nodes seen not ready at once over `period`.
async fn watch_unhealthy(http: &reqwest::Client, admin: &str, period: Duration) -> usize {
    let mut worst = 0;
    let until = Instant::now() + period;
    while Instant::now() < until {
        if let Some(down) = unhealthy_nodes(http, admin).await {
            worst = worst.max(down);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    worst
}

/// Desired replicas of one-GPU models, committed and then ready.
async fn measure_placement(http: &reqwest::Client, admin: &str, replicas: u32) -> Result<()> {
    let placed_at = Instant::now();
    let puts = bench_models(replicas)
        .into_iter()
        .map(|(name, count)| async move {
            let response = http
                .put(format!("{admin}{}", paths::model(&name)))
                .json(&bench_model(&name, count))
                .send()
                .await?;
            if !response.status().is_success() {
                bail!("PUT model {name}: {}", response.text().await?);
            }
            Ok(())
        });
    for put in futures::future::join_all(puts).await {
        put?;
    }
    let wanted = f64::from(replicas);
    // Asked every 20 ms: the finer the poll, the less of a short
    // measurement is the poll's own granularity.
    wait_for(
        "every replica committed",
        Duration::from_secs(600),
        Duration::from_millis(20),
        || async {
            let mut placed = 0.0;
            for state in [
                ReplicaState::Placed,
                ReplicaState::Starting,
                ReplicaState::Loading,
                ReplicaState::Ready,
            ] {
                let name = format!("llmgw_replicas{{state=\"{}\"}}", state.as_str());
                placed += metric(http, admin, &name).await.unwrap_or(0.0);
            }
            at_least(placed, wanted, "replicas placed")
        },
    )
    .await?;
    let committed = placed_at.elapsed().as_secs_f64();
    wait_for(
        "every replica ready",
        Duration::from_secs(600),
        POLL,
        || async {
            let ready = required_metric(http, admin, "llmgw_replicas{state=\"ready\"}").await?;
            at_least(ready, wanted, "replicas ready")
        },
    )
    .await?;
    println!(
        "placement: {replicas} replicas committed in {committed:.2} s ({:.0} shard placements/s), all ready after {:.2} s",
        wanted / committed,
        placed_at.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `count` Raft entries through the admin API: a node cordoned and
/// uncordoned in turn (nothing runs on cordon alone).
async fn write_entries(http: &reqwest::Client, admin: &str, count: u64) -> Result<()> {
    for i in 0..count {
        let verb = if i % 2 == 0 { "cordon" } else { "uncordon" };
        let response = http
            .post(format!("{admin}{}", paths::node_action("sim-00000", verb)))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("{verb} sim-00000: {}", response.text().await?);
        }
    }
    if count % 2 == 1 {
        http.post(format!(
            "{admin}{}",
            paths::node_action("sim-00000", "uncordon")
        ))
        .send()
        .await?;
    }
    Ok(())
}

/// The snapshot at this fleet's size, as a peer builds (encodes), installs
/// (decodes) and hashes it.
fn snapshot_in_process(fleet: &llmgw_state::FleetState) -> Result<()> {
    let started = Instant::now();
    let bytes = serde_json::to_vec(fleet)?;
    let encoded = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let decoded: llmgw_state::FleetState = serde_json::from_slice(&bytes)?;
    let decode = started.elapsed().as_secs_f64();
    if decoded != *fleet {
        bail!("the snapshot did not decode to the state it was built from");
    }
    let started = Instant::now();
    let hash = fleet.hash();
    let hashed = started.elapsed().as_secs_f64();
    println!(
        "snapshot (in process): {} nodes, {} replicas: {:.1} MiB, encode {:.0} ms, decode {:.0} ms, hash {:.0} ms ({hash})",
        fleet.nodes.len(),
        fleet.replicas.len(),
        bytes.len() as f64 / (1024.0 * 1024.0),
        encoded * 1000.0,
        decode * 1000.0,
        hashed * 1000.0
    );
    Ok(())
}
