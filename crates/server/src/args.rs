//! `llmgw server` command line, and turning server.yaml into a running peer.

use std::path::PathBuf;

use clap::Args;
use llmgw_config::ServerConfig;
use llmgw_raft::{PeerNode, PeerSpec, RaftSettings};

use llmgw_tls::TlsFiles;

use crate::agents::LivenessSettings;
use crate::auth::AdminAuth;
use crate::reconcile::PlanSettings;
use crate::security::Security;
use crate::serve::{ServerError, ServerOptions, serve, shutdown_signal};

/// Run one control-plane peer.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Path to server.yaml.
    #[arg(long, short = 'c', env = "LLMGW_SERVER_CONFIG")]
    pub config: PathBuf,
    /// Seed this peer's empty data directory from a backup file (`llmgw
    /// ctl snapshot save`) and exit. Run it on every peer of the new
    /// cluster, then start them as usual.
    #[arg(long, value_name = "FILE", conflicts_with = "save_backup")]
    pub restore: Option<PathBuf>,
    /// With --restore: restore even though a configured peer answers or
    /// the backup is of another cluster than server.yaml's `cluster_id`.
    #[arg(long, requires = "restore")]
    pub force: bool,
    /// Write a backup of this stopped peer's data directory to FILE and
    /// exit: its snapshot and its whole log. Needs no running cluster (for
    /// a cluster that lost its majority); `llmgw ctl snapshot save` is the
    /// way for a running one.
    #[arg(long, value_name = "FILE")]
    pub save_backup: Option<PathBuf>,
}

/// Loads the configuration and runs the peer until SIGINT or SIGTERM.
pub async fn run_server(args: ServerArgs) -> Result<(), ServerError> {
    let config =
        ServerConfig::load(&args.config).map_err(|e| ServerError::Config(e.to_string()))?;
    for warning in config.warnings() {
        tracing::warn!("{}: {warning}", args.config.display());
    }
    if let Some(file) = &args.restore {
        print!(
            "{}",
            crate::restore::restore(&config, file, args.force).await?
        );
        return Ok(());
    }
    if let Some(file) = &args.save_backup {
        print!("{}", crate::restore::save_backup(&config, file).await?);
        return Ok(());
    }
    let catalog = match &config.catalog {
        Some(path) => Some(load_catalog(path)?),
        None => None,
    };
    let options = options_from(&config, &args.config)?;
    serve(options, catalog, shutdown_signal()).await
}

/// server.yaml's mTLS files, `None` with `insecure: true`.
pub(crate) fn tls_files(config: &ServerConfig) -> Option<TlsFiles> {
    config.tls.as_ref().map(|tls| TlsFiles {
        ca: tls.ca.clone(),
        cert: tls.cert.clone(),
        key: tls.key.clone(),
        crl: tls.crl.clone(),
    })
}

fn load_catalog(path: &std::path::Path) -> Result<llmgw_catalog::Catalog, ServerError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ServerError::Config(format!("cannot read the catalog {}: {e}", path.display()))
    })?;
    llmgw_catalog::parse_catalog(&path.display().to_string(), &text)
        .map_err(|problems| ServerError::Config(problems.to_string()))
}

/// Translates server.yaml into what the peer runs with.
pub fn options_from(
    config: &ServerConfig,
    file: &std::path::Path,
) -> Result<ServerOptions, ServerError> {
    if config.tls.is_none() && !config.insecure {
        return Err(ServerError::Config(format!(
            "{}: no `tls` section: add `tls` (ca, cert, key; `llmgw certs` makes development \
             ones, see docs/security.md) or set `insecure: true` to run plaintext on a trusted \
             network",
            file.display()
        )));
    }
    // Anyone who reaches an open admin API can change the fleet; on
    // loopback only this host can.
    if !config.admin_listen.ip().is_loopback() && config.admin.tokens.is_empty() && !config.insecure
    {
        return Err(ServerError::Config(format!(
            "{}: the admin API listens on {} without `admin.tokens`: anyone who can reach it \
             could change the fleet; add a read and a write token (docs/security.md), listen on \
             loopback (`admin_listen: 127.0.0.1:7480`), or set `insecure: true` to run open on a \
             trusted network",
            file.display(),
            config.admin_listen
        )));
    }
    let security = Security {
        tls: tls_files(config),
        admin: AdminAuth::from_config(&config.admin.tokens)
            .map_err(|e| ServerError::Config(format!("{}: {e}", file.display())))?,
    };
    let timing = &config.raft;
    let raft = RaftSettings {
        heartbeat_interval: timing.heartbeat_interval,
        election_timeout_min: timing.election_timeout_min,
        election_timeout_max: timing.election_timeout_max,
        snapshot_timeout: timing.install_snapshot_timeout,
        snapshot_after_entries: timing.snapshot_after_logs,
        keep_entries_after_snapshot: timing.keep_logs_after_snapshot,
        form_new_cluster: config.initial_cluster_state == llmgw_config::InitialClusterState::New,
        min_free_disk_bytes: timing.min_free_disk_mb << 20,
        ..RaftSettings::default()
    };
    let peers = config
        .peers
        .iter()
        .map(|peer| PeerSpec {
            id: peer.id,
            node: PeerNode {
                grpc: if peer.id == config.id {
                    config.grpc_advertise.clone()
                } else {
                    peer.grpc.clone()
                },
                admin: peer.admin.clone(),
            },
        })
        .collect();
    Ok(ServerOptions {
        id: config.id,
        data_dir: config.data_dir.clone(),
        grpc_listen: config.grpc_listen,
        admin_listen: config.admin_listen,
        peers,
        raft,
        security,
        liveness: LivenessSettings {
            ttl: config.liveness.node_ttl,
            lost_after: config.liveness.lost_after,
            grace: config.liveness.leader_grace,
            agent_heartbeat: config.liveness.agent_heartbeat_interval.unwrap_or_default(),
        },
        placement: PlanSettings::default(),
        router_listen: config.router_listen,
        usage_retention: config.usage_retention,
        cluster_id: config.cluster_id.clone(),
    })
}
