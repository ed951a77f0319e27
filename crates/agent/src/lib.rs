//! The llmgw agent: one per GPU node.
//!
//! It validates every shard before launching anything ([`validate`]), runs
//! each engine process in its own session with its output in a file under
//! `work_dir` ([`Supervisor`]), reports every transition as a `ShardStatus`,
//! stops with SIGTERM then SIGKILL, drains by watching the engine's own
//! request gauges, and keeps one state file per shard so that a restarted
//! agent adopts the engines still running instead of starting or killing
//! them. [`StreamClient`] holds the control-plane stream: redirects,
//! jittered reconnects, heartbeats, and fencing by leader term. See
//! docs/agent.md.

mod client;
mod durable;
mod fencing;
mod instance;
mod logfile;
mod probe;
mod process;
mod register;
mod report;
mod run;
mod shard;
mod spec;
mod statefile;
mod supervisor;
mod validate;
mod witness;

pub use client::{StreamClient, backoff};
pub use fencing::{Leadership, TermCheck, TermStore};
pub use llmgw_procfs::{group_members, is_same_process, stat as proc_stat};
pub use probe::requests_in_flight;
pub use register::register as registration;
pub use run::{AgentArgs, AgentError, main, run};
pub use spec::{LaunchSpec, SpecError, check_shard_id};
pub use statefile::{ShardRecord, read_all as read_state_files, shards_dir};
pub use supervisor::{Adoption, Outcome, Supervisor, SupervisorError, logs_dir};
pub use validate::{Held, NodeFacts, Refusal, validate};
pub use witness::Witness;
