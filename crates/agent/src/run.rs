//! `llmgw agent --config agent.yaml`: load the config, discover the node,
//! adopt what an earlier agent left running, and hold the control-plane
//! stream until told to exit. Exiting never stops an engine.

use std::path::PathBuf;
use std::process::ExitCode;

use llmgw_config::AgentConfig;
use llmgw_engines::NodeContext;
use tokio::sync::mpsc;

use crate::client::StreamClient;
use crate::fencing::TermStore;
use crate::supervisor::{Adoption, Supervisor};
use crate::validate::NodeFacts;

/// Command line of `llmgw agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// The agent's config file (see deploy/examples/agent.yaml).
    #[arg(long, short, default_value = "/etc/llmgw/agent.yaml")]
    pub config: PathBuf,
    /// This node's id, instead of the file's `node_id` (a DaemonSet passes
    /// the Kubernetes node name).
    #[arg(long, env = "LLMGW_NODE_ID")]
    pub node_id: Option<String>,
    /// The address engines are reachable on, instead of the file's
    /// `mgmt_addr` (a DaemonSet passes the node's IP).
    #[arg(long, env = "LLMGW_MGMT_ADDR")]
    pub mgmt_addr: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] llmgw_config::ConfigError),
    #[error(transparent)]
    Supervisor(#[from] crate::supervisor::SupervisorError),
    #[error("leader term file in {dir}: {source}")]
    Term {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("tls: {0}")]
    Tls(#[from] llmgw_tls::TlsError),
    #[error(
        "no `tls` section: add `tls` (ca, cert, key; `llmgw certs issue --node ID` makes a \
         development one) or set `insecure: true` to run the stream plaintext"
    )]
    NoTransport,
}

/// The whole program: returns when SIGTERM or SIGINT arrives.
pub fn main(args: AgentArgs) -> ExitCode {
    llmgw_runtime::init_logging("info");
    let result = llmgw_runtime::multi_thread_runtime()
        .map_err(AgentError::Runtime)
        .and_then(|rt| rt.block_on(run_from_file(&args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmgw agent: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run_from_file(args: &AgentArgs) -> Result<(), AgentError> {
    let overrides: Vec<(&str, String)> = [
        ("node_id", args.node_id.clone()),
        ("mgmt_addr", args.mgmt_addr.clone()),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key, value?)))
    .collect();
    let config = AgentConfig::load_with(&args.config, &overrides)?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    run(config).await
}

/// Runs the agent with a loaded config until SIGTERM or SIGINT.
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    // mTLS material first: a node that cannot prove who it is has nothing
    // to do. The certificate must name this node; rotation is picked up by
    // the next connection.
    let tls = match &config.tls {
        Some(files) => {
            let tls = llmgw_tls::Tls::load(
                llmgw_tls::TlsFiles {
                    ca: files.ca.clone(),
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                    crl: files.crl.clone(),
                },
                llmgw_tls::Identity::Node(config.node_id.clone()),
            )?;
            tls.watch(llmgw_tls::RELOAD_INTERVAL);
            Some(tls)
        }
        None if config.insecure => None,
        None => return Err(AgentError::NoTransport),
    };
    let inventory = llmgw_discovery::discover(&config.discovery, &config.fabrics);
    for warning in &inventory.warnings {
        tracing::warn!("discovery: {warning}");
    }
    tracing::info!(
        node = %config.node_id,
        gpus = inventory.gpus.len(),
        source = inventory.gpu_source.as_str(),
        "node discovered"
    );
    let node = NodeFacts {
        node_id: config.node_id.clone(),
        context: NodeContext {
            mgmt_addr: config.mgmt_addr.clone(),
            mgmt_interface: config.mgmt_interface.clone(),
            engines: config.engines.clone(),
        },
        inventory: inventory.clone(),
    };
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (supervisor, adoptions) = Supervisor::new(config.supervisor.clone(), node, events_tx)?;
    for adoption in &adoptions {
        match adoption {
            Adoption::Adopted { shard_id, pids } => {
                tracing::info!(shard = %shard_id, ?pids, "adopted engine left by an earlier agent")
            }
            Adoption::Stale { file, why } => {
                tracing::info!(%file, %why, "removed stale state file")
            }
        }
    }
    let terms =
        TermStore::open(&config.supervisor.work_dir).map_err(|source| AgentError::Term {
            dir: config.supervisor.work_dir.clone(),
            source,
        })?;
    let adopted = adoptions
        .iter()
        .filter(|a| matches!(a, Adoption::Adopted { .. }))
        .count();
    let mut inventory = inventory;
    if let Some(warning) = terms.reset_warning(adopted) {
        tracing::error!("{warning}");
        inventory.warnings.push(warning);
    }
    let client = StreamClient::new(config, inventory, supervisor, terms, events_rx).with_tls(tls);
    let stream = tokio::spawn(client.run());
    wait_for_exit_signal().await;
    tracing::info!("exiting; engines keep running and the next agent adopts them");
    stream.abort();
    Ok(())
}

async fn wait_for_exit_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
