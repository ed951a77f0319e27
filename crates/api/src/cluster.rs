//! `GET /api/v1/cluster` and membership changes.

use serde::{Deserialize, Serialize};

/// `GET /api/v1/cluster`: the Raft cluster as the answering peer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The peer that answered.
    pub id: u64,
    pub leader_id: Option<u64>,
    /// How long ago the answering peer last heard the leader it names: on
    /// a follower, the leader's last append or heartbeat; on the leader,
    /// the last acknowledgement by a majority. Absent with no leader named
    /// or none heard yet. A follower cut off from its peers goes on naming
    /// the last leader it knew; this says how stale that is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_heard_ms_ago: Option<u64>,
    pub term: u64,
    pub peers: Vec<PeerView>,
    /// This peer's gRPC links are plaintext (`insecure: true`).
    pub insecure: bool,
    /// Leader changes this peer saw in the last hour.
    pub leader_changes_last_hour: usize,
    /// The cluster's id, once its first epoch has begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The cluster's epoch (it begins at formation and again at each
    /// restore); absent while one is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

impl ClusterView {
    /// The leader's entry, when a leader is known and is a member.
    pub fn leader(&self) -> Option<&PeerView> {
        let leader = self.leader_id?;
        self.peers.iter().find(|peer| peer.id == leader)
    }

    /// The answering peer's (last applied index, state hash), as it
    /// reports itself: peers that agree on both hold the same state.
    pub fn own_state(&self) -> Option<(u64, String)> {
        let me = self.peers.iter().find(|peer| peer.id == self.id)?;
        Some((me.last_applied_index?, me.state_hash.clone()?))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: u64, applied: Option<u64>, hash: Option<&str>) -> PeerView {
        PeerView {
            id,
            addr: format!("127.0.0.1:{}", 7070 + id),
            admin: format!("http://127.0.0.1:{}", 7080 + id),
            membership: Membership::Voter,
            role: PeerRole::Follower,
            term: Some(3),
            last_log_index: applied,
            last_applied_index: applied,
            state_hash: hash.map(str::to_owned),
            error: None,
        }
    }

    fn view(id: u64, peers: Vec<PeerView>) -> ClusterView {
        ClusterView {
            id,
            leader_id: Some(1),
            leader_heard_ms_ago: Some(5),
            term: 3,
            peers,
            insecure: true,
            leader_changes_last_hour: 0,
            cluster_id: None,
            epoch: None,
        }
    }

    #[test]
    fn own_state_is_the_answering_peers_entry_not_another_one() {
        let peers = vec![peer(1, Some(9), Some("aa")), peer(2, Some(7), Some("bb"))];
        assert_eq!(view(2, peers.clone()).own_state(), Some((7, "bb".into())));
        assert_eq!(view(1, peers).own_state(), Some((9, "aa".into())));
    }

    #[test]
    fn own_state_is_unknown_without_an_applied_index_and_a_hash() {
        assert_eq!(view(1, vec![peer(1, Some(9), None)]).own_state(), None);
        assert_eq!(view(1, vec![peer(1, None, Some("aa"))]).own_state(), None);
        assert_eq!(
            view(3, vec![peer(1, Some(9), Some("aa"))]).own_state(),
            None
        );
    }
}
