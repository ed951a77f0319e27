//! The openraft type configuration shared by storage and transport.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How to reach one control-plane peer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerNode {
    /// `host:port` of the peer's gRPC listener (Raft transport).
    pub grpc: String,
    /// Base URL of the peer's admin HTTP API.
    pub admin: String,
}

impl fmt::Display for PeerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "grpc={} admin={}", self.grpc, self.admin)
    }
}

openraft::declare_raft_types!(
    /// llmgw's Raft: fleet commands in, apply outcomes out, numeric peer ids.
    pub TypeConfig:
        D = llmgw_state::Command,
        R = llmgw_state::Outcome,
        NodeId = u64,
        Node = PeerNode,
);

/// A snapshot travels and rests as the JSON encoding of the fleet state.
pub type SnapshotData = Vec<u8>;

pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
