//! Harness: a supervisor over the real `llmgw-engine-sim` binary on
//! 127.0.0.1, a node inventory from the H100 fixture, statuses collected
//! from the supervisor's channel, and guards that kill every process group
//! a test started, even when it fails.

#![allow(dead_code)]

pub mod control_plane;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use llmgw_agent::{LaunchSpec, NodeFacts, Supervisor};
use llmgw_catalog::{Engine, EngineRelease, LaunchMode};
use llmgw_config::{DiscoveryConfig, FabricConfig, SupervisorConfig};
use llmgw_engines::{EnginesConfig, NodeContext, SglangConfig, VllmConfig};
use llmgw_proto::agent::{ShardState, ShardStatus};
use tokio::sync::mpsc;

use llmgw_test_kit::engine_sim_bin;
use llmgw_test_kit::process::signal_group;

pub const SMALL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// How the simulated node is set up.
#[derive(Clone)]
pub struct NodeSetup {
    pub vllm_version: EngineRelease,
    pub launch_mode: LaunchMode,
    pub load_time: &'static str,
    pub stop_timeout: Duration,
    pub startup_timeout: Duration,
    pub log_lines: usize,
}

impl Default for NodeSetup {
    fn default() -> Self {
        NodeSetup {
            vllm_version: EngineRelease::new(0, 11, 1),
            launch_mode: LaunchMode::Mp,
            load_time: "400ms",
            stop_timeout: Duration::from_secs(3),
            startup_timeout: Duration::from_secs(30),
            log_lines: 40,
        }
    }
}

pub fn supervisor_config(work_dir: &Path, setup: &NodeSetup) -> SupervisorConfig {
    SupervisorConfig {
        work_dir: work_dir.to_path_buf(),
        log_lines: setup.log_lines,
        log_max_bytes: 1024 * 1024,
        stop_timeout: setup.stop_timeout,
        health_interval: Duration::from_millis(100),
        startup_timeout: setup.startup_timeout,
    }
}

/// The H100 fixture node with fabric `ib-a`, engines pointing at the sim.
pub fn node_facts(work_dir: &Path, setup: &NodeSetup) -> NodeFacts {
    let sim = engine_sim_bin();
    let mut env = BTreeMap::new();
    env.insert(
        "LLMGW_SIM_LOAD_TIME".to_string(),
        setup.load_time.to_string(),
    );
    env.insert("LLMGW_SIM_TTFT".to_string(), "5ms".to_string());
    env.insert("LLMGW_SIM_ITL".to_string(), "2ms".to_string());
    env.insert("LLMGW_SIM_SEED".to_string(), "7".to_string());
    env.insert(
        "RAY_TMPDIR".to_string(),
        work_dir.join("ray").display().to_string(),
    );
    let mut vllm_env = env.clone();
    vllm_env.insert(
        "LLMGW_SIM_PERSONA".to_string(),
        format!("vllm={}", setup.vllm_version),
    );
    let mut sglang_env = env;
    sglang_env.insert("LLMGW_SIM_PERSONA".to_string(), "sglang=0.5.10".to_string());
    let fabrics = vec![FabricConfig {
        name: "ib-a".into(),
        hcas: vec!["mlx5_0".into(), "mlx5_1".into()],
        rate_gbps: None,
    }];
    let discovery = DiscoveryConfig {
        nvidia_smi: None,
        ib_root: PathBuf::from("/nonexistent"),
        prefer_nvml: false,
        skip_gpus: false,
        fixture: Some(repo_root().join("deploy/fixtures/nodes/h100-sxm-8x-ib-a.yaml")),
    };
    let inventory = llmgw_discovery::discover(&discovery, &fabrics);
    assert_eq!(
        inventory.gpus.len(),
        8,
        "fixture inventory: {:?}",
        inventory.warnings
    );
    NodeFacts {
        node_id: "gpu-test-01".into(),
        context: NodeContext {
            mgmt_addr: "127.0.0.1".into(),
            mgmt_interface: None,
            engines: EnginesConfig {
                vllm: Some(VllmConfig {
                    bin: sim.clone(),
                    launch_mode: setup.launch_mode,
                    ray_bin: Some(sim.clone()),
                    version: setup.vllm_version,
                    env: vllm_env,
                }),
                sglang: Some(SglangConfig {
                    python: sim,
                    version: EngineRelease::new(0, 5, 10),
                    env: sglang_env,
                }),
            },
        },
        inventory,
    }
}

/// A single-node shard of the small model.
pub fn spec(shard_id: &str, engine: Engine, gpus: &[u32], port: u16) -> LaunchSpec {
    let n = gpus.len() as u32;
    LaunchSpec {
        shard_id: shard_id.into(),
        replica_id: format!("{shard_id}-replica"),
        model: "qwen-small".into(),
        source: SMALL.into(),
        aliases: vec![],
        engine,
        profile: format!("tp{n}"),
        nodes: 1,
        rank: 0,
        gpus: gpus.to_vec(),
        gpus_per_node: n,
        port,
        tensor_parallel: n,
        pipeline_parallel: 1,
        data_parallel: 1,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        fabric: None,
        launch_mode: None,
        min_gpu_memory_gb: 0,
        gpu_models: vec![],
        engine_args: vec![],
        env: BTreeMap::new(),
        kv_events_port: 0,
        kv_replay_port: 0,
        sleep_mode: false,
    }
}

/// Kills the process groups of every pid it was given, on drop.
#[derive(Default)]
pub struct GroupGuard {
    pgids: std::sync::Mutex<Vec<i32>>,
}

impl GroupGuard {
    pub fn add(&self, pgid: i32) {
        if pgid > 1 {
            let mut g = self.pgids.lock().unwrap();
            if !g.contains(&pgid) {
                g.push(pgid);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        for pgid in self.pgids.lock().unwrap().iter() {
            signal_group(*pgid, libc::SIGKILL);
        }
    }
}

/// A supervisor with its status channel, in a temp work_dir.
pub struct Harness {
    pub supervisor: Supervisor,
    pub events: mpsc::UnboundedReceiver<ShardStatus>,
    pub history: Vec<ShardStatus>,
    pub guard: GroupGuard,
    pub dir: tempfile::TempDir,
}

impl Harness {
    pub fn new(setup: &NodeSetup) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let (tx, rx) = mpsc::unbounded_channel();
        let (supervisor, _adopted) = Supervisor::new(
            supervisor_config(dir.path(), setup),
            node_facts(dir.path(), setup),
            tx,
        )
        .expect("supervisor");
        Harness {
            supervisor,
            events: rx,
            history: Vec::new(),
            guard: GroupGuard::default(),
            dir,
        }
    }

    /// A new supervisor on the same work_dir, as after an agent restart;
    /// the old one is dropped, which ends its tasks but no engine.
    pub fn restart(&mut self, setup: &NodeSetup) -> Vec<llmgw_agent::Adoption> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (supervisor, adopted) = Supervisor::new(
            supervisor_config(self.dir.path(), setup),
            node_facts(self.dir.path(), setup),
            tx,
        )
        .expect("supervisor");
        self.supervisor = supervisor;
        self.events = rx;
        self.history.clear();
        adopted
    }

    pub fn start(&mut self, spec: LaunchSpec) -> llmgw_agent::Outcome {
        self.start_asleep(spec, false)
    }

    /// Starts a shard, or asks one that runs to sleep or wake (`asleep`).
    pub fn start_asleep(&mut self, spec: LaunchSpec, asleep: bool) -> llmgw_agent::Outcome {
        let id = spec.shard_id.clone();
        let outcome = self.supervisor.start(spec, asleep, 1);
        for pid in self.supervisor.pids(&id) {
            self.guard.add(pid);
        }
        outcome
    }

    /// Waits for a status of `shard` in `state`; panics with the history.
    pub async fn wait_for(
        &mut self,
        shard: &str,
        state: ShardState,
        within: Duration,
    ) -> ShardStatus {
        let deadline = Instant::now() + within;
        if let Some(s) = self
            .history
            .iter()
            .find(|s| s.shard_id == shard && s.state == state as i32)
        {
            return s.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(status)) => {
                    self.guard.add(status.pid as i32);
                    self.history.push(status.clone());
                    if status.shard_id == shard && status.state == state as i32 {
                        return status;
                    }
                }
                _ => panic!(
                    "shard {shard} did not reach {} within {within:?}; statuses: {:#?}",
                    state.as_str_name(),
                    self.history
                ),
            }
        }
    }

    /// States `shard` went through so far, in order.
    pub fn states(&self, shard: &str) -> Vec<ShardState> {
        self.history
            .iter()
            .filter(|s| s.shard_id == shard)
            .map(|s| ShardState::try_from(s.state).unwrap())
            .collect()
    }

    pub fn logs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir.path().join("logs"))
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    }
}

/// One blocking HTTP/1.1 request; the status and body.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

pub fn completion(port: u16, max_tokens: u32) -> std::io::Result<(u16, String)> {
    http(
        port,
        "POST",
        "/v1/completions",
        &format!(r#"{{"model":"qwen-small","prompt":"hello","max_tokens":{max_tokens}}}"#),
    )
}

/// `pid=1234` → `pid=N`, as in the simulator's golden files.
pub fn normalize_pids(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("pid=") {
        out.push_str(&rest[..i + 4]);
        rest = &rest[i + 4..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            out.push('N');
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}
