//! What a peer says about itself, and what the cluster view shows per peer.

use serde::{Deserialize, Serialize};

/// One peer's own account, answered by the `Status` RPC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub id: u64,
    /// The peer holds a cluster (a vote, a log or a snapshot).
    pub initialized: bool,
    /// `leader`, `follower`, `candidate` or `learner`.
    pub role: String,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub commit_index: Option<u64>,
    pub state_hash: String,
}

/// One entry of `GET /api/v1/cluster`'s `peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    pub id: u64,
    /// The peer's gRPC address.
    pub addr: String,
    /// Base URL of its admin API.
    pub admin: String,
    /// `voter` or `learner` in the current membership.
    pub membership: String,
    /// The role the peer reports, or `unreachable`.
    pub role: String,
    pub term: Option<u64>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub state_hash: Option<String>,
    /// Why the peer could not be asked, when it could not.
    pub error: Option<String>,
}
