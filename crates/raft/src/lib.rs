//! openraft wiring for the llmgw control plane.
//!
//! [`ControlPlane`] is what the rest of the server uses: it owns the Raft
//! node, proposes commands (forwarding them to the leader when this peer is a
//! follower), answers linearizable reads with a read index, changes
//! membership one step at a time, and reports this peer's and its peers'
//! status. The peer transport is tonic ([`network`] dials, [`service`]
//! answers); every RPC honours openraft's deadline.

mod backup;
mod bootstrap;
mod control;
mod disk;
mod error;
mod forward;
mod inbound;
mod lease;
mod links;
mod network;
mod service;
mod settings;
mod status;

pub use control::{
    ControlPlane, MAX_ENTRY_BYTES, PeerSpec, RaftCounters, StartError, entry_bytes, now_ms,
};
pub use disk::free_bytes;
pub use error::ControlError;
pub use llmgw_api::PeerView;
/// What reads a `ControlPlane::raft().metrics()` receiver (`changed`, `borrow_watched`).
pub use openraft::async_runtime::WatchReceiver;
pub use service::{RaftGrpcService, raft_grpc_service};
pub use settings::RaftSettings;
pub use status::{PeerStatus, probe_peer};

pub use llmgw_store::{PeerNode, TypeConfig};

/// The Raft node type of an llmgw peer.
pub type LlmgwRaft = openraft::Raft<TypeConfig, llmgw_store::StateMachineStore>;
