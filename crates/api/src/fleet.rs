//! Nodes, replicas and why a model's replicas are where they are.

use llmgw_scheduler::Explanation;
use llmgw_state::{NodeRecord, Replica, ReplicaFailure, ReplicaState, ScaleDecision, ShardState};
use serde::{Deserialize, Serialize};

/// One entry of `GET /api/v1/nodes`, and `GET /api/v1/nodes/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    #[serde(flatten)]
    pub record: NodeRecord,
    pub gpus_total: usize,
    /// GPUs held by shards that are not stopped.
    pub gpus_used: usize,
    pub shards: Vec<NodeShard>,
    /// The agent's stream as this peer sees it: only the leader holds
    /// streams, so followers answer `null`.
    pub stream: Option<LinkView>,
}

/// One shard as a node's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShard {
    pub shard: String,
    pub replica: String,
    pub model: String,
    pub gpus: Vec<u32>,
    pub port: u16,
    pub state: ShardState,
}

/// A node's agent stream on the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkView {
    pub connected: bool,
    pub last_heartbeat_ms_ago: Option<u64>,
    pub connected_for_ms: Option<u64>,
    /// The latest commands the agent refused, oldest first.
    pub refusals: Vec<Refusal>,
    /// GPUs the agent reports held by processes that outlived SIGKILL:
    /// nothing is placed on them until they exit.
    #[serde(default)]
    pub survivor_gpus: Vec<u32>,
}

/// A command the agent refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub command_id: u64,
    pub message: String,
    pub at_ms: u64,
}

/// One entry of `GET /api/v1/replicas`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub state: ReplicaState,
    /// The head shard's HTTP address, where the router sends requests.
    pub endpoint: Option<String>,
    /// Where the head engine publishes its KV events, for routers' prefix
    /// indexes; absent when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventsView>,
    /// The leader wants it asleep (vLLM sleep mode): routers send it
    /// nothing new, though it may still report ready for a moment.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wanted_asleep: bool,
    #[serde(flatten)]
    pub replica: Replica,
}

/// A head engine's KV event sockets, as `host:port`: those of its first
/// data-parallel rank; rank `r` listens on each port plus `r`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventsView {
    /// The PUB socket streaming every batch.
    pub stream: String,
    /// The ROUTER socket replaying recent batches from a seq.
    pub replay: String,
    /// Data-parallel ranks publishing; absent when 1.
    #[serde(default = "one_rank", skip_serializing_if = "is_one_rank")]
    pub ranks: u16,
}

fn one_rank() -> u16 {
    1
}

fn is_one_rank(ranks: &u16) -> bool {
    *ranks == 1
}

/// `POST /api/v1/nodes/{id}/drain?deadline_s=N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainQuery {
    /// Seconds in-flight requests get before shards are stopped anyway.
    #[serde(default = "DrainQuery::default_deadline_s")]
    pub deadline_s: u64,
}

impl DrainQuery {
    pub const DEFAULT_DEADLINE_S: u64 = 300;

    fn default_deadline_s() -> u64 {
        Self::DEFAULT_DEADLINE_S
    }
}

impl Default for DrainQuery {
    fn default() -> Self {
        DrainQuery {
            deadline_s: Self::DEFAULT_DEADLINE_S,
        }
    }
}

/// `GET /api/v1/models/{name}/explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelExplanation {
    pub model: String,
    pub desired: u32,
    pub replicas: Vec<ReplicaWhy>,
    /// Desired replicas with no placement.
    pub pending: u32,
    /// Why a pending replica does not fit, as operators read it.
    pub explanation: Option<String>,
    /// The same, with a count per reason for every profile tried.
    pub detail: Option<Explanation>,
    pub last_failure: Option<ReplicaFailure>,
    /// For an autoscaled model: its bounds and target, and why it wants
    /// `desired` replicas now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<String>,
    /// The autoscaler's last change, with the load it saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<ScaleDecision>,
}

/// Why one replica is where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaWhy {
    pub id: String,
    pub state: ReplicaState,
    pub why: String,
}
