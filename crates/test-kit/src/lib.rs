//! What llmgw's tests share, in one place: finding the built binaries
//! ([`llmgw_bin`], [`engine_sim_bin`]), free and closed ports, waiting for a
//! condition with a generous deadline instead of sleeping and hoping
//! ([`eventually`], [`wait_until`]), a three-peer cluster of real
//! `llmgw server` processes ([`Cluster`]) with real agents
//! ([`agents::Agent`]), `llmgw dev` under test ([`dev::Dev`]), chat
//! requests ([`chat`], [`stream_chat`]) and a bounded chat load
//! ([`load::ChatLoad`]), Prometheus text ([`metric`]),
//! and tests that cannot run on this machine ([`skipped`]).
//!
//! Tests read the admin API through the typed contract of `llmgw-api`
//! ([`Cluster::get_json`], [`get_json`]), so a renamed field fails to
//! compile here instead of reading as absent. A dev-dependency of the
//! shipped crates, and a dependency of the test tools (chaos, fleet-sim,
//! the benches), which wait with [`poll_until_ok`] where a failure is
//! theirs to report.

pub mod agents;
mod bins;
mod chat;
mod cluster;
mod delay_proxy;
pub mod dev;
mod http;
pub mod load;
pub mod process;
mod skip;
mod tmpfs;
mod wait;

pub use bins::{engine_sim_bin, llmgw_bin};
pub use chat::{chat, stream_chat};
pub use cluster::{Cluster, Peer, one_cluster_at_a_time};
pub use delay_proxy::{DelayProxy, LinkDelay};
pub use http::{admin_client, decode, get_json};
pub use llmgw_prometheus::metric;
pub use skip::skipped;
pub use tmpfs::Tmpfs;
pub use wait::{DEADLINE, eventually, poll_until_ok, wait_until, wait_until_blocking};

/// A port free right now on 127.0.0.1 (the kernel's choice). Another
/// process may take it before the test binds it; tests that start
/// clusters plan their ports with `llmgw_dev::plan_peers` instead, below
/// the ephemeral range.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// A port on 127.0.0.1 that refuses connections and that no other process
/// can take: bound, never listening. For an endpoint that is down until
/// the test brings it up with [`ClosedPort::release`].
pub struct ClosedPort {
    socket: tokio::net::TcpSocket,
    port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("a free port on 127.0.0.1");
        let port = socket.local_addr().expect("a bound socket").port();
        ClosedPort { socket, port }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Frees the port for the test to listen on, and returns it.
    pub fn release(self) -> u16 {
        drop(self.socket);
        self.port
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        ClosedPort::new()
    }
}
