//! `GET /api/v1/cluster` and membership changes.

use serde::{Deserialize, Serialize};

/// `GET /api/v1/cluster`: the Raft cluster as the answering peer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The peer that answered.
    pub id: u64,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub peers: Vec<PeerView>,
    /// This peer's gRPC links are plaintext (`insecure: true`).
    pub insecure: bool,
    /// Leader changes this peer saw in the last hour.
    pub leader_changes_last_hour: usize,
}

impl ClusterView {
    /// The leader's entry, when a leader is known and is a member.
    pub fn leader(&self) -> Option<&PeerView> {
        let leader = self.leader_id?;
        self.peers.iter().find(|peer| peer.id == leader)
    }
}

/// One entry of `ClusterView::peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    pub id: u64,
    /// The peer's gRPC address.
    pub addr: String,
    /// Base URL of its admin API.
    pub admin: String,
    pub membership: Membership,
    /// The role the peer reports, or `unreachable`.
    pub role: PeerRole,
    pub term: Option<u64>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub state_hash: Option<String>,
    /// Why the peer could not be asked, when it could not.
    pub error: Option<String>,
}

/// A peer's place in the current membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Membership {
    Voter,
    Learner,
}

/// What a peer is doing in Raft, as it says itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerRole {
    Leader,
    Follower,
    Candidate,
    Learner,
    /// Stopping: it no longer takes part.
    Shutdown,
    /// It did not answer the peer that built the view.
    Unreachable,
}

impl PeerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PeerRole::Leader => "leader",
            PeerRole::Follower => "follower",
            PeerRole::Candidate => "candidate",
            PeerRole::Learner => "learner",
            PeerRole::Shutdown => "shutdown",
            PeerRole::Unreachable => "unreachable",
        }
    }
}

impl std::fmt::Display for PeerRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Membership {
    pub fn as_str(self) -> &'static str {
        match self {
            Membership::Voter => "voter",
            Membership::Learner => "learner",
        }
    }
}

impl std::fmt::Display for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /api/v1/cluster/peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddPeer {
    pub id: u64,
    /// `host:port` of the new peer's gRPC listener.
    pub grpc: String,
    /// Base URL of the new peer's admin API.
    #[serde(default)]
    pub admin: String,
}

/// The answer to `POST /api/v1/cluster/peers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAdded {
    pub added: u64,
}

/// The answer to `DELETE /api/v1/cluster/peers/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRemoved {
    pub removed: u64,
}
