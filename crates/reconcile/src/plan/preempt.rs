//! GPUs moving between models. A model that cannot place a replica it
//! wants takes the GPUs of one replica of a lower-priority model that
//! autoscales above its `min_replicas` (its floor): the replica drains
//! first, never cut, and its model's count drops by one, recorded with
//! why. One replica yields at a time for each model that wants room, and
//! no other until it is gone; a model that does not autoscale never
//! yields, since its count is the operator's.

use llmgw_catalog::Model;
use llmgw_scheduler::{Placer, Request, Siblings};
use llmgw_state::{Command, Replica, ScaleDecision};

use super::Round;
use crate::fleet_view::{node_views, take_survivor_gpus};

/// A model's priority; 0 for one this peer cannot read.
fn priority_of(fleet: &llmgw_state::FleetState, model: &str) -> u32 {
    fleet
        .models
        .get(model)
        .and_then(|record| record.spec.model().ok())
        .and_then(|model| model.managed())
        .map_or(0, |managed| managed.priority)
}

impl Round<'_> {
    /// Called when `model` found no room for a replica it wants: true when
    /// a replica is yielding its GPUs to it (ordered now or earlier).
    pub(super) fn take_gpus_for(&mut self, model: &Model) -> bool {
        if let Some(victim) = self.memory.yielding.get(&model.name) {
            if self.fleet.replicas.contains_key(victim) {
                return true;
            }
            self.memory.yielding.remove(&model.name);
        }
        let Some(managed) = model.managed() else {
            return false;
        };
        if managed.priority == 0 || self.yielded_this_round {
            return false;
        }
        let Some(victim) = self.first_victim_that_makes_room(model) else {
            return false;
        };
        let victim_model = victim.model.clone();
        let Some(record) = self.fleet.models.get(&victim_model) else {
            return false;
        };
        let priority = priority_of(self.fleet, &victim_model);
        let decision = ScaleDecision {
            from: record.desired_replicas,
            to: record.desired_replicas - 1,
            requests_low: 0,
            requests_high: 0,
            ready_replicas: 0,
            target_per_replica: 0,
            window_ms: 0,
            at_ms: self.now_ms,
            woken_by_request: false,
            yielded_to: Some(model.name.clone()),
            above_target: None,
            saturated: false,
            released_for_waiting: false,
        };
        tracing::info!(
            model = %model.name,
            victim = %victim.id,
            victim_model = %victim_model,
            "no room for a replica: a replica of a lower-priority model yields its GPUs"
        );
        self.commands.push(Command::ScaleModel {
            name: victim_model.clone(),
            decision,
            at_ms: self.now_ms,
        });
        let victim_id = victim.id.clone();
        self.stop(
            &victim,
            format!(
                "yielding its GPUs to model {} (priority {} over {priority})",
                model.name, managed.priority
            ),
            Some(self.now_ms + self.settings.scale_down_drain_ms),
        );
        self.memory.yielding.insert(model.name.clone(), victim_id);
        self.yielded_this_round = true;
        true
    }

    /// The lowest-priority replica (newest first among equals) whose GPUs,
    /// once free, give `model` a placement.
    fn first_victim_that_makes_room(&self, model: &Model) -> Option<Replica> {
        let managed = model.managed()?;
        let mut candidates: Vec<&Replica> = self
            .fleet
            .replicas
            .values()
            .filter(|r| r.stop.is_none() && r.model != model.name)
            .filter(|r| priority_of(self.fleet, &r.model) < managed.priority)
            .filter(|r| self.above_floor(&r.model))
            .collect();
        candidates.sort_by_key(|r| {
            (
                priority_of(self.fleet, &r.model),
                std::cmp::Reverse(r.created_at_ms),
            )
        });
        candidates
            .into_iter()
            .find(|victim| {
                let mut without = self.fleet.clone();
                without.replicas.remove(&victim.id);
                let mut views = node_views(&without);
                take_survivor_gpus(&mut views, &self.memory.survivor_gpus);
                let request = Request {
                    model: &model.name,
                    profiles: &managed.profiles,
                    siblings: Siblings::default(),
                    avoid: Default::default(),
                    strategy: self.settings.strategy,
                };
                Placer::new(views).place(&request).is_ok()
            })
            .cloned()
    }

    /// Whether `model` autoscales and wants more replicas than its floor.
    fn above_floor(&self, model: &str) -> bool {
        let Some(record) = self.fleet.models.get(model) else {
            return false;
        };
        let autoscale = record
            .spec
            .model()
            .ok()
            .and_then(|m| m.managed())
            .and_then(|m| m.autoscale);
        autoscale.is_some_and(|a| record.desired_replicas > a.min_replicas)
    }
}
