//! The records the control plane replicates. Every map is a `BTreeMap` so the
//! serialized form, and therefore the state hash, is canonical.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Everything replicated through Raft.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetState {
    /// GPU nodes by node id.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// The model catalog by model name.
    pub models: BTreeMap<String, ModelRecord>,
    /// Replicas by replica id.
    pub replicas: BTreeMap<String, Replica>,
    /// Drain operations by node id; at most one per node.
    pub drains: BTreeMap<String, Drain>,
    /// Raft peer ids that were removed from the cluster. They are never
    /// admitted again: a returning peer with an old log under a reused id
    /// could vote with state the cluster has forgotten.
    pub removed_peers: BTreeSet<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Ready,
    Unreachable,
    Lost,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Unreachable => "unreachable",
            NodeStatus::Lost => "lost",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    /// Indices of the GPUs this one reaches over NVLink.
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
}

/// What an agent reported about its hardware at registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub hostname: String,
    pub gpus: Vec<Gpu>,
    /// Engines the agent can launch (`vllm`, `sglang`).
    #[serde(default)]
    pub engines: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    pub mgmt_addr: String,
    pub inventory: NodeInventory,
    /// Fabric names (e.g. InfiniBand islands) from the agent's explicit labels.
    pub fabrics: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub status: NodeStatus,
    pub cordoned: bool,
    pub draining: bool,
    pub registered_at_ms: u64,
    pub status_changed_at_ms: u64,
}

/// One catalog entry. The spec is the entry exactly as the operator wrote it
/// in models.yaml (validated before it was proposed); keeping it as a JSON
/// value lets a peer replicate catalog fields newer than its own build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub name: String,
    pub spec: serde_json::Value,
    pub desired_replicas: u32,
    pub updated_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    Pending,
    Starting,
    Running,
    Draining,
    Stopped,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFailure {
    pub message: String,
    /// The last lines the engine printed before it failed.
    pub output_tail: Vec<String>,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub node: String,
    pub gpus: Vec<u32>,
    pub port: u16,
    pub rank: u32,
    pub state: ShardState,
    pub pid: Option<u32>,
    pub last_failure: Option<ShardFailure>,
    pub state_changed_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Some shard is not running yet.
    Starting,
    /// Every shard is running.
    Running,
    /// Some shard failed.
    Failed,
    /// Being drained or stopped.
    Stopping,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub id: String,
    pub model: String,
    pub profile: String,
    pub shards: Vec<Shard>,
    pub created_at_ms: u64,
}

impl Replica {
    /// The replica's state, derived from its shards so it can never disagree
    /// with them.
    pub fn state(&self) -> ReplicaState {
        let states = self.shards.iter().map(|s| s.state);
        let mut any_failed = false;
        let mut any_stopping = false;
        let mut all_running = true;
        for state in states {
            match state {
                ShardState::Failed => any_failed = true,
                ShardState::Draining | ShardState::Stopped => any_stopping = true,
                ShardState::Running => {}
                ShardState::Pending | ShardState::Starting => all_running = false,
            }
            if state != ShardState::Running {
                all_running = false;
            }
        }
        if any_failed {
            ReplicaState::Failed
        } else if any_stopping {
            ReplicaState::Stopping
        } else if all_running && !self.shards.is_empty() {
            ReplicaState::Running
        } else {
            ReplicaState::Starting
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub node: String,
    pub started_at_ms: u64,
    /// When in-flight requests stop being waited for.
    pub deadline_ms: u64,
}
