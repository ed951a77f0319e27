//! The data plane of a run: `llmgw agent` processes with fixture
//! inventories, each in a network namespace of its own (so its control
//! stream can be cut while its engines stay reachable), engines that are
//! `llmgw-engine-sim`, a catalog with a single-node and a two-node model,
//! recorded chat completions through the peers' in-peer routers, and a
//! sampler that watches replicas, node statuses and every agent's own
//! files (leader term, shard state files) throughout.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use llmgw_api::{Model, NodeView, ReplicaView, paths};
use llmgw_dev::{
    A100_ROCE_B, AgentLayout, H100_IB_A, L40S_PCIE, NodeKind, SimEngines, agent_yaml_tls,
};
use llmgw_procfs::{alive, signal_group, to_pid};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::cluster::{Cluster, ClusterError, Members, get_view, snapshot};
use crate::history::History;

/// The peers' gRPC port, which carries the agents' control streams.
pub const STREAM_PORT: u16 = 7070;

/// Liveness settings of every fleet scenario: short, so a run sees nodes
/// go unreachable and lost within seconds.
pub const LIVENESS_YAML: &str = "liveness:\n  node_ttl: 2s\n  lost_after: 6s\n  leader_grace: 4s\n";
pub const NODE_TTL: Duration = Duration::from_secs(2);
pub const LOST_AFTER: Duration = Duration::from_secs(6);

/// The simulated nodes: two H100 nodes on one InfiniBand fabric (the
/// two-node model), an A100 node and an L40S node. The number is the last
/// octet of the node's address.
pub const NODES: &[(&str, NodeKind, u64)] = &[
    ("h100-1", H100_IB_A, 11),
    ("h100-2", H100_IB_A, 12),
    ("a100-1", A100_ROCE_B, 13),
    ("l40s-1", L40S_PCIE, 14),
];

/// The single-node model, two replicas.
pub const SMALL: &str = "qwen";
/// The two-node tensor-parallel model on the H100s.
pub const LARGE: &str = "llama-70b";
/// The model whose engine crashes while loading (engine-crash-loop).
pub const CRASHING: &str = "crashy";

/// One catalog entry, written here as models.yaml would hold it.
fn entry(json: Value) -> Model {
    serde_json::from_value(json).expect("the suite's catalog entries are well formed")
}

/// Every model of the catalog with its desired replica count, in the
/// order they are written.
pub fn catalog() -> Vec<(Model, u64)> {
    vec![
        (
            entry(json!({
                "name": LARGE,
                "source": "meta-llama/Llama-3.1-70B-Instruct",
                "replicas": 1,
                "profiles": [{
                    "name": "tp8x2", "engine": "vllm", "nodes": 2, "gpus_per_node": 8,
                    "tensor_parallel": 8, "pipeline_parallel": 2, "launch_mode": "mp",
                    "min_gpu_memory_gb": 40
                }]
            })),
            1,
        ),
        (small_model(2), 2),
    ]
}

/// The single-node model with `replicas` replicas.
pub fn small_model(replicas: u32) -> Model {
    small_entry(replicas, json!({}), None)
}

/// The single-node model with `revision` in its engines' environment:
/// another launch spec than [`small_model`]'s, which rolls out. Its
/// engines load for 4 s, so a rollout has replacements loading for a
/// while.
pub fn small_model_revised(replicas: u32, revision: &str) -> Model {
    small_entry(
        replicas,
        json!({ "LLMGW_CHAOS_REVISION": revision, "LLMGW_SIM_LOAD_TIME": "4s" }),
        None,
    )
}

/// The single-node model, its launch spec unchanged, autoscaled from
/// `min` to `max` replicas sized for `target` requests each: it grows
/// after 2 s of wanting to and never shrinks within a run.
pub fn small_model_autoscaled(min: u32, max: u32, target: u32) -> Model {
    small_entry(
        min,
        json!({}),
        Some(json!({
            "min_replicas": min, "max_replicas": max, "target_requests_per_replica": target,
            "scale_up_window": "2s", "scale_down_window": "1h"
        })),
    )
}

fn small_entry(replicas: u32, env: Value, autoscale: Option<Value>) -> Model {
    let mut entry_json = json!({
        "name": SMALL,
        "source": "Qwen/Qwen2.5-0.5B-Instruct",
        "replicas": replicas,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16,
                      "env": env}]
    });
    if let Some(autoscale) = autoscale {
        entry_json["autoscale"] = autoscale;
    }
    entry(entry_json)
}

/// A model whose engine fails every start with the KV-cache error.
pub fn crashing_model() -> Model {
    entry(json!({
        "name": CRASHING,
        "source": "Qwen/Qwen3-0.6B",
        "replicas": 1,
        "profiles": [{"name": "tp1", "engine": "vllm", "nodes": 1, "gpus_per_node": 1,
                      "tensor_parallel": 1, "pipeline_parallel": 1, "min_gpu_memory_gb": 16,
                      "env": {"LLMGW_SIM_FAULT": "crash_on_load:kv_cache"}}]
    }))
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/fixtures/nodes")
}

pub struct Agent {
    pub layout: AgentLayout,
    pub addr: u64,
    pub ip: Ipv4Addr,
    child: Option<Child>,
    pub starts: u32,
}

impl Agent {
    pub fn log_path(&self, start: u32) -> PathBuf {
        self.layout.log.with_extension(format!("{start}.log"))
    }

    pub fn log_text(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

pub struct Fleet {
    pub agents: BTreeMap<String, Agent>,
    bin: PathBuf,
    /// Every agent pid this run started, for the leftover check.
    pub spawned: Vec<i32>,
}

impl Fleet {
    /// Namespaces, configs and processes for every node of `NODES`.
    pub fn start(cluster: &mut Cluster) -> Result<Fleet, ClusterError> {
        let sim = cluster.bin.with_file_name("llmgw-engine-sim");
        if !sim.exists() {
            return Err(ClusterError::Timeout {
                what: "the engine simulator".into(),
                seconds: 0,
                detail: format!(
                    "{} does not exist: build it with `cargo build -p llmgw-engine-sim`",
                    sim.display()
                ),
            });
        }
        let fixtures = fixtures_dir();
        let engines = SimEngines {
            bin: sim,
            env: vec![
                ("LLMGW_SIM_LOAD_TIME".into(), "500ms".into()),
                ("LLMGW_SIM_TTFT".into(), "5ms".into()),
                ("LLMGW_SIM_ITL".into(), "1ms".into()),
            ],
        };
        let peer_ids: Vec<u64> = cluster.peers.keys().copied().collect();
        let mut fleet = Fleet {
            agents: BTreeMap::new(),
            bin: cluster.bin.clone(),
            spawned: Vec::new(),
        };
        for (i, (node_id, kind, addr)) in NODES.iter().enumerate() {
            cluster.net.add_node(*addr)?;
            let ip = cluster.net.peer_ip(*addr);
            let layout = AgentLayout::new(&cluster.dir, node_id, *kind, "r1");
            // Agents dial different peers first.
            let mut servers: Vec<String> = peer_ids.iter().map(|id| cluster.grpc(*id)).collect();
            let count = servers.len();
            servers.rotate_left(i % count);
            let tls = cluster.node_tls(node_id)?;
            let yaml = agent_yaml_tls(&layout, &servers, &fixtures, &engines, &tls, "")
                .replace("mgmt_addr: 127.0.0.1", &format!("mgmt_addr: {ip}"));
            std::fs::write(&layout.config, yaml).map_err(|source| ClusterError::File {
                path: layout.config.clone(),
                source,
            })?;
            fleet.agents.insert(
                (*node_id).to_owned(),
                Agent {
                    layout,
                    addr: *addr,
                    ip,
                    child: None,
                    starts: 0,
                },
            );
            fleet.spawn(cluster, node_id)?;
        }
        Ok(fleet)
    }

    /// Starts (or restarts) the agent of `node` in its namespace.
    pub fn spawn(&mut self, cluster: &Cluster, node: &str) -> Result<(), ClusterError> {
        let agent = self.agents.get_mut(node).expect("known node");
        assert!(agent.child.is_none(), "agent {node} runs");
        agent.starts += 1;
        let path = agent.log_path(agent.starts);
        let log = std::fs::File::create(&path).map_err(|source| ClusterError::File {
            path: path.clone(),
            source,
        })?;
        let log_err = log.try_clone().map_err(|source| ClusterError::File {
            path: path.clone(),
            source,
        })?;
        let ns = cluster.net.namespace(agent.addr).to_owned();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(&self.bin)
            .args(["agent", "--config"])
            .arg(&agent.layout.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                id: agent.addr,
                bin: self.bin.clone(),
                source,
            })?;
        self.spawned.push(to_pid(child.id()));
        agent.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the agent of `node` (its engines, in process groups of
    /// their own, keep running) and waits for it to be gone.
    pub fn kill_agent(&mut self, node: &str) {
        let agent = self.agents.get_mut(node).expect("known node");
        if let Some(mut child) = agent.child.take() {
            signal_group(to_pid(child.id()), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Starts again every agent a schedule killed and left down; their
    /// nodes.
    pub fn restart_killed(&mut self, cluster: &Cluster) -> Result<Vec<String>, ClusterError> {
        let down: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, agent)| agent.child.is_none())
            .map(|(node, _)| node.clone())
            .collect();
        for node in &down {
            self.spawn(cluster, node)?;
        }
        Ok(down)
    }

    /// Node id to its agent's work directory.
    pub fn work_dirs(&self) -> Vec<(String, PathBuf)> {
        self.agents
            .iter()
            .map(|(id, a)| (id.clone(), a.layout.work_dir.clone()))
            .collect()
    }

    /// Stops every agent, then every engine they recorded; returns what
    /// is still alive.
    pub fn shutdown(&mut self, extra_groups: &[i32]) -> Vec<String> {
        let mut groups: Vec<i32> = extra_groups.to_vec();
        for agent in self.agents.values_mut() {
            if let Some(mut child) = agent.child.take() {
                signal_group(to_pid(child.id()), libc::SIGCONT);
                signal_group(to_pid(child.id()), libc::SIGKILL);
                let _ = child.wait();
            }
            groups.extend(llmgw_dev::engine_groups(&agent.layout.work_dir));
        }
        groups.sort_unstable();
        groups.dedup();
        for &pgid in &groups {
            signal_group(pgid, libc::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left: Vec<String> = self
                .spawned
                .iter()
                .filter(|pid| alive(**pid))
                .map(|pid| format!("agent pid {pid} started by this run is still alive"))
                .chain(
                    groups
                        .iter()
                        .filter(|pgid| alive(**pgid))
                        .map(|pgid| format!("engine process group {pgid} is still alive")),
                )
                .collect();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.shutdown(&[]);
    }
}

/// One shard as `GET /api/v1/replicas` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardObs {
    pub node: String,
    pub gpus: Vec<u32>,
    pub state: String,
}

impl ShardObs {
    /// Holds its GPUs: not stopped and not failed.
    pub fn live(&self) -> bool {
        !matches!(self.state.as_str(), "stopped" | "failed")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaObs {
    pub id: String,
    pub model: String,
    pub state: String,
    pub replaces: Option<String>,
    pub shards: Vec<ShardObs>,
}

impl From<&ReplicaView> for ReplicaObs {
    fn from(view: &ReplicaView) -> Self {
        ReplicaObs {
            id: view.replica.id.clone(),
            model: view.replica.model.clone(),
            state: view.state.as_str().to_owned(),
            replaces: view.replica.replaces.clone(),
            shards: view
                .replica
                .shards
                .iter()
                .map(|shard| ShardObs {
                    node: shard.node.clone(),
                    gpus: shard.gpus.clone(),
                    state: shard.state.as_str().to_owned(),
                })
                .collect(),
        }
    }
}

/// One shard state file on an agent's disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentShard {
    pub shard_id: String,
    /// The leader term of the command that started it.
    pub term: u64,
    pub gpus: Vec<u32>,
    pub pgids: Vec<i32>,
}

/// What one agent's work directory held at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentObs {
    pub node: String,
    /// `leader-term`: the highest term the agent has seen.
    pub leader_term: u64,
    pub shards: Vec<AgentShard>,
}

/// Reads an agent's `leader-term` and `shards/*.json`.
pub fn observe_agent(node: &str, work_dir: &Path) -> AgentObs {
    // `TERM LEADER` (or `TERM` from older agents).
    let leader_term = std::fs::read_to_string(work_dir.join("leader-term"))
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let mut shards: Vec<AgentShard> = llmgw_agent::read_state_files(work_dir)
        .into_iter()
        .filter_map(|(_, record)| record.ok())
        .map(|record| AgentShard {
            shard_id: record.shard_id,
            term: record.term,
            gpus: record.spec.gpus,
            pgids: record.processes.iter().map(|p| p.pgid).collect(),
        })
        .collect();
    shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
    AgentObs {
        node: node.to_owned(),
        leader_term,
        shards,
    }
}

/// One round of the fleet sampler.
#[derive(Debug, Clone, Default)]
pub struct FleetSample {
    pub at_us: u64,
    /// The peer that answered the API reads, if any did.
    pub peer: Option<u64>,
    pub replicas: Option<Vec<ReplicaObs>>,
    /// Node id to status (`ready`, `unreachable`, `lost`) and draining.
    pub nodes: Option<BTreeMap<String, (String, bool)>>,
    pub agents: Vec<AgentObs>,
}

/// The samples so far, shared with the scenario.
pub type FleetLog = Arc<Mutex<Vec<FleetSample>>>;

pub fn latest(log: &FleetLog) -> Option<FleetSample> {
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .rev()
        .find(|s| s.replicas.is_some() && s.nodes.is_some())
        .cloned()
}

/// One round: replicas and nodes from the first member that answers,
/// every agent's files.
pub async fn sample_once(
    http: &reqwest::Client,
    members: &Members,
    work_dirs: &[(String, PathBuf)],
    history: &History,
) -> FleetSample {
    let at_us = history.now_us();
    let peers: Vec<(u64, String)> = snapshot(members);
    let mut sample = FleetSample {
        at_us,
        ..FleetSample::default()
    };
    for (id, base) in peers {
        let Ok(replicas) = get_view::<Vec<ReplicaView>>(http, &base, paths::REPLICAS).await else {
            continue;
        };
        let Ok(nodes) = get_view::<Vec<NodeView>>(http, &base, paths::NODES).await else {
            continue;
        };
        sample.peer = Some(id);
        sample.replicas = Some(replicas.iter().map(ReplicaObs::from).collect());
        sample.nodes = Some(
            nodes
                .into_iter()
                .map(|node| {
                    let status = node.record.status.as_str().to_owned();
                    (node.record.id, (status, node.record.draining))
                })
                .collect(),
        );
        break;
    }
    sample.agents = work_dirs
        .iter()
        .map(|(node, dir)| observe_agent(node, dir))
        .collect();
    sample
}

/// Samples every `every` until `stop`.
pub async fn sampler(
    http: reqwest::Client,
    members: Members,
    work_dirs: Vec<(String, PathBuf)>,
    history: History,
    log: FleetLog,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    while !stop.load(Ordering::Relaxed) {
        let sample = sample_once(&http, &members, &work_dirs, &history).await;
        log.lock().unwrap_or_else(|p| p.into_inner()).push(sample);
        tokio::time::sleep(every).await;
    }
}

/// One chat completion through a peer's router.
#[derive(Debug, Clone)]
pub struct RouterOp {
    pub peer: u64,
    pub model: String,
    pub invoke_us: u64,
    pub complete_us: u64,
    /// `Err` says how it failed.
    pub result: Result<(), String>,
}

pub type RouterLog = Arc<Mutex<Vec<RouterOp>>>;

/// Chat completions through a random peer's router for a random model,
/// one in flight, until `stop`.
#[allow(clippy::too_many_arguments)]
pub async fn router_worker(
    worker: usize,
    seed: u64,
    routers: Arc<RwLock<BTreeMap<u64, String>>>,
    models: Vec<String>,
    history: History,
    log: RouterLog,
    stop: Arc<AtomicBool>,
    pause: Duration,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("an HTTP client with default TLS settings");
    let mut rng = StdRng::seed_from_u64(seed ^ (0x5bd1_e995 * (worker as u64 + 1)));
    while !stop.load(Ordering::Relaxed) {
        let peers: Vec<(u64, String)> = snapshot(&routers);
        if peers.is_empty() || models.is_empty() {
            tokio::time::sleep(pause).await;
            continue;
        }
        let (peer, base) = peers[rng.random_range(0..peers.len())].clone();
        let model = models[rng.random_range(0..models.len())].clone();
        let invoke_us = history.now_us();
        let result = llmgw_test_kit::chat(&http, &base, &model).await.map(drop);
        let complete_us = history.now_us();
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(RouterOp {
                peer,
                model,
                invoke_us,
                complete_us,
                result,
            });
        tokio::time::sleep(pause).await;
    }
}

/// What a fault touched, for as long as it lasted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Peer(u64),
    Node(String),
}

/// A fault's time span. `data_plane`: whether requests served by the
/// subject could fail because of it (a killed peer's router; a node whose
/// replicas are retired), as opposed to a cut of the control stream only.
#[derive(Debug, Clone)]
pub struct Window {
    pub subject: Subject,
    pub from_us: u64,
    /// `None` while the fault lasts.
    pub to_us: Option<u64>,
    pub data_plane: bool,
}

/// Models' desired counts as the catalog left them, and whether every
/// one has exactly that many replicas, all ready. `Err` describes what is
/// not.
pub fn fleet_ready(sample: &FleetSample, desired: &BTreeMap<String, u64>) -> Result<(), String> {
    let Some(replicas) = &sample.replicas else {
        return Err("no member answered GET /api/v1/replicas".into());
    };
    let mut problems = Vec::new();
    for (model, want) in desired {
        let mine: Vec<&ReplicaObs> = replicas.iter().filter(|r| &r.model == model).collect();
        let ready = mine.iter().filter(|r| r.state == "ready").count() as u64;
        if ready != *want || mine.len() as u64 != *want {
            problems.push(format!(
                "{model}: {ready}/{want} ready, {} replicas ({})",
                mine.len(),
                mine.iter()
                    .map(|r| format!("{} {}", r.id, r.state))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Waits until `check` passes on a fresh sample; `Err` with the last
/// reason after `within`.
pub async fn wait_sample<F>(
    http: &reqwest::Client,
    members: &Members,
    work_dirs: &[(String, PathBuf)],
    history: &History,
    within: Duration,
    mut check: F,
) -> Result<FleetSample, String>
where
    F: FnMut(&FleetSample) -> Result<(), String>,
{
    let started = Instant::now();
    loop {
        let sample = sample_once(http, members, work_dirs, history).await;
        let why = match check(&sample) {
            Ok(()) => return Ok(sample),
            Err(why) => why,
        };
        if started.elapsed() > within {
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `method path` with an optional JSON body to the leader until it
/// answers 2xx, within `within`; returns the status and body.
pub async fn send_to_leader(
    cluster: &Cluster,
    method: reqwest::Method,
    path: &str,
    body: Option<&Model>,
    within: Duration,
) -> Result<(u16, String), String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < within {
        let leader = match cluster.wait_leader(Duration::from_secs(30)).await {
            Ok(leader) => leader,
            Err(e) => return Err(e.to_string()),
        };
        let mut request = cluster
            .http
            .request(method.clone(), format!("{}{path}", cluster.admin(leader)));
        if let Some(body) = body {
            request = request.json(body);
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let text = response.text().await.unwrap_or_default();
                if (200..300).contains(&status) {
                    return Ok((status, text));
                }
                last = format!("{method} {path} on peer {leader}: HTTP {status}: {text}");
            }
            Err(e) => last = format!("{method} {path} on peer {leader}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(last)
}

/// Node ids whose every entry in `sample` is `ready` and connected.
pub fn ready_nodes(sample: &FleetSample) -> Vec<String> {
    sample
        .nodes
        .iter()
        .flatten()
        .filter(|(_, (status, _))| status == "ready")
        .map(|(id, _)| id.clone())
        .collect()
}

/// The nodes that hold a live shard of `model` in `sample`.
pub fn nodes_of(sample: &FleetSample, model: &str) -> Vec<String> {
    let mut nodes: Vec<String> = sample
        .replicas
        .iter()
        .flatten()
        .filter(|r| r.model == model)
        .flat_map(|r| r.shards.iter().filter(|s| s.live()).map(|s| s.node.clone()))
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_entries_are_models() {
        let names: Vec<String> = catalog().into_iter().map(|(m, _)| m.name).collect();
        assert_eq!(names, [LARGE, SMALL]);
        assert_eq!(small_model(3).managed().map(|m| m.replicas), Some(3));
        assert_eq!(crashing_model().name, CRASHING);
    }

    #[test]
    fn a_replica_as_the_server_sends_it_becomes_evidence() {
        let answer = r#"[{"state": "draining", "endpoint": "http://10.0.0.11:8000",
            "id": "r1", "model": "qwen", "profile": "tp1", "created_at_ms": 1,
            "replaces": "r0",
            "shards": [{"node": "h100-1", "gpus": [3], "port": 8000, "rank": 0,
                        "state": "draining", "pid": 7, "last_failure": null,
                        "state_changed_at_ms": 2, "report_seq": 1}]}]"#;
        let views: Vec<ReplicaView> = serde_json::from_str(answer).unwrap();
        assert_eq!(
            ReplicaObs::from(&views[0]),
            ReplicaObs {
                id: "r1".into(),
                model: "qwen".into(),
                state: "draining".into(),
                replaces: Some("r0".into()),
                shards: vec![ShardObs {
                    node: "h100-1".into(),
                    gpus: vec![3],
                    state: "draining".into(),
                }],
            }
        );
    }
}
