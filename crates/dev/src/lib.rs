//! `llmgw dev`: a local cluster in one command. It re-executes its own
//! binary as `llmgw server --config ...` for each of three peers on
//! 127.0.0.1 with free ports, writes their configs and `dev.json` into the
//! work directory, and stops everything it started on SIGINT or SIGTERM.
//! Every gRPC link is mTLS with a development CA in `<work-dir>/tls`
//! ([`certs`]) unless `--insecure` is given.

mod args;
pub mod certs;
mod layout;
mod run;

pub use args::DevArgs;
pub use layout::{DevFile, DevProcess, PeerLayout, plan_peers, server_yaml, server_yaml_tls};
pub use run::{DevError, run_dev};
