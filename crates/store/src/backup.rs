//! Backups (`llmgw ctl snapshot save` from a running cluster, `llmgw
//! server --save-backup` from a stopped peer's data directory) and seeding
//! a new peer's store from one (`llmgw server --restore`), as etcd
//! operators know them.
//!
//! A backup is the applied fleet state at one log index, with the index,
//! the term of that entry and the state hash, in one JSON file. Restoring
//! writes it into an empty store as that peer's snapshot, with the log
//! purged up to it, the membership of the peers being restored, and a vote
//! in the backup's term (so every new election is in a later term and no
//! log id can go backwards). Every peer restored from the same file starts
//! from the same state; they elect a leader among themselves and agents
//! reconnect to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use llmgw_state::FleetState;
use openraft::Membership;
use rocksdb::WriteBatch;
use serde::{Deserialize, Serialize};

use crate::db::CF_META;
use crate::error::StoreError;
use crate::log_store::{KEY_LAST_PURGED, KEY_VOTE, synced, to_json};
use crate::snapshot::{self, SnapshotMeta};
use crate::types::{LogId, PeerNode, StoredMembership, Vote};

/// The `format` of backup files this release writes and reads.
pub const BACKUP_FORMAT: &str = "llmgw-backup-v1";

/// One backup file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Backup {
    pub format: String,
    /// The last log entry the state includes.
    pub last_log_id: LogId,
    /// `FleetState::hash` of `fleet`, checked on restore.
    pub state_hash: String,
    /// When and where it was taken (for the operator).
    pub saved_at_ms: u64,
    pub saved_on_peer: u64,
    /// The membership when it was taken (informational: a restore uses
    /// the restoring peers' configuration).
    pub membership: StoredMembership,
    pub fleet: FleetState,
}

impl Backup {
    pub fn index(&self) -> u64 {
        self.last_log_id.index
    }

    pub fn term(&self) -> u64 {
        self.last_log_id.leader_id.term
    }

    /// The cluster the backup came from; `None` for a backup taken before
    /// the cluster had an id.
    pub fn cluster_id(&self) -> Option<&str> {
        self.fleet.cluster.as_ref().map(|c| c.id.as_str())
    }

    /// The epoch the cluster was in when the backup was taken (0 before
    /// epochs).
    pub fn epoch(&self) -> u64 {
        self.fleet.cluster.as_ref().map_or(0, |c| c.epoch)
    }

    /// The file is one this release can restore, and its state is the one
    /// it claims (a truncated or edited file fails here).
    pub fn verify(&self) -> Result<(), String> {
        if self.format != BACKUP_FORMAT {
            return Err(format!(
                "backup format {:?} is not {BACKUP_FORMAT:?}",
                self.format
            ));
        }
        let hash = self.fleet.hash().to_string();
        if hash != self.state_hash {
            return Err(format!(
                "the state in the file hashes to {hash}, but the file says {}: it was changed \
                 or damaged after it was saved",
                self.state_hash
            ));
        }
        Ok(())
    }
}

/// Seeds the empty store in `dir` for peer `id` from `backup`, with
/// `peers` (every peer being restored, this one included) as the voters.
/// `cluster_id` names the cluster when the backup predates ids; every
/// peer restored from one file must be given the same.
pub fn restore(
    dir: &Path,
    id: u64,
    peers: &BTreeMap<u64, PeerNode>,
    backup: &Backup,
    cluster_id: &str,
) -> Result<(), StoreError> {
    let refuse = |detail: String| StoreError::Restore {
        path: dir.to_owned(),
        detail,
    };
    backup.verify().map_err(refuse)?;
    if !peers.contains_key(&id) {
        return Err(refuse(format!(
            "peer {id} is not among the peers {peers:?}"
        )));
    }
    let store = crate::open(dir)?;
    if !store.is_pristine() {
        return Err(refuse(
            "the data directory already holds Raft state; move it aside first (a restore \
             never overwrites a peer's data)"
                .to_owned(),
        ));
    }
    let voters: BTreeSet<u64> = peers.keys().copied().collect();
    let membership = Membership::new(vec![voters], peers.clone())
        .map_err(|e| refuse(format!("the peer list is not a membership: {e}")))?;
    let meta = SnapshotMeta {
        last_log_id: Some(backup.last_log_id),
        last_membership: StoredMembership::new(Some(backup.last_log_id), membership),
    };
    // The restored cluster keeps the backup's id and begins a new epoch
    // under its first leader, which agents take as newer than any
    // leadership of the cluster the backup came from.
    let fleet = backup.fleet.clone().restored(cluster_id);
    let expected_hash = fleet.hash().to_string();
    let data = to_json(&fleet).map_err(|e| refuse(e.to_string()))?;
    // Voted for itself in the backup's term: elections start above it, so
    // no peer ever appends below the snapshot's log id.
    let vote = Vote::new(backup.term(), id);
    let db = store.state_machine.db();
    let meta_cf = db.cf_handle(CF_META).expect("meta column family exists");
    let mut batch = WriteBatch::default();
    snapshot::put(db, &mut batch, &meta, &data).map_err(|e| refuse(e.to_string()))?;
    batch.put_cf(
        meta_cf,
        KEY_LAST_PURGED,
        to_json(&backup.last_log_id).map_err(|e| refuse(e.to_string()))?,
    );
    batch.put_cf(
        meta_cf,
        KEY_VOTE,
        to_json(&vote).map_err(|e| refuse(e.to_string()))?,
    );
    db.write_opt(batch, &synced())
        .map_err(|e| refuse(format!("writing the restored state: {e}")))?;
    drop(store);
    // Open it once more: everything a start will check holds.
    let store = crate::open(dir)?;
    let (index, hash) = store.state_machine.state_hash();
    if index != Some(backup.index()) || hash.to_string() != expected_hash {
        return Err(refuse(format!(
            "the restored store reads back as index {index:?}, hash {hash}; expected {} and {expected_hash}",
            backup.index(),
        )));
    }
    Ok(())
}

/// A backup made offline from a stopped peer's store ([`dump`]).
#[derive(Debug)]
pub struct Dump {
    pub backup: Backup,
    /// Log entries replayed on top of the stored snapshot.
    pub replayed: u64,
    /// Of those, entries after the last one this peer knew committed.
    pub beyond_committed: u64,
}

/// The state a stopped peer's store in `dir` holds: its snapshot, then
/// every entry of its log, as etcd's `--force-new-cluster` takes a lone
/// member's log for the truth. For a cluster that lost its majority: no
/// quorum is needed, only this peer's disk. A write acknowledged to a
/// client reached a majority, so a survivor that was in it holds it, even
/// when it had not yet heard that it committed; an entry that never
/// committed (answered `outcome_unknown`) may be kept too. The store must
/// not be in use (RocksDB's lock refuses a running peer's).
pub async fn dump(dir: &Path, peer: u64) -> Result<Dump, StoreError> {
    use openraft::RaftLogReader;
    use openraft::storage::RaftLogStorage;

    let refuse = |detail: String| StoreError::Dump {
        path: dir.to_owned(),
        detail,
    };
    if !dir.join("CURRENT").exists() {
        return Err(refuse("no Raft store here: nothing to save".to_owned()));
    }
    let mut store = crate::open(dir)?;
    let committed = store
        .log
        .read_committed()
        .await
        .map_err(|e| refuse(format!("reading the committed index: {e}")))?
        .map_or(0, |id| id.index);
    let log_state = store
        .log
        .get_log_state()
        .await
        .map_err(|e| refuse(format!("reading the log: {e}")))?;
    let mut state = store
        .state_machine
        .applied()
        .read()
        .expect("state lock poisoned")
        .clone();
    let from = state.last_applied.map_or(0, |id| id.index + 1);
    let until = log_state.last_log_id.map_or(0, |id| id.index);
    let entries = if until >= from {
        store
            .log
            .try_get_log_entries(from..=until)
            .await
            .map_err(|e| refuse(format!("reading log entries {from}..={until}: {e}")))?
    } else {
        Vec::new()
    };
    for entry in &entries {
        state.apply(entry);
    }
    let last_log_id = state
        .last_applied
        .ok_or_else(|| refuse("the store holds no log entry: nothing to save".to_owned()))?;
    Ok(Dump {
        backup: Backup {
            format: BACKUP_FORMAT.to_owned(),
            last_log_id,
            state_hash: state.fleet.hash().to_string(),
            saved_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            saved_on_peer: peer,
            membership: state.membership,
            fleet: state.fleet,
        },
        replayed: entries.len() as u64,
        beyond_committed: last_log_id
            .index
            .saturating_sub(committed.max(from.saturating_sub(1))),
    })
}
