//! The admin API's contract. The server builds these types and serializes
//! them; `llmgw ctl`, `llmgw dev`, the router's control-plane watcher, the
//! chaos suite and the tests deserialize the same types, so a field renamed
//! on one side fails to compile on the other instead of reading as absent.
//!
//! Records that are replicated state (`NodeRecord`, `Replica`, catalog
//! entries) keep their own shapes and appear here flattened into views.

mod backup;
mod cluster;
mod error;
mod fleet;
mod health;
pub mod keys;
mod load;
pub mod paths;
mod rollout;
pub mod usage;

pub use backup::{BackupLeaderId, BackupLogId, BackupSummary};
pub use cluster::{AddPeer, ClusterView, Membership, PeerAdded, PeerRemoved, PeerRole, PeerView};
pub use error::{ErrorBody, ErrorDetail};
pub use fleet::{
    DrainQuery, KvEventsView, LinkView, ModelExplanation, NodeShard, NodeView, Refusal,
    ReplicaView, ReplicaWhy,
};
pub use health::{Readiness, StateEvent};
pub use llmgw_node_id::check_node_id;
pub use load::{LoadSampleView, LoadTargets, ModelLoad, ScaleMark};
pub use rollout::{RolloutPhase, RolloutReplica, RolloutView};

pub use llmgw_catalog::{Model, RolloutPolicy};
pub use llmgw_scheduler::Explanation;
pub use llmgw_state::{
    LinkKind, NodeRecord, NodeStatus, Replica, ReplicaFailure, ReplicaState, Rollout, Shard,
    ShardState,
};
