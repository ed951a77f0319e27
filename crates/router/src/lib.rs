//! llmgw's OpenAI-compatible router: client traffic goes straight from the
//! router to the engines, never through the control plane.
//!
//! A [`Router`] reads a [`RoutingTable`] (model names and aliases to engine
//! endpoints, each `ready` or `draining`) from any [`EndpointSource`]: a
//! static catalog ([`static_table`]), the control-plane peers' admin API
//! ([`ControlPlaneWatcher`]), or, inside `llmgw server`, a `watch` channel fed
//! from replicated state. It balances on outstanding requests (power of two
//! choices) or prompt-prefix affinity with bounded load, reads engine load
//! from their `/metrics`, retries on another replica before the first byte
//! reaches the client, resumes a stream on another replica when its engine
//! fails mid-answer, ejects failing endpoints and probes them back, and
//! relays streams chunk by chunk. See docs/router.md.

mod auth;
mod balance;
mod cli;
mod control_plane;
mod endpoints;
mod engine_load;
mod error;
mod framing;
mod front;
/// Public for the fuzz targets (`crates/fuzz-targets`).
#[doc(hidden)]
pub mod fuzzing;
mod keys;
mod kv;
mod limits;
mod metrics;
mod openai;
mod peek;
mod probes;
mod proxy;
mod queue;
mod relay;
mod resume;
mod serve;
mod service;
mod settings;
mod sse;
mod table;
mod upstream;
mod usage;
mod wake;

/// Public for `examples/key-cost.rs`, which measures a key check.
#[doc(hidden)]
pub use auth::authenticate;
pub use cli::{RouterArgs, run_cli};
pub use control_plane::{ControlPlaneAccess, ControlPlaneWatcher};
pub use endpoints::EngineLoad;
pub use engine_load::parse_engine_load;
pub use error::RouterError;
pub use keys::{Grant, KeyRing};
/// The models a router tokenizes itself (`balancing.tokenizers`).
pub use kv::LocalTokenizers;
/// Public for `examples/kv-decision-cost.rs`, which measures a lookup.
#[doc(hidden)]
pub use kv::index::PrefixIndex;
#[doc(hidden)]
pub use limits::Limiter;
/// Where an endpoint's engine publishes its KV events.
pub use llmgw_kv_events::Endpoints as KvEventEndpoints;
/// Public for `examples/metrics-cost.rs`, which measures its hot path.
pub use metrics::Metrics;
pub use peek::{PeekError, Peeked, peek, prefix};
pub use resume::ResumeSettings;
pub use serve::{Router, RunningRouter};
pub use settings::{KeyGrant, Settings};
pub use table::{Endpoint, EndpointSource, EndpointState, RoutedModel, RoutingTable, static_table};
#[doc(hidden)]
pub use usage::UsageLedger;
pub use usage::{REPORT_EVERY as USAGE_REPORT_EVERY, UsageSink, reporter_name};
pub use wake::ModelWaker;
