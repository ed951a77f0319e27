//! Slow links between the peers: every peer's gRPC port is reached through
//! a delaying TCP proxy ([`llmgw_test_kit::DelayProxy`]) that listens on
//! the peer's own address, inside its namespace, on [`PROXY_PORT`]. Every
//! peer's server.yaml names the others (and itself) by their proxy, so all
//! Raft traffic, forwarded writes, and agent streams once redirected to
//! the leader (agents first dial the peers' own ports) cross a link with
//! the delay of the moment ([`LinkDelay`]), which a schedule raises and the
//! runner's heal sets back to zero. A proxy on the peer's own address keeps
//! its certificate valid and its partition rules (by source address)
//! working. This kernel has no netem, so the delay is a proxy's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use llmgw_dev::PeerLayout;
use llmgw_test_kit::{DelayProxy, LinkDelay};

use crate::cluster::{Cluster, ClusterError};

/// Where a peer's delaying proxy listens, on the peer's own address.
pub const PROXY_PORT: u16 = 7071;

/// The proxies in front of every peer and the delay they all apply.
pub struct SlowLinks {
    delay: Arc<LinkDelay>,
    proxies: BTreeMap<u64, DelayProxy>,
}

impl SlowLinks {
    /// How other peers reach `layout`'s peer: through its proxy.
    pub fn advertised(layout: &PeerLayout) -> PeerLayout {
        let mut advertised = layout.clone();
        advertised.grpc = SocketAddr::new(layout.grpc.ip(), PROXY_PORT);
        advertised
    }
}

impl Cluster {
    /// Puts a proxy in front of every peer's gRPC port (before the peers
    /// start), with no delay yet, and rewrites every server.yaml to name
    /// the peers by their proxies.
    pub fn put_peers_behind_proxies(&mut self) -> Result<(), ClusterError> {
        let delay = LinkDelay::new(Duration::ZERO, Duration::ZERO);
        self.slow_links = Some(SlowLinks {
            delay,
            proxies: BTreeMap::new(),
        });
        let ids: Vec<u64> = self.peers.keys().copied().collect();
        for &id in &ids {
            self.start_proxy(id)?;
        }
        self.write_configs(&ids)
    }

    /// Starts peer `id`'s proxy, when the run has slow links.
    pub(crate) fn start_proxy(&mut self, id: u64) -> Result<(), ClusterError> {
        let Some(links) = self.slow_links.as_mut() else {
            return Ok(());
        };
        let layout = &self.peers[&id].layout;
        let namespace = Path::new("/var/run/netns").join(self.net.namespace(id));
        let listen = SlowLinks::advertised(layout).grpc;
        let proxy =
            DelayProxy::start_in(Some(&namespace), listen, layout.grpc, links.delay.clone())
                .map_err(|e| {
                    ClusterError::Proxy(format!("peer {id}'s delaying proxy on {listen}: {e}"))
                })?;
        links.proxies.insert(id, proxy);
        Ok(())
    }

    /// Sets every link's delay, each way: `one_way` plus up to `jitter`.
    /// `Err` when the run has no slow links.
    pub fn set_link_delay(&self, one_way: Duration, jitter: Duration) -> Result<(), String> {
        let links = self
            .slow_links
            .as_ref()
            .ok_or("this run's peers are not behind delaying proxies (not a slow-link scenario)")?;
        links.delay.set(one_way, jitter);
        Ok(())
    }

    /// Removes the delay, when the run has slow links.
    pub fn clear_link_delay(&self) {
        if let Some(links) = &self.slow_links {
            links.delay.set(Duration::ZERO, Duration::ZERO);
        }
    }

    /// Stops every proxy (the peers are gone).
    pub(crate) fn stop_proxies(&mut self) {
        self.slow_links = None;
    }
}
