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

/// What was restored, for the operator. Refused, unless `force`, when a
/// configured peer answers (a restore beside a running cluster makes the
/// restored peer forget what it acknowledged) or when the backup is of a
/// cluster other than server.yaml's `cluster_id`.
pub async fn restore(
    config: &ServerConfig,
    file: &Path,
    force: bool,
) -> Result<String, ServerError> {
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
    let (cluster_id, cluster_refusal) = cluster_of(config, &backup, file);
    let mut refusals: Vec<String> = cluster_refusal.into_iter().collect();
    refusals.extend(no_peer_answers(config, &peers).await?);
    if !refusals.is_empty() && !force {
        return Err(config_error(format!(
            "not restoring peer {} from {}:\n  {}\n(--force restores anyway)",
            config.id,
            file.display(),
            refusals.join("\n  ")
        )));
    }
    let dir = config.data_dir.join("raft");
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| config_error(format!("cannot create {}: {e}", parent.display())))?;
    }
    llmgw_store::restore(&dir, config.id, &peers, &backup, &cluster_id)
        .map_err(|e| config_error(e.to_string()))?;
    Ok(format!(
        "restored peer {} in {} from {}: index {}, term {}, state hash {}, voters {:?}\n\
         cluster {}, epoch {}: its first leader begins a new epoch, which the agents take as \
         newer than any leader before the restore\n",
        config.id,
        dir.display(),
        file.display(),
        backup.index(),
        backup.term(),
        backup.state_hash,
        peers.keys().collect::<Vec<_>>(),
        cluster_id,
        backup.epoch(),
    ))
}

/// The cluster id the restored peer takes, and why it should not be
/// restored, if so: the backup is of another cluster than server.yaml's
/// `cluster_id`, or predates cluster ids and server.yaml names none (the
/// agents, which joined the cluster's id since, would refuse a made-up
/// one).
fn cluster_of(config: &ServerConfig, backup: &Backup, file: &Path) -> (String, Option<String>) {
    let configured = config.cluster_id.as_deref();
    match (backup.cluster_id(), configured) {
        (Some(saved), Some(configured)) if saved != configured => (
            saved.to_owned(),
            Some(format!(
                "{} is a backup of cluster {saved}, and server.yaml says cluster_id {configured}",
                file.display()
            )),
        ),
        (Some(saved), _) => (saved.to_owned(), None),
        (None, Some(configured)) => (configured.to_owned(), None),
        (None, None) => (
            format!("restored-{}", backup.state_hash),
            Some(format!(
                "{} was taken before the cluster had an id: set cluster_id in server.yaml to \
                 the id its agents joined (the last word of an agent's leader-term file, or \
                 what `llmgw ctl cluster` showed), the same on every peer; forced, it is \
                 restored as cluster restored-{}, which agents that joined another refuse",
                file.display(),
                backup.state_hash
            )),
        ),
    }
}

/// Why a restore now would graft old state onto a running cluster: every
/// configured peer that answers, with what it says of itself.
async fn no_peer_answers(
    config: &ServerConfig,
    peers: &BTreeMap<u64, PeerNode>,
) -> Result<Vec<String>, ServerError> {
    let tls = crate::args::tls_files(config)
        .map(|files| llmgw_tls::Tls::load(files, llmgw_tls::Identity::Peer(config.id)))
        .transpose()
        .map_err(|e| ServerError::Config(format!("tls: {e}")))?;
    let mut answering = Vec::new();
    for (id, node) in peers.iter().filter(|(id, _)| **id != config.id) {
        if let Ok(status) = llmgw_raft::probe_peer(&node.grpc, tls.clone()).await {
            answering.push(format!(
                "peer {id} at {} is running (term {}, cluster {}): restore only a cluster whose \
                 peers are all stopped; a peer restored beside running ones forgets what it \
                 acknowledged to them",
                node.grpc,
                status.term,
                status.cluster_id.as_deref().unwrap_or("unknown"),
            ));
        }
    }
    Ok(answering)
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
