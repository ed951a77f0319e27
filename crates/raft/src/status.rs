//! What a peer says about itself, and what the cluster view shows per peer.

use llmgw_api::PeerRole;
use serde::{Deserialize, Serialize};

/// One peer's own account, answered by the `Status` RPC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub id: u64,
    /// The peer holds a cluster (a vote, a log or a snapshot).
    pub initialized: bool,
    pub role: PeerRole,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub commit_index: Option<u64>,
    pub state_hash: String,
    /// The data directory is below its reserve (`raft.min_free_disk_mb`):
    /// leadership handed to this peer would refuse writes too. Absent from
    /// peers that predate it.
    #[serde(default)]
    pub disk_low: bool,
}
