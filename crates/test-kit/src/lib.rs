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

/// A port free right now on 127.0.0.1, for a process the test is about to
/// start. Chosen below the kernel's ephemeral range (32768 and up by
/// default) and below the engine ports the leader hands out (20000 and
/// up): a port the kernel picks as free can become the source port of any
/// outgoing connection, another test's or the router's own reconnect to
/// that very port, before the process binds it, which then fails with
/// "address in use". Each call in a process moves on to the next port, so
/// no two callers get the same one; the start differs per process.
pub fn free_port() -> u16 {
    free_consecutive_ports(1)
}

/// The first of `count` consecutive ports free right now on 127.0.0.1
/// (an engine's data-parallel ranks publish on a port each, from a base),
/// chosen as [`free_port`] chooses one.
pub fn free_consecutive_ports(count: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const PORTS: std::ops::Range<u32> = 10_000..20_000;
    const UNSET: u32 = u32::MAX;
    static NEXT: AtomicU32 = AtomicU32::new(UNSET);
    let span = PORTS.end - PORTS.start;
    let count = u32::from(count.max(1));
    let start = std::process::id().wrapping_mul(7919) % span;
    let _ = NEXT.compare_exchange(UNSET, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..span {
        let first = PORTS.start + NEXT.fetch_add(count, Ordering::SeqCst) % (span - count);
        let all_free = (first..first + count).all(|port| {
            let port = u16::try_from(port).expect("ports fit in u16");
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
        if all_free {
            return u16::try_from(first).expect("ports fit in u16");
        }
    }
    panic!("no {count} consecutive free ports in {PORTS:?} on 127.0.0.1")
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
