//! llmgw's configuration files: `server.yaml`, `agent.yaml` and
//! `router.yaml` (the model catalog lives in `llmgw-catalog`).
//!
//! Each type is decoded with `llmgw-yaml`, so a file is either valid as a
//! whole or refused with every problem at once, each naming file, line,
//! column and field path. Defaults are written next to the fields they fill
//! and documented in docs/configuration.md. Relative paths inside a file are
//! resolved against the file's folder.

mod admin;
mod agent;
mod check;
mod common;
mod kind;
mod router;
mod server;

pub use admin::{AdminConfig, AdminRole, AdminToken, MIN_TOKEN_CHARS, Secret, TokenSource};
pub use agent::{AgentConfig, DiscoveryConfig, FabricConfig, SupervisorConfig};
pub use check::{CheckReport, check_file, check_text};
pub use common::{ConfigError, TlsConfig, check_host_port, grpc_authority};
pub use kind::FileKind;
pub use router::{
    ApiKey, BalancePolicy, Balancing, Ejection, Resume, RouterConfig, RouterTimeouts, ScaleFromZero,
};
pub use server::{InitialClusterState, LivenessConfig, PeerConfig, RaftTiming, ServerConfig};
