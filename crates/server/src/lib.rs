//! `llmgw server`: one control-plane peer. It runs the Raft node over its
//! RocksDB store, the peer transport on its gRPC listener, and the admin
//! HTTP API (cluster, nodes, replicas, models; health and metrics).
//!
//! The CLI calls [`run_server`] with [`ServerArgs`]; tests and `llmgw dev`
//! start the real binary.

mod api;
mod args;
mod auth;
mod security;

mod model_spec;
mod serve;

pub use api::{ApiState, router};
pub use args::{ServerArgs, options_from, run_server};
pub use auth::AdminAuth;
pub use security::Security;

pub use serve::{ServerError, ServerOptions, serve, shutdown_signal};
