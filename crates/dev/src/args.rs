use std::path::PathBuf;

use clap::Args;

/// Run a whole llmgw cluster locally, on 127.0.0.1.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Simulated GPU nodes (agents) to start. Only 0 is supported so far (the
    /// leader's agent service is not built yet): the control plane alone.
    #[arg(long, default_value_t = 0)]
    pub nodes: u32,
    /// Where configs, data, logs and dev.json go.
    #[arg(long, default_value = "llmgw-dev")]
    pub work_dir: PathBuf,
    /// Control-plane peers to start.
    #[arg(long, default_value_t = 3)]
    pub peers: u64,
    /// Plaintext gRPC between the processes (`insecure: true`). By default
    /// every gRPC link is mTLS with a CA made in `<work-dir>/tls`.
    #[arg(long)]
    pub insecure: bool,
    /// Seconds to wait for the cluster to elect a leader before giving up.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_s: u64,
}
