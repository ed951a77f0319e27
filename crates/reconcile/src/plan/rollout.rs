//! Rolling updates: when a model's launch spec changes, its replicas are
//! replaced make-before-break, as a node drain replaces them: a new replica
//! (`replaces` the old one) is placed first, and the old one drains once
//! the new one is ready. `max_surge` replacements run at once; when no GPUs
//! are free for one, up to `max_unavailable` old replicas are taken down
//! first. New replicas that fail count against the rollout, and enough of
//! them restore the previous spec.

use std::collections::HashMap;

use llmgw_catalog::Model;
use llmgw_state::{Command, ModelRecord, Replica};

use super::{Round, replacement_of, serving};
use crate::specs::outdated;

impl Round<'_> {
    pub(super) fn roll_out(&mut self, models: &HashMap<String, Model>) {
        let mut names: Vec<&String> = models.keys().collect();
        names.sort();
        for name in names {
            let Some(record) = self.fleet.models.get(name) else {
                continue;
            };
            if self.roll_back_if_failing(record, &models[name]) {
                continue;
            }
            self.replace_outdated(record, &models[name]);
        }
    }

    /// Too many new replicas failed: the previous spec comes back, and its
    /// replicas roll in the same way. A rollback is never rolled back.
    fn roll_back_if_failing(&mut self, record: &ModelRecord, model: &Model) -> bool {
        let Some(rollout) = &record.rollout else {
            return false;
        };
        let limit = model
            .managed()
            .map_or(0, |m| m.rollout.rollback_after_failures);
        let failing = rollout.completed_at_ms.is_none()
            && rollout.rollback.is_none()
            && limit > 0
            && rollout.failures >= limit
            && record.previous.is_some();
        if !failing {
            return false;
        }
        let reason = format!(
            "{} new replica(s) of the rollout to {} failed (rollback_after_failures: {limit}); \
             last: {}",
            rollout.failures,
            rollout.to,
            rollout.last_failure.as_deref().unwrap_or("unknown")
        );
        tracing::warn!(model = %record.name, %reason, "rolling back");
        self.commands.push(Command::RollbackModel {
            name: record.name.clone(),
            reason,
            from: Some(rollout.to.clone()),
            at_ms: self.now_ms,
        });
        true
    }

    fn replace_outdated(&mut self, record: &ModelRecord, model: &Model) {
        let fleet = self.fleet;
        let name = record.name.as_str();
        let Some(policy) = model.managed().map(|m| m.rollout) else {
            return;
        };
        let live: Vec<&Replica> = fleet
            .replicas
            .values()
            .filter(|r| r.model == name && r.stop.is_none())
            .collect();
        let old: Vec<&Replica> = live
            .iter()
            .copied()
            .filter(|r| outdated(fleet, r))
            .collect();
        if old.is_empty() {
            self.finish_if_complete(record);
            return;
        }
        let to = record.spec.launch_fingerprint();
        let mut in_flight = 0u32;
        let mut waiting = Vec::new();
        for replica in old {
            // A draining node moves its replicas itself (to the new spec).
            if self.on_draining_node(replica) {
                continue;
            }
            match replacement_of(fleet, replica) {
                Some(new) if new.state().is_up() => self.stop(
                    replica,
                    format!(
                        "rolling update of model {name} to {to}: replica {} took over",
                        new.id
                    ),
                    Some(self.now_ms + self.settings.scale_down_drain_ms),
                ),
                Some(_) => in_flight += 1,
                // Serving nothing yet: nothing is lost by stopping it now,
                // and its place is taken by a replica of the new spec.
                None if !replica.state().is_up() => self.stop(
                    replica,
                    format!(
                        "rolling update of model {name} to {to}: this replica of an earlier \
                         spec was not serving yet"
                    ),
                    None,
                ),
                None => waiting.push(replica),
            }
        }
        if waiting.is_empty() || self.held_back(name) {
            return;
        }
        let ready = serving(fleet, name)
            .iter()
            .filter(|r| r.state().is_up())
            .count() as u32;
        let mut unavailable = record.desired_replicas.saturating_sub(ready);
        for replica in waiting {
            if in_flight < policy.max_surge {
                if self.place(model, Some(replica.id.clone())) {
                    in_flight += 1;
                    continue;
                }
                self.back_off_for_room(name);
            }
            // No surge left, or no room for one: take an old replica down
            // first, within the unavailability allowed.
            if unavailable >= policy.max_unavailable {
                break;
            }
            unavailable += 1;
            self.stop(
                replica,
                format!(
                    "rolling update of model {name} to {to}: no surge replica runs beside it \
                     (max_surge {}), so it goes first (max_unavailable {})",
                    policy.max_surge, policy.max_unavailable
                ),
                Some(self.now_ms + self.settings.scale_down_drain_ms),
            );
        }
    }

    fn on_draining_node(&self, replica: &Replica) -> bool {
        replica
            .shards
            .iter()
            .any(|s| self.fleet.drains.contains_key(&s.node))
    }

    /// Every replica the model wants runs the new spec and is ready.
    fn finish_if_complete(&mut self, record: &ModelRecord) {
        let Some(rollout) = &record.rollout else {
            return;
        };
        if rollout.completed_at_ms.is_some() || rollout.to != record.spec.launch_fingerprint() {
            return;
        }
        let serving = serving(self.fleet, &record.name);
        let done = serving.len() == record.desired_replicas as usize
            && serving.iter().all(|r| r.state().is_up());
        if done {
            tracing::info!(model = %record.name, fingerprint = %rollout.to, "rollout complete");
            self.commands.push(Command::FinishRollout {
                name: record.name.clone(),
                fingerprint: rollout.to.clone(),
                at_ms: self.now_ms,
            });
        }
    }
}
