use std::path::PathBuf;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the Raft data in {path} is corrupt or truncated: {detail}. This peer refuses to start \
         rather than serve a state the cluster never had. To recover, move {path} aside and \
         start the peer again with an empty data directory: it rejoins the cluster and catches \
         up from the leader"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("cannot open the Raft data in {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
}
