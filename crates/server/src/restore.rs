//! `llmgw server --config server.yaml --restore FILE`: seeds this peer's
//! empty data directory from a backup taken with `llmgw ctl snapshot
//! save` (or `--save-backup`), then exits. Run it on every peer of the new
//! cluster (each with its own server.yaml, all listing the same peers),
//! then start them as usual: they hold the same state and elect a leader
//! among themselves.
//!
//! `llmgw server --config server.yaml --save-backup FILE`: writes a backup
//! from this stopped peer's data directory (its snapshot and its whole
//! log), for a cluster that lost its majority and cannot answer `ctl
//! snapshot save`.

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

/// Writes a backup of this stopped peer's store to `file` (never over an
/// existing file); what was saved, for the operator.
pub async fn save_backup(config: &ServerConfig, file: &Path) -> Result<String, ServerError> {
    let config_error = |message: String| ServerError::Config(message);
    if file.exists() {
        return Err(config_error(format!(
            "{} exists; a backup is never written over a file",
            file.display()
        )));
    }
    let dir = config.data_dir.join("raft");
    let dump = llmgw_store::dump(&dir, config.id).await.map_err(|e| {
        let text = e.to_string();
        if text.contains("lock") {
            config_error(format!(
                "{text}\n(is peer {} still running? stop it first)",
                config.id
            ))
        } else {
            config_error(text)
        }
    })?;
    let bytes = serde_json::to_vec(&dump.backup)
        .map_err(|e| config_error(format!("encoding the backup: {e}")))?;
    write_synced(file, &bytes)
        .map_err(|e| config_error(format!("cannot write {}: {e}", file.display())))?;
    let backup = &dump.backup;
    Ok(format!(
        "saved a backup of peer {} from {} to {}: index {}, term {}, state hash {}\n\
         {} log entries replayed past its snapshot, {} of them after the last one this peer \
         knew committed (kept: the survivor's log is the best record left)\n",
        config.id,
        dir.display(),
        file.display(),
        backup.index(),
        backup.term(),
        backup.state_hash,
        dump.replayed,
        dump.beyond_committed,
    ))
}

fn write_synced(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)?;
    out.write_all(bytes)?;
    out.sync_all()
}
