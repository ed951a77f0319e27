//! How llmgw launches vLLM and SGLang.
//!
//! [`plan_shard`] is a pure function from a [`ShardAssignment`] (what the
//! leader placed) and a [`NodeContext`] (what this node is) to a
//! [`LaunchPlan`]: the exact processes, arguments and environment the engine
//! documents, and the rule that tells when the shard is ready. The agent's
//! supervisor runs plans; nothing here touches a process or the network, so
//! every command line is checked against golden files in-process.

mod adapters;
mod plan;
mod settings;

pub use adapters::{PlanError, plan_shard};
pub use plan::{
    FabricAssignment, KvEventSockets, LaunchPlan, NodeContext, ProcessRole, ProcessSpec, Readiness,
    ShardAssignment,
};
pub use settings::{EnginesConfig, SglangConfig, VLLM_MP_MIN_VERSION, VllmConfig};
