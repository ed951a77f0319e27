//! The commands that change [`FleetState`](crate::FleetState), and what
//! applying one produced.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::keys::{ApiKeyRecord, KeySettings};
use crate::model_spec::ModelSpec;
use crate::types::{
    KvEventPorts, NodeInventory, NodeStatus, ReplicaFailure, ScaleDecision, Shard, ShardFailure,
    ShardState,
};
use crate::usage::UsageRow;

/// A change to the replicated state, as it travels in the Raft log.
///
/// **Append only.** Variants are only ever added at the end, and an existing
/// variant's fields never change meaning. Variants are tagged by name on the
/// wire, and a peer that reads a tag it does not know decodes it as
/// [`Command::Unknown`] and applies it as a no-op, so an older peer keeps
/// replicating the log of a newer leader during a rolling upgrade instead of
/// failing to decode it.
///
/// Every variant carries `at_ms`, the proposer's wall clock in milliseconds:
/// `apply` never reads a clock, so all peers record the same times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// An agent registered (or re-registered with new inventory).
    RegisterNode {
        id: String,
        mgmt_addr: String,
        inventory: NodeInventory,
        fabrics: Vec<String>,
        labels: BTreeMap<String, String>,
        at_ms: u64,
    },
    /// A liveness transition decided by the leader.
    SetNodeStatus {
        id: String,
        status: NodeStatus,
        /// The node's `status_version` the decision was judged from;
        /// refused if the node's status changed since. `None` sets it
        /// unconditionally (an operator's order).
        #[serde(default)]
        based_on: Option<u64>,
        at_ms: u64,
    },
    Cordon {
        id: String,
        at_ms: u64,
    },
    /// Lifts a cordon. Refused while the node drains.
    Uncordon {
        id: String,
        at_ms: u64,
    },
    /// Starts draining a node: it is cordoned and its replicas move away.
    StartDrain {
        id: String,
        deadline_ms: u64,
        at_ms: u64,
    },
    /// The drain finished (every replica moved); the node stays cordoned.
    FinishDrain {
        id: String,
        at_ms: u64,
    },
    /// Adds or replaces a catalog entry.
    PutModel {
        name: String,
        spec: ModelSpec,
        replicas: u32,
        at_ms: u64,
    },
    DeleteModel {
        name: String,
        at_ms: u64,
    },
    /// A placement decided by the leader's scheduler.
    PlaceReplica {
        id: String,
        model: String,
        profile: String,
        shards: Vec<Shard>,
        #[serde(default)]
        fabric: Option<String>,
        #[serde(default)]
        rendezvous_port: Option<u16>,
        /// The replica this one replaces once it is ready (a drain or a
        /// rolling update).
        #[serde(default)]
        replaces: Option<String>,
        /// The launch fingerprint of the catalog entry it was placed from.
        /// Carried in the command, not read from the catalog at apply, so
        /// a log written before fingerprints applies as it always did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spec_fingerprint: Option<String>,
        /// The names its engine is launched to serve.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        served_names: Option<Vec<String>>,
        /// The head engine's KV event ports, held like its other ports.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kv_event_ports: Option<KvEventPorts>,
        at_ms: u64,
    },
    /// An observed shard transition reported by an agent.
    SetShardState {
        replica: String,
        rank: u32,
        state: ShardState,
        pid: Option<u32>,
        failure: Option<ShardFailure>,
        /// The agent's report number for this shard, increasing over the
        /// shard's life; a report not newer than the last applied one is
        /// refused. 0: an unversioned report, always applied.
        #[serde(default)]
        seq: u64,
        at_ms: u64,
    },
    /// Forgets a replica whose shards are all stopped or whose node is
    /// gone. A failure, when given, stays on the model for `explain`.
    RemoveReplica {
        id: String,
        #[serde(default)]
        failure: Option<ReplicaFailure>,
        at_ms: u64,
    },
    /// A Raft peer left the cluster; its id is retired for good.
    RetirePeer {
        peer: u64,
        at_ms: u64,
    },
    /// Orders a replica away: drained first when a deadline is given, then
    /// stopped. Agents are told by the leader; a new leader carries it on.
    StopReplica {
        id: String,
        reason: String,
        drain_deadline_ms: Option<u64>,
        at_ms: u64,
    },
    /// Independent commands proposed together so they share one log entry
    /// (and one synced write). Each applies or is refused on its own, in
    /// order; the batch is not atomic and its own outcome is `Applied`.
    Batch {
        commands: Vec<Command>,
        at_ms: u64,
    },
    /// Decisions the leader of one leadership took from its own view
    /// (liveness, placement, stops, registrations), proposed together. They
    /// apply only from a log entry that same leadership appended: decided
    /// by a leader that has since been superseded (and carried into the log
    /// by another), they are refused whole, deterministically, so a stale
    /// view never changes the fleet. Otherwise applied like a batch.
    Decided {
        leader: Leadership,
        commands: Vec<Command>,
        at_ms: u64,
    },
    /// The catalog configured on the peers that formed the cluster
    /// (server.yaml `catalog`). Applies once per cluster, and only to an
    /// empty catalog, so a seeder may propose it again after any failure
    /// (an ambiguous answer, a lost leader, a restart) without ever
    /// writing it twice or over what an operator put since.
    SeedCatalog {
        models: Vec<SeedModel>,
        at_ms: u64,
    },
    /// Restore the launch spec the model had before its last change (an
    /// operator's `ctl models rollback`, or the leader after too many
    /// failed new replicas): its replicas then roll back.
    RollbackModel {
        name: String,
        reason: String,
        /// The launch fingerprint being rolled back: refused if the model's
        /// changed since, so a rollback decided twice (or after a newer
        /// change) never swaps the specs back. None: whatever runs now.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        at_ms: u64,
    },
    /// Every replica of the model runs `fingerprint` and is ready: its
    /// rollout is complete.
    FinishRollout {
        name: String,
        fingerprint: String,
        at_ms: u64,
    },
    /// The leader's autoscaler changes a model's replica count; refused if
    /// the count is no longer `decision.from` (an operator or another
    /// decision changed it since) or leaves the model's bounds.
    ScaleModel {
        name: String,
        decision: ScaleDecision,
        at_ms: u64,
    },
    /// The leader's autoscaler puts an idle model's replicas to sleep
    /// (`autoscale.sleep_after`). Refused for a model without sleep mode
    /// or wanting no replica; a no-op when it is asleep already.
    SleepModel {
        name: String,
        /// How long no request reached it.
        idle_ms: u64,
        at_ms: u64,
    },
    /// A request arrived for a model scaled to zero, or asleep: it wants
    /// one replica, or its replicas awake. A no-op unless the model
    /// autoscales and wants none now or sleeps, so every router holding a
    /// request may send it.
    WakeModel {
        name: String,
        at_ms: u64,
    },
    /// A new API key (or a new one under a revoked key's name). Refused
    /// while a key of that name is live, or when its digest is another
    /// live key's.
    CreateApiKey {
        key: ApiKeyRecord,
        at_ms: u64,
    },
    /// Replaces a live key's team, models, expiry and limits.
    UpdateApiKey {
        name: String,
        settings: KeySettings,
        at_ms: u64,
    },
    /// A new secret for a live key; the old one is refused from then on.
    RotateApiKey {
        name: String,
        secret_sha256: String,
        secret_prefix: String,
        at_ms: u64,
    },
    /// Refuses the key from then on. Its record stays, so usage and
    /// listings still name it; revoking a revoked key is a no-op.
    RevokeApiKey {
        name: String,
        at_ms: u64,
    },
    /// A router's usage since its last report, added to the per-minute
    /// totals. Refused when `seq` is not past the router's last applied
    /// report (a report sent again counts once). Minutes older than
    /// `retain_minutes` before `at_ms` are dropped, and routers not heard
    /// from in that time forgotten.
    RecordUsage {
        reporter: String,
        seq: u64,
        rows: Vec<UsageRow>,
        retain_minutes: u64,
        /// Requests the router was asked for per key with per-minute
        /// limits (admitted or not) since its previous report.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        demand: BTreeMap<String, u64>,
        /// How long that was, in milliseconds.
        #[serde(default)]
        interval_ms: u64,
        at_ms: u64,
    },
    /// A leader begins the cluster's epoch: once for a cluster that has
    /// none, and once after each restore (with an epoch past the backup's).
    /// Refused under another cluster id, and when no epoch is due.
    BeginEpoch {
        cluster_id: String,
        epoch: u64,
        at_ms: u64,
    },
    /// A command from a newer llmgw this build does not know; applied as a
    /// no-op. Never proposed by this build.
    #[serde(other)]
    Unknown,
}

impl Command {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::RegisterNode { .. } => "register_node",
            Command::SetNodeStatus { .. } => "set_node_status",
            Command::Cordon { .. } => "cordon",
            Command::Uncordon { .. } => "uncordon",
            Command::StartDrain { .. } => "start_drain",
            Command::FinishDrain { .. } => "finish_drain",
            Command::PutModel { .. } => "put_model",
            Command::DeleteModel { .. } => "delete_model",
            Command::PlaceReplica { .. } => "place_replica",
            Command::SetShardState { .. } => "set_shard_state",
            Command::RemoveReplica { .. } => "remove_replica",
            Command::RetirePeer { .. } => "retire_peer",
            Command::StopReplica { .. } => "stop_replica",
            Command::Batch { .. } => "batch",
            Command::Decided { .. } => "decided",
            Command::SeedCatalog { .. } => "seed_catalog",
            Command::RollbackModel { .. } => "rollback_model",
            Command::FinishRollout { .. } => "finish_rollout",
            Command::ScaleModel { .. } => "scale_model",
            Command::SleepModel { .. } => "sleep_model",
            Command::WakeModel { .. } => "wake_model",
            Command::CreateApiKey { .. } => "create_api_key",
            Command::UpdateApiKey { .. } => "update_api_key",
            Command::RotateApiKey { .. } => "rotate_api_key",
            Command::RevokeApiKey { .. } => "revoke_api_key",
            Command::RecordUsage { .. } => "record_usage",
            Command::BeginEpoch { .. } => "begin_epoch",
            Command::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let subject = match self {
            Command::RegisterNode { id, .. }
            | Command::SetNodeStatus { id, .. }
            | Command::Cordon { id, .. }
            | Command::Uncordon { id, .. }
            | Command::StartDrain { id, .. }
            | Command::FinishDrain { id, .. }
            | Command::PlaceReplica { id, .. }
            | Command::RemoveReplica { id, .. }
            | Command::StopReplica { id, .. } => id.clone(),
            Command::PutModel { name, .. }
            | Command::DeleteModel { name, .. }
            | Command::RollbackModel { name, .. }
            | Command::FinishRollout { name, .. }
            | Command::ScaleModel { name, .. }
            | Command::SleepModel { name, .. }
            | Command::WakeModel { name, .. }
            | Command::UpdateApiKey { name, .. }
            | Command::RotateApiKey { name, .. }
            | Command::RevokeApiKey { name, .. } => name.clone(),
            Command::CreateApiKey { key, .. } => key.name.clone(),
            Command::RecordUsage { reporter, seq, .. } => format!("{reporter}#{seq}"),
            Command::BeginEpoch {
                cluster_id, epoch, ..
            } => format!("{epoch} of {cluster_id}"),
            Command::SetShardState { replica, rank, .. } => format!("{replica}/{rank}"),
            Command::RetirePeer { peer, .. } => peer.to_string(),
            Command::Batch { commands, .. } => format!("of {}", commands.len()),
            Command::Decided {
                leader, commands, ..
            } => format!("of {} by {leader}", commands.len()),
            Command::SeedCatalog { models, .. } => format!("of {} models", models.len()),
            Command::Unknown => return f.write_str("unknown"),
        };
        write!(f, "{} {subject}", self.kind())
    }
}

/// One catalog entry of a [`Command::SeedCatalog`], as [`Command::PutModel`]
/// writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedModel {
    pub name: String,
    pub spec: ModelSpec,
    pub replicas: u32,
}

/// A Raft leadership: the term and the leader's peer id. Raft here may
/// elect more than one leader in a term (a higher peer id wins), so a
/// leadership is the pair, ordered by term and then id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Leadership {
    pub term: u64,
    pub leader: u64,
}

impl std::fmt::Display for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "term {} (leader {})", self.term, self.leader)
    }
}

/// What applying a command did. A rejection is a normal, replicated outcome
/// (every peer rejects the same command the same way), not an error of the
/// log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    Rejected(Rejection),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Rejection {
    pub kind: RejectionKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    /// The command names something that does not exist.
    NotFound,
    /// The command contradicts the current state.
    Conflict,
    /// The command is malformed.
    Invalid,
}

impl Rejection {
    pub(crate) fn not_found(message: impl Into<String>) -> Outcome {
        Outcome::Rejected(Rejection {
            kind: RejectionKind::NotFound,
            message: message.into(),
        })
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Outcome {
        Outcome::Rejected(Rejection {
            kind: RejectionKind::Conflict,
            message: message.into(),
        })
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Outcome {
        Outcome::Rejected(Rejection {
            kind: RejectionKind::Invalid,
            message: message.into(),
        })
    }
}
