//! Replicas: placements checked against who holds GPUs and ports, shard
//! reports, stop orders and removal.

use std::collections::BTreeSet;

use crate::command::{Outcome, Rejection};
use crate::holders::Holders;
use crate::types::{
    FleetState, Replica, ReplicaFailure, Shard, ShardFailure, ShardState, StopOrder,
};

use super::unknown_node;

impl FleetState {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn place_replica(
        &mut self,
        holders: &Holders,
        id: &str,
        model: &str,
        profile: &str,
        shards: &[Shard],
        head_ports: &[u16],
        at_ms: u64,
    ) -> Outcome {
        if id.is_empty() {
            return Rejection::invalid("replica id must not be empty");
        }
        if self.replicas.contains_key(id) {
            return Rejection::conflict(format!("replica {id} already exists"));
        }
        if !self.models.contains_key(model) {
            return Rejection::not_found(format!("model {model} is not in the catalog"));
        }
        if shards.is_empty() {
            return Rejection::invalid(format!("replica {id} has no shards"));
        }
        let ranks: BTreeSet<u32> = shards.iter().map(|s| s.rank).collect();
        if ranks.len() != shards.len() || ranks.iter().copied().ne(0..shards.len() as u32) {
            return Rejection::invalid(format!(
                "replica {id}: shard ranks must be 0..{} without gaps",
                shards.len()
            ));
        }
        let mut listed: BTreeSet<(&str, u32)> = BTreeSet::new();
        for shard in shards {
            let Some(node) = self.nodes.get(&shard.node) else {
                return unknown_node(&shard.node);
            };
            for gpu in &shard.gpus {
                if !node.inventory.gpus.iter().any(|g| g.index == *gpu) {
                    return Rejection::invalid(format!(
                        "replica {id}: node {} has no GPU {gpu}",
                        shard.node
                    ));
                }
                if !listed.insert((shard.node.as_str(), *gpu)) {
                    return Rejection::invalid(format!(
                        "replica {id} lists GPU {gpu} on node {} twice",
                        shard.node
                    ));
                }
                if let Some(holder) = holders.gpu(&shard.node, *gpu) {
                    return Rejection::conflict(format!(
                        "GPU {gpu} on node {} is already used by replica {holder}",
                        shard.node
                    ));
                }
            }
        }
        // Ports, like GPUs, are checked here and not only by the scheduler
        // that picked them: a leader deciding from a view that lags the log
        // must not hand out a port twice.
        let head = shards.iter().find(|s| s.rank == 0).map(|s| s.node.as_str());
        let wanted = shards.iter().map(|s| (s.node.as_str(), s.port)).chain(
            head.into_iter()
                .flat_map(|h| head_ports.iter().map(move |p| (h, *p))),
        );
        let mut taken: BTreeSet<(&str, u16)> = BTreeSet::new();
        for (node, port) in wanted {
            let host = self.host_of(node);
            if !taken.insert((host, port)) {
                return Rejection::invalid(format!(
                    "replica {id} asks for port {port} on host {host} twice"
                ));
            }
            if let Some(holder) = holders.port(host, port) {
                return Rejection::conflict(format!(
                    "port {port} on host {host} (node {node}) is already used by replica {holder}"
                ));
            }
        }
        let shards = shards
            .iter()
            .map(|s| Shard {
                state: ShardState::Pending,
                pid: None,
                last_failure: None,
                state_changed_at_ms: at_ms,
                report_seq: 0,
                ..s.clone()
            })
            .collect();
        self.replicas.insert(
            id.to_owned(),
            Replica {
                id: id.to_owned(),
                model: model.to_owned(),
                profile: profile.to_owned(),
                shards,
                created_at_ms: at_ms,
                fabric: None,
                rendezvous_port: None,
                replaces: None,
                stop: None,
                spec_fingerprint: None,
                served_names: None,
                kv_event_ports: None,
            },
        );
        Outcome::Applied
    }

    /// An agent's report on one shard, refused when not newer than the
    /// last one applied.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_shard_state(
        &mut self,
        replica: &str,
        rank: u32,
        state: ShardState,
        pid: Option<u32>,
        failure: &Option<ShardFailure>,
        seq: u64,
        at_ms: u64,
    ) -> Outcome {
        let Some(found) = self.replicas.get_mut(replica) else {
            return Rejection::not_found(format!("replica {replica} does not exist"));
        };
        let Some(shard) = found.shards.iter_mut().find(|s| s.rank == rank) else {
            return Rejection::not_found(format!(
                "replica {replica} has no shard with rank {rank}"
            ));
        };
        if seq != 0 && seq <= shard.report_seq {
            return Rejection::conflict(format!(
                "shard {replica}/{rank}: report {seq} ({}) is not newer than report {} \
                 already applied ({}); a stale report never rolls a shard back",
                state.as_str(),
                shard.report_seq,
                shard.state.as_str()
            ));
        }
        shard.report_seq = shard.report_seq.max(seq);
        if shard.state != state {
            shard.state_changed_at_ms = at_ms;
        }
        shard.state = state;
        shard.pid = pid;
        if failure.is_some() {
            shard.last_failure.clone_from(failure);
        }
        Outcome::Applied
    }

    pub(super) fn remove_replica(&mut self, id: &str, failure: &Option<ReplicaFailure>) -> Outcome {
        let Some(replica) = self.replicas.remove(id) else {
            return Rejection::not_found(format!("replica {id} does not exist"));
        };
        if let (Some(failure), Some(model)) = (failure, self.models.get_mut(&replica.model)) {
            model.last_failure = Some(failure.clone());
            // A new replica of a rollout in progress that failed counts
            // against the rollout: enough of them roll it back.
            if let Some(rollout) = &mut model.rollout
                && rollout.completed_at_ms.is_none()
                && replica.spec_fingerprint.as_deref() == Some(rollout.to.as_str())
            {
                rollout.failures = rollout.failures.saturating_add(1);
                rollout.last_failure = Some(format!(
                    "replica {} on node {}: {}",
                    replica.id, failure.node, failure.failure.message
                ));
            }
        }
        Outcome::Applied
    }

    pub(super) fn stop_replica(
        &mut self,
        id: &str,
        reason: &str,
        drain_deadline_ms: Option<u64>,
        at_ms: u64,
    ) -> Outcome {
        let Some(replica) = self.replicas.get_mut(id) else {
            return Rejection::not_found(format!("replica {id} does not exist"));
        };
        // The first order stands: a later one must not turn a stop
        // back into a drain or move its deadline.
        if replica.stop.is_none() {
            replica.stop = Some(StopOrder {
                reason: reason.to_owned(),
                drain_deadline_ms,
                at_ms,
            });
        }
        Outcome::Applied
    }

    /// The replica holding a GPU with a shard that is not stopped.
    pub fn gpu_holder(&self, node: &str, gpu: u32) -> Option<&str> {
        self.replicas
            .values()
            .find(|replica| replica.holds_gpu(node, gpu))
            .map(|replica| replica.id.as_str())
    }
}
