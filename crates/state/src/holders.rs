//! Who holds each GPU and port, looked up for every placement applied.
//!
//! Scanning every replica for every GPU and port of a placement made
//! applying a batch of placements quadratic in the number of replicas
//! (a quarter of a second for 2,000 on each peer). A batch builds this
//! once, keeps it current as its placements apply, and drops it at the
//! first command of another kind. It is derived from the state and never
//! stored, so apply stays a function of the state and the command.

use std::collections::HashMap;

use crate::types::{FleetState, Replica, ShardState};

#[derive(Debug, Default)]
pub(crate) struct Holders {
    /// Node -> (GPU index, replica), in replica id order.
    gpus: HashMap<String, Vec<(u32, String)>>,
    /// Host -> port -> replica; the first holder in replica id order.
    ports: HashMap<String, HashMap<u16, String>>,
}

impl Holders {
    pub(crate) fn of(fleet: &FleetState) -> Holders {
        let mut holders = Holders::default();
        for replica in fleet.replicas.values() {
            holders.add(fleet, replica);
        }
        holders
    }

    /// Counts what `replica` holds: the GPUs of each shard not stopped
    /// and its ports ([`FleetState::ports_of`]).
    pub(crate) fn add(&mut self, fleet: &FleetState, replica: &Replica) {
        for shard in replica
            .shards
            .iter()
            .filter(|s| s.state != ShardState::Stopped)
        {
            let on_node = self.gpus.entry(shard.node.clone()).or_default();
            on_node.extend(shard.gpus.iter().map(|gpu| (*gpu, replica.id.clone())));
        }
        for (host, port) in fleet.ports_of(replica) {
            self.hold_port(host, port, &replica.id);
        }
    }

    fn hold_port(&mut self, host: &str, port: u16, replica: &str) {
        self.ports
            .entry(host.to_owned())
            .or_default()
            .entry(port)
            .or_insert_with(|| replica.to_owned());
    }

    pub(crate) fn gpu(&self, node: &str, gpu: u32) -> Option<&str> {
        self.gpus
            .get(node)?
            .iter()
            .find(|(index, _)| *index == gpu)
            .map(|(_, replica)| replica.as_str())
    }

    pub(crate) fn port(&self, host: &str, port: u16) -> Option<&str> {
        self.ports.get(host)?.get(&port).map(String::as_str)
    }
}
