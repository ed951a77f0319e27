//! Raft timing and snapshot settings, and their translation to openraft.

use std::time::Duration;

/// Entries openraft puts in one AppendEntries: with entries of at most
/// [`crate::MAX_ENTRY_BYTES`], an append stays under 48 MiB, below the
/// peer transport's 64 MiB message limit.
pub const MAX_ENTRIES_PER_APPEND: u64 = 48;

/// Timings suited to RocksDB with fsync on a shared machine: an fsync can
/// take tens of milliseconds under load, so heartbeats are a few hundred
/// milliseconds apart and a follower waits about a second before it stands
/// for election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftSettings {
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Deadline of one AppendEntries or Vote RPC.
    pub rpc_timeout: Duration,
    /// Deadline of sending a whole snapshot.
    pub snapshot_timeout: Duration,
    /// Build a snapshot after this many entries were applied since the last.
    pub snapshot_after_entries: u64,
    /// Entries kept in the log behind the snapshot, so a briefly lagging
    /// follower catches up from the log instead of a snapshot.
    pub keep_entries_after_snapshot: u64,
    /// `initial_cluster_state: new`: this peer may take part in forming a
    /// new cluster when its store is empty. Off by default, so that a peer
    /// whose data was lost waits to be replicated to instead.
    pub form_new_cluster: bool,
    /// Client writes are refused while the data directory has less free
    /// space than this (0: never).
    pub min_free_disk_bytes: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(80),
            election_timeout_min: Duration::from_millis(250),
            election_timeout_max: Duration::from_millis(450),
            rpc_timeout: Duration::from_millis(1000),
            snapshot_timeout: Duration::from_secs(30),
            snapshot_after_entries: 5000,
            keep_entries_after_snapshot: 1000,
            form_new_cluster: false,
            min_free_disk_bytes: 64 << 20,
        }
    }
}

impl RaftSettings {
    /// How long a leader acts after a majority last acknowledged it:
    /// openraft's own leader lease. Followers refuse to elect anyone else
    /// for at least this long after they last heard the leader.
    pub fn leader_lease(&self) -> Duration {
        self.election_timeout_max
    }

    pub(crate) fn to_openraft(&self) -> Result<openraft::Config, String> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let config = openraft::Config {
            cluster_name: "llmgw".to_owned(),
            heartbeat_interval: ms(self.heartbeat_interval),
            election_timeout_min: ms(self.election_timeout_min),
            election_timeout_max: ms(self.election_timeout_max),
            install_snapshot_timeout: ms(self.snapshot_timeout),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_after_entries),
            max_in_snapshot_log_to_keep: self.keep_entries_after_snapshot,
            purge_batch_size: 1,
            max_payload_entries: MAX_ENTRIES_PER_APPEND,
            // A peer that was paused, cut off or restarted asks first
            // whether it could win; while the leader's lease holds the
            // answer is no, so it never bumps the term of a healthy cluster.
            enable_pre_vote: Some(true),
            ..Default::default()
        };
        config.validate().map_err(|e| e.to_string())
    }
}
