//! What a peer says about itself, and what the cluster view shows per peer.

use std::time::Duration;

use llmgw_api::PeerRole;
use llmgw_proto::raft::RaftPayload;
use serde::{Deserialize, Serialize};

use crate::network::{self, Failure, Peers};

/// How long a peer may take to answer the `Status` RPC.
const STATUS_DEADLINE: Duration = Duration::from_millis(800);

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
    /// The cluster this peer belongs to, once known (absent from peers
    /// that predate cluster ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The peer applies `BeginEpoch`: a leader begins a cluster's first
    /// epoch only once every member does, so no peer of an older release
    /// applies it as a no-op and drifts from the others.
    #[serde(default)]
    pub epochs: bool,
}

/// Asks the peer at `addr` for its status, for a tool that runs without a
/// control plane of its own (a restore checks that no configured peer is
/// running). `tls`: this peer's material, as it dials its peers.
pub async fn probe_peer(addr: &str, tls: Option<llmgw_tls::Tls>) -> Result<PeerStatus, String> {
    let peers = Peers::new(0, STATUS_DEADLINE, tls, std::sync::Arc::default());
    ask_status(&peers, addr).await
}

pub(crate) async fn ask_status(peers: &Peers, addr: &str) -> Result<PeerStatus, String> {
    ask(peers, addr, RaftPayload::default()).await
}

/// What a `Status` request carries when it only keeps the link open: the
/// answer leaves out the state hash, which costs tens of milliseconds at
/// thousands of nodes. Older peers ignore it and answer in full.
pub(crate) const LINK_PROBE: &[u8] = b"link";

/// A `Status` call that keeps the connection to `addr` open (`links.rs`).
pub(crate) async fn keep_link(peers: &Peers, addr: &str) -> Result<PeerStatus, String> {
    let probe = RaftPayload {
        data: LINK_PROBE.to_vec(),
        ..RaftPayload::default()
    };
    ask(peers, addr, probe).await
}

async fn ask(peers: &Peers, addr: &str, payload: RaftPayload) -> Result<PeerStatus, String> {
    let mut client = peers.client(addr)?;
    network::with_deadline(
        STATUS_DEADLINE,
        client.status(peers.request(payload, STATUS_DEADLINE)),
    )
    .await
    .and_then(network::decode::<PeerStatus>)
    .inspect_err(|failure| {
        if let Failure::Unreachable(_) | Failure::Refused(_) = failure {
            peers.forget(addr);
        }
    })
    .map_err(|failure| match failure {
        Failure::Timeout => format!("no answer within {STATUS_DEADLINE:?}"),
        Failure::Unreachable(why)
        | Failure::Refused(why)
        | Failure::Skipped(why)
        | Failure::Network(why) => why,
    })
}
