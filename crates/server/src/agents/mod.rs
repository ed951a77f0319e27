//! Agents and the control plane (design sections 5 and 6): the
//! `AgentService` every peer serves, the leader's live sessions and the
//! commands sent on them ([`Hub`]), shard statuses written to Raft, and
//! node liveness.

mod hub;
mod liveness;
mod rate;
mod registrar;
mod reports;
mod service;

pub use hub::Hub;
pub use liveness::{LivenessSettings, next_status, run_liveness};
pub use llmgw_agent_wire::{NodeFacts, check_node_id, failure, node_facts, shard_state};
pub use rate::{AGENT_MESSAGE_BURST, AGENT_MESSAGES_PER_SECOND};
pub use registrar::Registrar;
pub use reports::write_reports;
pub use service::{AgentStreams, Report};
