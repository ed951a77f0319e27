//! `llmgw dev`: a local cluster in one command. It re-executes its own
//! binary as `llmgw server` for each of three peers on 127.0.0.1 with free
//! ports, `llmgw agent` for each simulated GPU node (fixture inventories,
//! `llmgw-engine-sim` as the engine), and `llmgw router` on the OpenAI
//! port; seeds a demo catalog; shows progress until the demo models serve;
//! writes every config and `dev.json` into the work directory; and stops
//! everything it started, engines included, on SIGINT or SIGTERM. Every
//! gRPC link is mTLS with a development CA in `<work-dir>/tls` ([`certs`]),
//! and the admin API is HTTPS with the peers' certificates, unless
//! `--insecure` is given; the admin API takes a read and a write token made
//! for the work directory ([`AdminAccess`]).

mod access;
mod args;
pub mod certs;
mod demo;
mod layout;
mod nodes;
mod progress;
mod run;

pub use access::AdminAccess;
pub use args::DevArgs;
pub use demo::demo_catalog;
pub use layout::{DevFile, DevProcess, PeerLayout, plan_peers, server_yaml, server_yaml_tls};
pub use nodes::{
    A100_ROCE_B, AgentLayout, H100_IB_A, L40S_PCIE, NodeKind, SimEngines, agent_yaml,
    agent_yaml_tls,
};
pub use run::{DevError, engine_groups, run_dev};
