use std::path::PathBuf;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the Raft data in {path} is corrupt or truncated: {detail}. This peer refuses to start \
         rather than serve a state the cluster never had. A power cut does not do this (a torn, \
         unacknowledged last write is dropped on open): data that was synced has changed. \
         To recover while the other peers run: move {path} aside (keep it for diagnosis), make \
         sure this peer's server.yaml says `initial_cluster_state: existing`, and start it \
         again: it forms no cluster and catches up from the leader. If no peer can start, \
         restore every peer from the last `llmgw ctl snapshot save` file with `llmgw server \
         restore` (docs/operations.md); never start every peer empty with \
         `initial_cluster_state: new`, which forms a new, empty cluster"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("cannot restore into {path}: {detail}")]
    Restore { path: PathBuf, detail: String },
    #[error("cannot save a backup from {path}: {detail}")]
    Dump { path: PathBuf, detail: String },
    #[error("cannot open the Raft data in {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
}
