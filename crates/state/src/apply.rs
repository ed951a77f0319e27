//! Deterministic application of commands. No clock, no randomness, no I/O:
//! the outcome depends only on the state and the command.

//!
//! One function per command, grouped by what they change: `nodes.rs`,
//! `catalog.rs`, `replicas.rs`.

mod catalog;
mod keys;
mod nodes;
mod replicas;
mod usage;

use crate::command::{Command, Leadership, Outcome, Rejection};
use crate::holders::Holders;
use crate::types::FleetState;

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
            } => self.register_node(id, mgmt_addr, inventory, fabrics, labels, *at_ms),
            Command::SetNodeStatus {
                id,
                status,
                based_on,
                at_ms,
            } => self.set_node_status(id, *status, *based_on, *at_ms),
            Command::Cordon { id, .. } => self.cordon(id),
            Command::Uncordon { id, .. } => self.uncordon(id),
            Command::StartDrain {
                id,
                deadline_ms,
                at_ms,
            } => self.start_drain(id, *deadline_ms, *at_ms),
            Command::FinishDrain { id, .. } => self.finish_drain(id),
            Command::PutModel {
                name,
                spec,
                replicas,
                at_ms,
            } => self.put_model(name, spec, *replicas, *at_ms),
            Command::DeleteModel { name, .. } => self.delete_model(name),
            Command::PlaceReplica {
                id,
                model,
                profile,
                shards,
                fabric,
                rendezvous_port,
                replaces,
                spec_fingerprint,
                served_names,
                kv_event_ports,
                at_ms,
            } => {
                let kv_ports = match kv_event_ports.map(|k| k.ports()) {
                    None => Vec::new(),
                    Some(Some(ports)) => ports,
                    Some(None) => {
                        return Rejection::invalid(format!(
                            "replica {id}: KV event ports {kv_event_ports:?} name no rank or pass port 65535"
                        ));
                    }
                };
                let held = holders.get_or_insert_with(|| Holders::of(self));
                let head_ports: Vec<u16> =
                    rendezvous_port.iter().copied().chain(kv_ports).collect();
                let outcome =
                    self.place_replica(held, id, model, profile, shards, &head_ports, *at_ms);
                if let (Outcome::Applied, Some(replica)) = (&outcome, self.replicas.get_mut(id)) {
                    replica.fabric.clone_from(fabric);
                    replica.rendezvous_port = *rendezvous_port;
                    replica.replaces.clone_from(replaces);
                    replica.spec_fingerprint.clone_from(spec_fingerprint);
                    replica.served_names.clone_from(served_names);
                    replica.kv_event_ports = *kv_event_ports;
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
            } => self.set_shard_state(replica, *rank, *state, *pid, failure, *seq, *at_ms),
            Command::RemoveReplica { id, failure, .. } => self.remove_replica(id, failure),
            Command::StopReplica {
                id,
                reason,
                drain_deadline_ms,
                at_ms,
            } => self.stop_replica(id, reason, *drain_deadline_ms, *at_ms),
            Command::RetirePeer { peer, .. } => {
                self.removed_peers.insert(*peer);
                Outcome::Applied
            }
            Command::Batch { commands, .. } | Command::Decided { commands, .. } => {
                let mut holders = None;
                for command in commands {
                    // The leadership check is made on the log entry's own
                    // command only: a decision nested inside would escape
                    // it, so it is refused. Nothing proposes one.
                    if !matches!(command, Command::Decided { .. }) {
                        self.apply_with(command, &mut holders);
                    }
                }
                Outcome::Applied
            }
            Command::SeedCatalog { models, at_ms } => self.seed_catalog(models, *at_ms),
            Command::RollbackModel {
                name,
                reason,
                from,
                at_ms,
            } => self.rollback_model(name, reason, from.as_deref(), *at_ms),
            Command::FinishRollout {
                name,
                fingerprint,
                at_ms,
            } => self.finish_rollout(name, fingerprint, *at_ms),
            Command::ScaleModel {
                name,
                decision,
                at_ms: _,
            } => self.scale_model(name, decision),
            Command::SleepModel { name, at_ms, .. } => self.sleep_model(name, *at_ms),
            Command::WakeModel { name, at_ms } => self.wake_model(name, *at_ms),
            Command::CreateApiKey { key, at_ms: _ } => self.create_api_key(key),
            Command::UpdateApiKey { name, settings, .. } => self.update_api_key(name, settings),
            Command::RotateApiKey {
                name,
                secret_sha256,
                secret_prefix,
                at_ms,
            } => self.rotate_api_key(name, secret_sha256, secret_prefix, *at_ms),
            Command::RevokeApiKey { name, at_ms } => self.revoke_api_key(name, *at_ms),
            Command::RecordUsage {
                reporter,
                seq,
                rows,
                retain_minutes,
                demand,
                interval_ms,
                at_ms,
            } => self.record_usage(
                reporter,
                *seq,
                rows,
                *retain_minutes,
                (demand, *interval_ms),
                *at_ms,
            ),
            Command::BeginEpoch {
                cluster_id, epoch, ..
            } => self.begin_epoch(cluster_id, *epoch),
            Command::Unknown => Outcome::Applied,
        }
    }
}

fn unknown_node(id: &str) -> Outcome {
    Rejection::not_found(format!("node {id} is not registered"))
}

#[cfg(test)]
mod tests;
