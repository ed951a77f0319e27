//! `llmgw server`: one control-plane peer. It runs the Raft node over its
//! RocksDB store; on its gRPC listener the peer transport and the agent
//! stream service ([`agents`]); while it leads, node liveness and the
//! reconciler ([`reconcile`]); the admin API, HTTPS with the peer's
//! certificate (cluster, nodes,
//! replicas, models, explain; health and metrics); and optionally an
//! OpenAI router fed from its own applied state ([`routes`]).
//!
//! The CLI calls [`run_server`] with [`ServerArgs`]; tests and `llmgw dev`
//! start the real binary.

mod admin_listener;
pub mod agents;
mod api;
mod args;
mod auth;
mod autoscale;
mod epoch;
mod latency;
mod load_history;
mod security;

mod model_spec;
mod propose;
pub mod reconcile;
mod restore;
pub mod routes;
mod seed;
mod serve;
mod usage;
mod wake;

pub use api::{ApiState, router};
pub use args::{ServerArgs, options_from, run_server};
pub use auth::AdminAuth;
pub use security::Security;

pub use serve::{ServerError, ServerOptions, serve, shutdown_signal};
