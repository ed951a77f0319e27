//! `llmgw dev`: a local cluster in one command. It re-executes its own
//! binary as `llmgw server --config ...` for each of three peers on
//! 127.0.0.1 with free ports, writes their configs and `dev.json` into the
//! work directory, and stops everything it started on SIGINT or SIGTERM.

mod args;
mod layout;
mod run;

pub use args::DevArgs;
pub use layout::{DevFile, DevProcess, PeerLayout, plan_peers, server_yaml};
pub use run::{DevError, run_dev};
