//! `llmgw server --config server.yaml --restore FILE`: seeds this peer's
//! empty data directory from a backup taken with `llmgw ctl snapshot
//! save`, then exits. Run it on every peer of the new cluster (each with
//! its own server.yaml, all listing the same peers), then start them as
//! usual: they hold the same state and elect a leader among themselves.

use std::collections::BTreeMap;
use std::path::Path;

use llmgw_config::ServerConfig;
use llmgw_raft::PeerNode;
use llmgw_store::Backup;

use crate::serve::ServerError;

/// What was restored, for the operator.
pub fn restore(config: &ServerConfig, file: &Path) -> Result<String, ServerError> {
    let config_error = |message: String| ServerError::Config(message);
    let bytes = std::fs::read(file)
        .map_err(|e| config_error(format!("cannot read the backup {}: {e}", file.display())))?;
    let backup: Backup = serde_json::from_slice(&bytes).map_err(|e| {
        config_error(format!(
            "{} is not an llmgw backup (`llmgw ctl snapshot save`): {e}",
            file.display()
        ))
    })?;
    let peers: BTreeMap<u64, PeerNode> = config
        .peers
        .iter()
        .map(|peer| {
            let grpc = if peer.id == config.id {
                config.grpc_advertise.clone()
            } else {
                peer.grpc.clone()
            };
            (
                peer.id,
                PeerNode {
                    grpc,
                    admin: peer.admin.clone(),
                },
            )
        })
        .collect();
    let dir = config.data_dir.join("raft");
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| config_error(format!("cannot create {}: {e}", parent.display())))?;
    }
    llmgw_store::restore(&dir, config.id, &peers, &backup)
        .map_err(|e| config_error(e.to_string()))?;
    Ok(format!(
        "restored peer {} in {} from {}: index {}, term {}, state hash {}, voters {:?}\n",
        config.id,
        dir.display(),
        file.display(),
        backup.index(),
        backup.term(),
        backup.state_hash,
        peers.keys().collect::<Vec<_>>()
    ))
}
