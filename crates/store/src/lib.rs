//! Durable storage for one llmgw control-plane peer: the Raft log (vote,
//! entries, purge point) and the replicated state machine with its
//! snapshots, in one RocksDB database, plus the openraft type configuration
//! that both the store and the transport use.
//!
//! Durability: every vote, append, truncation and purge is written with
//! `sync = true` before openraft is told it happened. The state machine lives
//! in memory and is rebuilt on start from the last snapshot plus the
//! committed log; snapshots are written synchronously, as one value, and
//! only when newer than the stored one. A power cut may tear the last,
//! unacknowledged WAL record: it is dropped on open. Opening a database
//! whose synced data is damaged fails with [`StoreError::Corrupt`] instead
//! of serving a state the cluster never had.

mod acknowledged;
mod backup;
mod create;
mod damage;
mod db;
mod error;
mod generation;
mod log_store;
mod snapshot;
mod state_machine;
mod types;

pub use backup::{BACKUP_FORMAT, Backup, Dump, dump, restore};
pub use db::{Store, open};
pub use error::StoreError;
pub use log_store::{LogStore, SyncStats};
pub use state_machine::{AppliedState, ApplyStats, StateMachineStore};
pub use types::{Entry, LogId, PeerNode, SnapshotData, StoredMembership, TypeConfig, Vote};
