//! Deterministic application of commands. No clock, no randomness, no I/O:
//! the outcome depends only on the state and the command.

use std::collections::BTreeSet;

use crate::command::{Command, Leadership, Outcome, Rejection};
use crate::holders::Holders;
use crate::model_spec::ModelSpec;
use crate::types::{
    Drain, FleetState, ModelRecord, NodeRecord, NodeStatus, Replica, Shard, ShardState, StopOrder,
};

impl FleetState {
    /// Applies the command of a log entry that `appended_by` appended. A
    /// [`Command::Decided`] of another leadership is refused whole: it was
    /// decided from a view that leadership no longer vouches for.
    pub fn apply_entry(&mut self, appended_by: Leadership, command: &Command) -> Outcome {
        if let Command::Decided { leader, .. } = command
            && *leader != appended_by
        {
            return Rejection::conflict(format!(
                "decided by the leader of {leader} but appended under {appended_by}: \
                 that leadership was superseded, and its decisions are dropped"
            ));
        }
        self.apply(command)
    }

    /// Applies one command. A command that contradicts the state is rejected
    /// and leaves the state untouched.
    pub fn apply(&mut self, command: &Command) -> Outcome {
        self.apply_with(command, &mut None)
    }

    /// `holders`: who holds GPUs and ports, when a batch has built it.
    fn apply_with(&mut self, command: &Command, holders: &mut Option<Holders>) -> Outcome {
        if !matches!(command, Command::PlaceReplica { .. }) {
            *holders = None;
        }
        match command {
            Command::RegisterNode {
                id,
                mgmt_addr,
                inventory,
                fabrics,
                labels,
                at_ms,
            } => {
                if id.is_empty() {
                    return Rejection::invalid("node id must not be empty");
                }
                match self.nodes.get_mut(id) {
                    Some(node) => {
                        node.mgmt_addr.clone_from(mgmt_addr);
                        node.inventory.clone_from(inventory);
                        node.fabrics.clone_from(fabrics);
                        node.labels.clone_from(labels);
                        // A registration is news even when the node was
                        // already ready: it outdates verdicts judged before it.
                        if node.status != NodeStatus::Ready {
                            node.status = NodeStatus::Ready;
                            node.status_changed_at_ms = *at_ms;
                        }
                        node.status_version += 1;
                    }
                    None => {
                        self.nodes.insert(
                            id.clone(),
                            NodeRecord {
                                id: id.clone(),
                                mgmt_addr: mgmt_addr.clone(),
                                inventory: inventory.clone(),
                                fabrics: fabrics.clone(),
                                labels: labels.clone(),
                                status: NodeStatus::Ready,
                                cordoned: false,
                                draining: false,
                                registered_at_ms: *at_ms,
                                status_changed_at_ms: *at_ms,
                                status_version: 1,
                            },
                        );
                    }
                }
                Outcome::Applied
            }
            Command::SetNodeStatus {
                id,
                status,
                based_on,
                at_ms,
            } => {
                let Some(node) = self.nodes.get_mut(id) else {
                    return unknown_node(id);
                };
                if let Some(version) = based_on
                    && *version != node.status_version
                {
                    return Rejection::conflict(format!(
                        "node {id}: {} was judged from status version {version}, \
                         but the node is at version {} ({}) now",
                        status.as_str(),
                        node.status_version,
                        node.status.as_str()
                    ));
                }
                set_status(node, *status, *at_ms);
                Outcome::Applied
            }
            Command::Cordon { id, .. } => {
                let Some(node) = self.nodes.get_mut(id) else {
                    return unknown_node(id);
                };
                node.cordoned = true;
                Outcome::Applied
            }
            Command::Uncordon { id, .. } => {
                let Some(node) = self.nodes.get_mut(id) else {
                    return unknown_node(id);
                };
                if node.draining {
                    return Rejection::conflict(format!(
                        "node {id} is draining; it stays cordoned until the drain finishes"
                    ));
                }
                node.cordoned = false;
                Outcome::Applied
            }
            Command::StartDrain {
                id,
                deadline_ms,
                at_ms,
            } => {
                let Some(node) = self.nodes.get_mut(id) else {
                    return unknown_node(id);
                };
                if let Some(drain) = self.drains.get(id) {
                    return Rejection::conflict(format!(
                        "node {id} is already draining (since {} ms)",
                        drain.started_at_ms
                    ));
                }
                node.cordoned = true;
                node.draining = true;
                self.drains.insert(
                    id.clone(),
                    Drain {
                        node: id.clone(),
                        started_at_ms: *at_ms,
                        deadline_ms: *deadline_ms,
                    },
                );
                Outcome::Applied
            }
            Command::FinishDrain { id, .. } => {
                if self.drains.remove(id).is_none() {
                    return Rejection::not_found(format!("node {id} has no drain in progress"));
                }
                if let Some(node) = self.nodes.get_mut(id) {
                    node.draining = false;
                }
                Outcome::Applied
            }
            Command::PutModel {
                name,
                spec,
                replicas,
                at_ms,
            } => {
                if name.is_empty() {
                    return Rejection::invalid("model name must not be empty");
                }
                if let Some(clash) = self.name_clash(name, spec) {
                    return clash;
                }
                self.models.insert(
                    name.clone(),
                    ModelRecord {
                        name: name.clone(),
                        spec: spec.clone(),
                        desired_replicas: *replicas,
                        updated_at_ms: *at_ms,
                        last_failure: self.models.get(name).and_then(|m| m.last_failure.clone()),
                    },
                );
                Outcome::Applied
            }
            Command::DeleteModel { name, .. } => {
                if self.models.remove(name).is_none() {
                    return Rejection::not_found(format!("model {name} is not in the catalog"));
                }
                Outcome::Applied
            }
            Command::PlaceReplica {
                id,
                model,
                profile,
                shards,
                fabric,
                rendezvous_port,
                replaces,
                at_ms,
            } => {
                let held = holders.get_or_insert_with(|| Holders::of(self));
                let outcome =
                    self.place_replica(held, id, model, profile, shards, *rendezvous_port, *at_ms);
                if let (Outcome::Applied, Some(replica)) = (&outcome, self.replicas.get_mut(id)) {
                    replica.fabric.clone_from(fabric);
                    replica.rendezvous_port = *rendezvous_port;
                    replica.replaces.clone_from(replaces);
                    held.add(self, &self.replicas[id]);
                }
                outcome
            }
            Command::SetShardState {
                replica,
                rank,
                state,
                pid,
                failure,
                seq,
                at_ms,
            } => {
                let Some(found) = self.replicas.get_mut(replica) else {
                    return Rejection::not_found(format!("replica {replica} does not exist"));
                };
                let Some(shard) = found.shards.iter_mut().find(|s| s.rank == *rank) else {
                    return Rejection::not_found(format!(
                        "replica {replica} has no shard with rank {rank}"
                    ));
                };
                if *seq != 0 && *seq <= shard.report_seq {
                    return Rejection::conflict(format!(
                        "shard {replica}/{rank}: report {seq} ({}) is not newer than report {} \
                         already applied ({}); a stale report never rolls a shard back",
                        state.as_str(),
                        shard.report_seq,
                        shard.state.as_str()
                    ));
                }
                shard.report_seq = shard.report_seq.max(*seq);
                if shard.state != *state {
                    shard.state_changed_at_ms = *at_ms;
                }
                shard.state = *state;
                shard.pid = *pid;
                if failure.is_some() {
                    shard.last_failure.clone_from(failure);
                }
                Outcome::Applied
            }
            Command::RemoveReplica { id, failure, .. } => {
                let Some(replica) = self.replicas.remove(id) else {
                    return Rejection::not_found(format!("replica {id} does not exist"));
                };
                if let (Some(failure), Some(model)) = (failure, self.models.get_mut(&replica.model))
                {
                    model.last_failure = Some(failure.clone());
                }
                Outcome::Applied
            }
            Command::StopReplica {
                id,
                reason,
                drain_deadline_ms,
                at_ms,
            } => {
                let Some(replica) = self.replicas.get_mut(id) else {
                    return Rejection::not_found(format!("replica {id} does not exist"));
                };
                // The first order stands: a later one must not turn a stop
                // back into a drain or move its deadline.
                if replica.stop.is_none() {
                    replica.stop = Some(StopOrder {
                        reason: reason.clone(),
                        drain_deadline_ms: *drain_deadline_ms,
                        at_ms: *at_ms,
                    });
                }
                Outcome::Applied
            }
            Command::RetirePeer { peer, .. } => {
                self.removed_peers.insert(*peer);
                Outcome::Applied
            }
            Command::Batch { commands, .. } | Command::Decided { commands, .. } => {
                let mut holders = None;
                for command in commands {
                    self.apply_with(command, &mut holders);
                }
                Outcome::Applied
            }
            Command::Unknown => Outcome::Applied,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn place_replica(
        &mut self,
        holders: &Holders,
        id: &str,
        model: &str,
        profile: &str,
        shards: &[Shard],
        rendezvous_port: Option<u16>,
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
        for shard in shards {
            if !self.nodes.contains_key(&shard.node) {
                return unknown_node(&shard.node);
            }
            for gpu in &shard.gpus {
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
        let wanted = shards
            .iter()
            .map(|s| (s.node.as_str(), s.port))
            .chain(head.zip(rendezvous_port));
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
            },
        );
        Outcome::Applied
    }

    /// Names and aliases are one namespace, checked here rather than only by
    /// the peer that took the request, whose view may lag the log.
    fn name_clash(&self, name: &str, spec: &ModelSpec) -> Option<Outcome> {
        let wanted: Vec<&str> = model_names(name, spec).collect();
        self.models
            .values()
            .filter(|other| other.name != name)
            .find_map(|other| {
                let taken = model_names(&other.name, &other.spec).find(|n| wanted.contains(n))?;
                let what = if taken == other.name {
                    "the name"
                } else {
                    "an alias"
                };
                Some(Rejection::conflict(format!(
                    "model {name}: `{taken}` is already {what} of model {}; \
                     names and aliases are one namespace",
                    other.name
                )))
            })
    }

    /// The replica holding a GPU with a shard that is not stopped.
    pub fn gpu_holder(&self, node: &str, gpu: u32) -> Option<&str> {
        self.replicas
            .values()
            .find(|replica| replica.holds_gpu(node, gpu))
            .map(|replica| replica.id.as_str())
    }
}

fn set_status(node: &mut NodeRecord, status: NodeStatus, at_ms: u64) {
    if node.status != status {
        node.status = status;
        node.status_changed_at_ms = at_ms;
        node.status_version += 1;
    }
}

/// A catalog entry's name and its aliases.
fn model_names<'a>(name: &'a str, spec: &'a ModelSpec) -> impl Iterator<Item = &'a str> {
    std::iter::once(name).chain(spec.aliases().iter().map(String::as_str))
}

fn unknown_node(id: &str) -> Outcome {
    Rejection::not_found(format!("node {id} is not registered"))
}

#[cfg(test)]
mod tests;
