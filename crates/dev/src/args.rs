use std::path::PathBuf;

use clap::Args;

/// Run a whole llmgw cluster locally, on 127.0.0.1: control-plane peers,
/// simulated GPU nodes with simulated engines, a demo catalog and a router.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Simulated GPU nodes (agents with fixture inventories). The first two
    /// are 8-GPU H100 nodes on fabric ib-a, the third a 4-GPU L40S node
    /// without a fabric; more alternate A100 (fabric roce-b) and H100 nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Where configs, data, logs and dev.json go.
    #[arg(long, default_value = "llmgw-dev")]
    pub work_dir: PathBuf,
    /// Control-plane peers to start.
    #[arg(long, default_value_t = 3)]
    pub peers: u64,
    /// The router's port on 127.0.0.1 (the OpenAI base URL).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Start with an empty catalog instead of the demo models.
    #[arg(long)]
    pub no_demo: bool,
    /// Plaintext gRPC between the processes (`insecure: true`). By default
    /// every gRPC link is mTLS with a CA made in `<work-dir>/tls`.
    #[arg(long)]
    pub insecure: bool,
    /// Seconds to wait for a leader, the nodes and the demo replicas.
    #[arg(long, default_value_t = 180)]
    pub ready_timeout_s: u64,
}
