//! What an adapter is given and what it returns.

use std::collections::BTreeMap;
use std::path::PathBuf;

use llmgw_catalog::Profile;
use serde::Serialize;

use crate::settings::EnginesConfig;

/// One shard of a replica as placed by the leader: which rank it is, on
/// which GPUs and port, and how its ranks find each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardAssignment {
    pub shard_id: String,
    pub replica_id: String,
    /// The catalog name, served as the first `--served-model-name`.
    pub model: String,
    /// Catalog aliases, served as further names.
    pub aliases: Vec<String>,
    /// What the engine loads (a Hugging Face repository or a path).
    pub source: String,
    pub profile: Profile,
    /// 0 is the head: the rank that serves HTTP.
    pub rank: u32,
    /// Physical GPU indices on this node.
    pub gpus: Vec<u32>,
    /// HTTP port of the head; other ranks use it for their health endpoint
    /// where the engine has one.
    pub port: u16,
    /// The head's management address and rendezvous port (multi-node only).
    pub head_addr: String,
    pub rendezvous_port: u16,
    /// The fabric the replica spans and this node's HCAs on it.
    pub fabric: Option<FabricAssignment>,
    /// Where the head engine publishes its KV events; none: it does not.
    pub kv_events: Option<KvEventSockets>,
    /// Launched able to sleep (vLLM sleep mode, single-node only).
    pub sleep_mode: bool,
}

/// The ports of a head engine's KV event publisher, bound on every
/// interface of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventSockets {
    pub stream: u16,
    pub replay: u16,
}

impl KvEventSockets {
    /// `--kv-events-config` as all three engine versions accept it: vLLM
    /// 0.11 needs both `enable_kv_cache_events` and the `zmq` publisher,
    /// SGLang only the publisher, and vLLM 0.34 refuses keys it does not
    /// know. `*` makes the engine bind (an address would make it connect).
    pub fn config_json(&self) -> String {
        format!(
            r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{}","replay_endpoint":"tcp://*:{}","topic":""}}"#,
            self.stream, self.replay
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricAssignment {
    pub name: String,
    pub hcas: Vec<String>,
}

/// What the adapter knows of the node it launches on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeContext {
    pub mgmt_addr: String,
    pub mgmt_interface: Option<String>,
    pub engines: EnginesConfig,
}

/// The processes to start for one shard and how to tell when it is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaunchPlan {
    /// Started in order, each in its own process group.
    pub processes: Vec<ProcessSpec>,
    pub readiness: Readiness,
    /// The port this shard answers HTTP on, if any.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessSpec {
    /// What this process is in the shard, e.g. `engine`, `ray-head`.
    pub role: ProcessRole,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Variables set on top of the agent's own environment.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessRole {
    Engine,
    RayHead,
    RayWorker,
}

/// How the supervisor decides a shard is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
pub enum Readiness {
    /// vLLM: connections are refused while loading, then `GET /health` is 200.
    VllmHealth { url: String },
    /// SGLang head: refused while loading, 503 during warm-up, then 200.
    SglangHealth { url: String },
    /// A rank with no meaningful HTTP endpoint (vLLM `--headless`, a Ray
    /// worker, an SGLang rank whose dummy health server always says 200):
    /// ready while its processes live; the head's health covers the replica.
    ProcessAlive,
}

impl ProcessSpec {
    /// The command line as one shell-like string, for logs and golden files.
    pub fn command_line(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }
}
