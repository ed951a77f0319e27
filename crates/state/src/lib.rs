//! The replicated state of the llmgw control plane (design section 4) and the
//! only way to change it: a [`Command`] applied by [`FleetState::apply`].
//!
//! Everything here is pure. `apply` reads no clock and no randomness: the
//! time of a change travels inside the command, so every peer that applies the
//! same log reaches the same state, which [`FleetState::hash`] lets operators
//! and tests compare across peers.

mod apply;
mod command;
mod hash;
mod holders;
mod identity;
mod keys;
mod model_spec;
mod ports;
mod types;
mod usage;

pub use command::{Command, Leadership, Outcome, Rejection, RejectionKind, SeedModel};
pub use hash::StateHash;
pub use identity::ClusterIdentity;
pub use keys::{ApiKeyRecord, KeyLimits, KeySettings, check_key_name};
pub use llmgw_node_id::check_cluster_id;
pub use llmgw_topology::LinkKind;
pub use model_spec::ModelSpec;
pub use ports::mgmt_host;
pub use types::{
    Drain, FabricReport, FleetState, Gpu, GpuLink, HcaPort, KvEventPorts, ModelRecord,
    NodeInventory, NodeRecord, NodeStatus, Replica, ReplicaFailure, ReplicaState, Rollout,
    ScaleDecision, ScaleSignal, Shard, ShardFailure, ShardState, SignalSeen, StopOrder,
};
pub use usage::{
    Demand, KeySpend, LastReport, MAX_USAGE_ROWS, Usage, UsageRow, UsageTotals, civil_from_days,
    days_from_civil,
};
