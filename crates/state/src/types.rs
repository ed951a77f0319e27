//! The records the control plane replicates. Every map is a `BTreeMap` so the
//! serialized form, and therefore the state hash, is canonical.

use std::collections::{BTreeMap, BTreeSet};

use llmgw_topology::LinkKind;
use serde::{Deserialize, Serialize};

use crate::model_spec::ModelSpec;

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
    /// Whether a [`Command::SeedCatalog`](crate::Command::SeedCatalog)
    /// applied. Left out of the encoding while false, so the snapshots and
    /// hashes of clusters from before it keep their bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub catalog_seeded: bool,
    /// API keys by name, revoked ones included (a revoked key is refused
    /// by name, and its name stays taken until it is created again). Left
    /// out of the encoding while empty, like `catalog_seeded`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub api_keys: BTreeMap<String, crate::keys::ApiKeyRecord>,
    /// What keys used, per key, model and minute. Left out while empty.
    #[serde(default, skip_serializing_if = "crate::usage::Usage::is_empty")]
    pub usage: crate::usage::Usage,
    /// Which cluster this is and which epoch of it; `None` until the first
    /// leader of a cluster formed before identities begins one. Left out
    /// while `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::identity::ClusterIdentity>,
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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pci_bus_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    pub a: u32,
    pub b: u32,
    pub kind: LinkKind,
    /// Bonded NVLinks when `kind` is `nvlink`.
    #[serde(default)]
    pub nvlinks: u32,
}

/// One InfiniBand or RoCE port the agent found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HcaPort {
    pub name: String,
    pub port: u32,
    pub state: String,
    pub rate_gbps: u32,
    pub link_layer: String,
}

/// A fabric named in agent.yaml, checked against what discovery found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricReport {
    pub name: String,
    pub hcas: Vec<String>,
    pub active_hcas: Vec<String>,
    /// Configured HCAs that are missing or down, with the reason.
    #[serde(default)]
    pub problems: Vec<String>,
}

/// What an agent reported about its hardware at registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub hostname: String,
    pub gpus: Vec<Gpu>,
    /// Engines the agent can launch (`vllm`, `sglang`).
    #[serde(default)]
    pub engines: Vec<String>,
    /// Where the GPU facts came from: `nvml`, `nvidia-smi`, `fixture`, `none`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu_source: String,
    /// Every GPU pair's link; absent pairs are `sys`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<GpuLink>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hcas: Vec<HcaPort>,
    /// Every configured fabric, including those with no active HCA.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fabric_reports: Vec<FabricReport>,
    /// Problems discovery found (a configured HCA missing or down, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent_version: String,
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
    /// Counts this node's status changes (registrations included). A
    /// liveness decision names the version it was judged from and is
    /// refused if the node changed since, so a verdict on an old view
    /// never overwrites a newer fact.
    #[serde(default)]
    pub status_version: u64,
}

/// One catalog entry: the entry as the operator wrote it in models.yaml
/// (validated before it was proposed) and the model it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub name: String,
    pub spec: ModelSpec,
    pub desired_replicas: u32,
    pub updated_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<ReplicaFailure>,
    /// The entry before the last change engines see: what a rollback
    /// restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<ModelSpec>,
    /// The last rolling update: kept after it finished, so `ctl models
    /// status` can say how it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The autoscaler's last change to `desired_replicas`, with what it
    /// saw: why the model has the replicas it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<ScaleDecision>,
    /// Since when the model's replicas are wanted asleep (vLLM sleep mode,
    /// `autoscale.sleep_after`); none while they are wanted awake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asleep_since_ms: Option<u64>,
    /// When a request last woke the model from sleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken_at_ms: Option<u64>,
}

/// One change of a model's replica count by the leader's autoscaler, and
/// the load that decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleDecision {
    pub from: u32,
    pub to: u32,
    /// The fewest and the most requests (running plus waiting) the model's
    /// engines held over the window.
    pub requests_low: u32,
    pub requests_high: u32,
    pub ready_replicas: u32,
    pub target_per_replica: u32,
    /// How long the change was wanted before it was made.
    pub window_ms: u64,
    pub at_ms: u64,
    /// A request arrived for the model scaled to zero (the load fields are
    /// then unused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub woken_by_request: bool,
    /// The model gave a replica's GPUs to this one, of higher priority,
    /// which could not place a replica it wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yielded_to: Option<String>,
    /// The signal above its target that made the model grow, when it was
    /// that and not its request count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above_target: Option<SignalSeen>,
    /// Every ready replica had its `max_requests_per_replica` through the
    /// window, and more may have waited at the routers: the engines' count
    /// was only the least the demand could be, so the model grew by at
    /// least one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub saturated: bool,
    /// Shrunk after a grow window rather than a shrink window, since
    /// another model waited for GPUs that none was free for.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released_for_waiting: bool,
}

/// A signal besides the request count that the autoscaler holds a model's
/// engines to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleSignal {
    /// From a request's arrival to its first token (p90, ms).
    TimeToFirstToken,
    /// From a request's arrival to the engine scheduling it (p90, ms).
    QueueWait,
    /// The KV cache used on the fullest engine (percent).
    KvCacheUsage,
}

impl ScaleSignal {
    /// What it is, as an operator reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleSignal::TimeToFirstToken => "time to first token (p90)",
            ScaleSignal::QueueWait => "queue wait (p90)",
            ScaleSignal::KvCacheUsage => "KV cache usage (fullest engine)",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            ScaleSignal::TimeToFirstToken | ScaleSignal::QueueWait => "ms",
            ScaleSignal::KvCacheUsage => "%",
        }
    }
}

/// A signal over an autoscaling window, against the model's target for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSeen {
    pub signal: ScaleSignal,
    /// The lowest and the highest value of the window's samples, in the
    /// signal's unit.
    pub low: u32,
    pub high: u32,
    pub target: u32,
}

impl ScaleDecision {
    /// The decision as an operator reads it.
    pub fn reason(&self) -> String {
        if self.woken_by_request {
            return format!(
                "{} -> {} replicas: a request arrived for the model scaled to zero",
                self.from, self.to
            );
        }
        if let Some(to) = &self.yielded_to {
            return format!(
                "{} -> {} replicas: gave a replica's GPUs to model {to}, of higher priority, which had no room for a replica it wanted",
                self.from, self.to
            );
        }
        let held = if self.requests_low == self.requests_high {
            format!("{}", self.requests_low)
        } else {
            format!("{} to {}", self.requests_low, self.requests_high)
        };
        if let Some(seen) = &self.above_target {
            let unit = seen.signal.unit();
            return format!(
                "{} -> {} replicas: the {} was {} to {} {unit}, above the {} {unit} target, for {}s (the engines held {held} requests on {} ready replica(s), sized for {} a replica)",
                self.from,
                self.to,
                seen.signal.as_str(),
                seen.low,
                seen.high,
                seen.target,
                self.window_ms / 1000,
                self.ready_replicas,
                self.target_per_replica
            );
        }
        let why = if self.saturated {
            ", and every ready replica had as many as the routers send one, the rest waiting there"
        } else if self.released_for_waiting {
            "; shrunk after the grow window, not the shrink window, since another model waited for GPUs"
        } else {
            ""
        };
        format!(
            "{} -> {} replicas: the engines held {held} requests (running and waiting) on {} ready replica(s) for {}s, sized for {} a replica{why}",
            self.from,
            self.to,
            self.ready_replicas,
            self.window_ms / 1000,
            self.target_per_replica
        )
    }
}

/// A change to a model's launch spec being rolled onto its replicas. Its
/// progress is read off the replicas (which fingerprint each runs); what
/// only history knows is kept here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// The launch fingerprint replicas are being moved to.
    pub to: String,
    /// The fingerprint they ran before.
    pub from: String,
    pub started_at_ms: u64,
    /// When every replica ran `to` and was ready; none while in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at_ms: Option<u64>,
    /// New replicas that failed during this rollout.
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// Why this rollout restores an earlier entry (an operator's rollback
    /// or too many failures); none for a change an operator put. A
    /// rollback is never rolled back on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    /// Placed; the agent has not reported it yet.
    Pending,
    Starting,
    /// The engine runs and loads weights; not serving yet.
    Loading,
    /// Serving (health answers, every rank joined).
    #[serde(alias = "running")]
    Ready,
    Draining,
    Stopped,
    Failed,
    /// Ready, then put to sleep (vLLM sleep mode): it holds its GPUs and
    /// serves nothing until woken.
    Sleeping,
}

impl ShardState {
    pub fn as_str(self) -> &'static str {
        match self {
            ShardState::Pending => "pending",
            ShardState::Starting => "starting",
            ShardState::Loading => "loading",
            ShardState::Ready => "ready",
            ShardState::Draining => "draining",
            ShardState::Stopped => "stopped",
            ShardState::Failed => "failed",
            ShardState::Sleeping => "sleeping",
        }
    }
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
    /// The `seq` of the agent report the state came from; a report with a
    /// lower or equal one is stale and refused. 0: none yet.
    #[serde(default)]
    pub report_seq: u64,
}

/// A replica's state, derived from its shards and its stop order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Placed on GPUs; no agent has started a shard yet.
    Placed,
    Starting,
    Loading,
    /// Every shard is ready: the head serves.
    Ready,
    /// Ordered to drain: no new requests, in-flight ones finish.
    Draining,
    /// Ordered to stop; some shard still runs.
    Stopping,
    /// Every shard stopped.
    Stopped,
    /// Some shard failed; the whole replica is restarted.
    Failed,
    /// Every shard asleep (vLLM sleep mode): routers send it nothing; a
    /// request for the model wakes it.
    Sleeping,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Placed => "placed",
            ReplicaState::Starting => "starting",
            ReplicaState::Loading => "loading",
            ReplicaState::Ready => "ready",
            ReplicaState::Draining => "draining",
            ReplicaState::Stopping => "stopping",
            ReplicaState::Stopped => "stopped",
            ReplicaState::Failed => "failed",
            ReplicaState::Sleeping => "sleeping",
        }
    }

    /// Loaded and serving, or asleep and woken in seconds: a replica a
    /// drain or a rollout may count on.
    pub fn is_up(self) -> bool {
        matches!(self, ReplicaState::Ready | ReplicaState::Sleeping)
    }
}

/// The leader's order to take a replica away, replicated so that a new
/// leader carries it on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopOrder {
    pub reason: String,
    /// Drain first: in-flight requests get until this time.
    pub drain_deadline_ms: Option<u64>,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub id: String,
    pub model: String,
    pub profile: String,
    pub shards: Vec<Shard>,
    pub created_at_ms: u64,
    /// The fabric a multi-node replica's ranks share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    /// Rank 0's rendezvous port, for multi-node replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_port: Option<u16>,
    /// The replica this one replaces (make-before-break during a drain or
    /// a rolling update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// The launch fingerprint of the catalog entry this replica was placed
    /// from ([`ModelSpec::launch_fingerprint`]); none on a replica placed
    /// before fingerprints, which counts as current until its model's
    /// launch spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_fingerprint: Option<String>,
    /// The names the engine was launched to serve (`--served-model-name`);
    /// none on a replica placed before they were recorded (the model's
    /// names at the time). The router maps a newer alias to the model's
    /// name for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_names: Option<Vec<String>>,
    /// Where the head engine publishes its KV events, on the head's host;
    /// none on a replica placed before llmgw asked engines to publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_event_ports: Option<KvEventPorts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopOrder>,
}

/// The ports a head engine's KV event publishers listen on: each
/// data-parallel rank `r` has its PUB stream on `stream + r` and the ROUTER
/// socket that replays its recent batches on `replay + r`, as the engines
/// offset their configured endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventPorts {
    pub stream: u16,
    pub replay: u16,
    /// Publishing ranks; absent (1) in records from before data parallelism.
    #[serde(default = "one_rank", skip_serializing_if = "is_one_rank")]
    pub ranks: u16,
}

fn one_rank() -> u16 {
    1
}

fn is_one_rank(ranks: &u16) -> bool {
    *ranks == 1
}

impl KvEventPorts {
    /// Every port held, streams then replays; `None` when a rank's port
    /// would pass 65535 or there is no rank.
    pub fn ports(&self) -> Option<Vec<u16>> {
        if self.ranks == 0 {
            return None;
        }
        let last = self.ranks - 1;
        self.stream.checked_add(last)?;
        self.replay.checked_add(last)?;
        Some(
            (0..self.ranks)
                .map(|r| self.stream + r)
                .chain((0..self.ranks).map(|r| self.replay + r))
                .collect(),
        )
    }
}

impl FleetState {
    /// Whether the leader wants the replica's engines asleep (its model in
    /// sleep mode, idle): routers send it nothing new, even before it
    /// reports asleep.
    pub fn wanted_asleep(&self, replica: &Replica) -> bool {
        self.models
            .get(&replica.model)
            .is_some_and(|record| record.asleep_since_ms.is_some())
    }
}

impl Replica {
    /// The shard id agents know a shard by.
    pub fn shard_id(&self, rank: u32) -> String {
        format!("{}-r{rank}", self.id)
    }

    /// The replica's state, derived from its shards so it can never disagree
    /// with them.
    pub fn state(&self) -> ReplicaState {
        let all = |wanted: &[ShardState]| self.shards.iter().all(|s| wanted.contains(&s.state));
        let any = |wanted: ShardState| self.shards.iter().any(|s| s.state == wanted);
        if self.shards.is_empty() || all(&[ShardState::Stopped]) {
            return ReplicaState::Stopped;
        }
        if any(ShardState::Failed) {
            return ReplicaState::Failed;
        }
        if let Some(stop) = &self.stop {
            return if stop.drain_deadline_ms.is_some() && !any(ShardState::Stopped) {
                ReplicaState::Draining
            } else {
                ReplicaState::Stopping
            };
        }
        if any(ShardState::Draining) || any(ShardState::Stopped) {
            return ReplicaState::Stopping;
        }
        if all(&[ShardState::Ready]) {
            ReplicaState::Ready
        } else if all(&[ShardState::Ready, ShardState::Sleeping]) {
            ReplicaState::Sleeping
        } else if all(&[ShardState::Pending]) {
            ReplicaState::Placed
        } else if any(ShardState::Loading) || any(ShardState::Ready) {
            ReplicaState::Loading
        } else {
            ReplicaState::Starting
        }
    }

    /// Whether this replica holds GPU `gpu` on `node`.
    pub fn holds_gpu(&self, node: &str, gpu: u32) -> bool {
        self.shards
            .iter()
            .any(|s| s.node == node && s.state != ShardState::Stopped && s.gpus.contains(&gpu))
    }
}

/// Why a model's last replica was taken away after a failure, kept on the
/// model so `explain` can show it after the replica is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaFailure {
    pub replica: String,
    pub node: String,
    pub failure: ShardFailure,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    pub node: String,
    pub started_at_ms: u64,
    /// When in-flight requests stop being waited for.
    pub deadline_ms: u64,
}
