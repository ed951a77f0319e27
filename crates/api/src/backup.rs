//! What `llmgw ctl snapshot save` shows of the backup that
//! `GET /api/v1/snapshot` answers. The whole file is `llmgw_store::Backup`,
//! which the peers write and restore; clients that only report on a backup
//! read it through this summary, so they need not link the store (and
//! RocksDB). Deserializing ignores every other field of the file.

use serde::{Deserialize, Serialize};

/// The fields of a backup an operator is told about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupSummary {
    /// The last log entry the backed-up state includes.
    pub last_log_id: BackupLogId,
    /// The hash of the backed-up state, checked on restore.
    pub state_hash: String,
    /// The peer that took the backup.
    pub saved_on_peer: u64,
}

/// A Raft log id as openraft serializes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupLogId {
    pub leader_id: BackupLeaderId,
    pub index: u64,
}

/// The leadership that appended an entry; only its term is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupLeaderId {
    pub term: u64,
}

impl BackupSummary {
    pub fn index(&self) -> u64 {
        self.last_log_id.index
    }

    pub fn term(&self) -> u64 {
        self.last_log_id.leader_id.term
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_backup_file_and_ignores_what_it_does_not_show() {
        let file = r#"{
            "format": "llmgw-backup-v1",
            "last_log_id": {"leader_id": {"term": 4, "node_id": 2}, "index": 91},
            "state_hash": "00ff",
            "saved_at_ms": 1700000000000,
            "saved_on_peer": 2,
            "membership": {"log_id": null, "membership": {"configs": [], "nodes": {}}},
            "fleet": {"nodes": {}, "models": {}, "replicas": {}}
        }"#;
        let summary: BackupSummary = serde_json::from_str(file).unwrap();
        assert_eq!(summary.index(), 91);
        assert_eq!(summary.term(), 4);
        assert_eq!(summary.state_hash, "00ff");
        assert_eq!(summary.saved_on_peer, 2);
    }
}
