//! Engine and rendezvous ports. Several nodes may share a host (a test
//! fleet on one machine, or nodes behind one address), so ports are held
//! per host, not per node.

use crate::types::{FleetState, Replica, ShardState};

/// The host part of a node's management address: `10.0.0.5:7000` and
/// `10.0.0.5` are the same host; `[fd00::5]:7000` is `fd00::5`.
pub fn mgmt_host(addr: &str) -> &str {
    match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() && !host.is_empty() => {
            if host.starts_with('[') && host.ends_with(']') {
                &host[1..host.len() - 1]
            } else if host.contains(':') {
                addr // a bare IPv6 address
            } else {
                host
            }
        }
        _ => addr,
    }
}

impl FleetState {
    /// The host node `node`'s engines listen on; the node id when the node
    /// is unknown.
    pub fn host_of<'a>(&'a self, node: &'a str) -> &'a str {
        self.nodes
            .get(node)
            .map_or(node, |record| mgmt_host(&record.mgmt_addr))
    }

    /// Every port a replica holds, as (host, port, replica id).
    pub fn ports_held(&self) -> impl Iterator<Item = (&str, u16, &str)> {
        self.replicas.values().flat_map(move |replica| {
            self.ports_of(replica)
                .map(|(host, port)| (host, port, replica.id.as_str()))
        })
    }

    /// The ports `replica` holds, as (host, port): the engine port of each
    /// shard not stopped, and on its head's host a multi-node replica's
    /// rendezvous port and the KV event ports.
    pub fn ports_of<'a>(&'a self, replica: &'a Replica) -> impl Iterator<Item = (&'a str, u16)> {
        let engines = replica
            .shards
            .iter()
            .filter(|shard| shard.state != ShardState::Stopped)
            .map(move |shard| (self.host_of(&shard.node), shard.port));
        let head_host = replica.shards.first().map(|head| self.host_of(&head.node));
        let head_ports = replica.rendezvous_port.into_iter().chain(
            replica
                .kv_event_ports
                .and_then(|k| k.ports())
                .into_iter()
                .flatten(),
        );
        let head = head_host
            .into_iter()
            .flat_map(move |host| head_ports.clone().map(move |port| (host, port)));
        engines.chain(head)
    }
}

#[cfg(test)]
mod tests {
    use super::mgmt_host;

    #[test]
    fn mgmt_hosts_lose_their_port_but_ipv6_keeps_its_colons() {
        assert_eq!(mgmt_host("10.0.0.5"), "10.0.0.5");
        assert_eq!(mgmt_host("10.0.0.5:7000"), "10.0.0.5");
        assert_eq!(mgmt_host("gpu-1:7000"), "gpu-1");
        assert_eq!(mgmt_host("[fd00::5]:7000"), "fd00::5");
        assert_eq!(mgmt_host("fd00::5"), "fd00::5");
    }
}
