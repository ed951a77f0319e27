//! Connections to every other peer, kept open at all times.
//!
//! Followers talk only to the leader. A link between two followers is made
//! by some election and then closed by the HTTP/2 keep-alive the first time
//! its pings go unanswered for a second (a stalled or loaded host), and
//! nothing opens it again, so the first pre-vote after the leader dies must
//! dial: a TCP connect and an mTLS handshake at the very moment the whole
//! fleet, cut off from the dead leader, dials the same listeners. That
//! handshake then waits behind thousands of agents', and the election with
//! it (seen at 10,000 agents: several seconds, and once no leader at all
//! while the fleet kept retrying). A `Status` call to each member every few
//! seconds keeps a connection open (HTTP/2 keep-alive holds it between
//! calls), so votes travel at once; the call asks for no state hash, so it
//! costs next to nothing at any fleet size.

use std::time::Duration;

use openraft::ServerState;

use crate::ControlPlane;

/// How often each link is used; well inside any idle timeout, and cheap (a
/// few hundred bytes a second per peer).
const EVERY: Duration = Duration::from_secs(2);

pub(crate) fn spawn_peer_links(control: ControlPlane) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EVERY).await;
            let metrics = control.metrics();
            if metrics.state == ServerState::Shutdown {
                return;
            }
            let mut others: Vec<_> = metrics
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != control.id())
                .map(|(_, node)| node.clone())
                .collect();
            if others.is_empty() {
                others = control
                    .configured_peers()
                    .iter()
                    .filter(|(id, _)| **id != control.id())
                    .map(|(_, node)| node.clone())
                    .collect();
            }
            // An answer or not: the point is the open connection; a peer
            // that is down is dialled again on the next round.
            let peers = control.peers();
            let calls = others
                .iter()
                .map(|node| crate::status::keep_link(peers, &node.grpc));
            futures::future::join_all(calls).await;
        }
    });
}
