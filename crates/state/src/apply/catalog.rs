//! The model catalog: entries, and names and aliases as one namespace.

use crate::command::{Outcome, Rejection, SeedModel};
use crate::model_spec::ModelSpec;
use crate::types::{FleetState, ModelRecord, Rollout, ScaleDecision};

impl FleetState {
    pub(super) fn put_model(
        &mut self,
        name: &str,
        spec: &ModelSpec,
        replicas: u32,
        at_ms: u64,
    ) -> Outcome {
        if name.is_empty() {
            return Rejection::invalid("model name must not be empty");
        }
        if let Some(clash) = self.name_clash(name, spec) {
            return clash;
        }
        let old = self.models.remove(name);
        let last_failure = old.as_ref().and_then(|m| m.last_failure.clone());
        let woken_at_ms = old.as_ref().and_then(|m| m.woken_at_ms);
        // An autoscaled model keeps the count its load decided (within the
        // new bounds): `replicas` is only where it starts.
        let autoscale = autoscale_of(spec);
        let (replicas, last_scale) = match (&old, autoscale) {
            (Some(old), Some(bounds)) => {
                (bounds.clamp(old.desired_replicas), old.last_scale.clone())
            }
            _ => (replicas, None),
        };
        if let Some(old) = &old
            && (old.spec.launch_fingerprint() != spec.launch_fingerprint()
                || old.spec.aliases() != spec.aliases())
        {
            self.stamp_unstamped_replicas(old);
        }
        let (previous, rollout) = match old {
            Some(old) if old.spec.launch_fingerprint() != spec.launch_fingerprint() => {
                let rollout = Rollout {
                    to: spec.launch_fingerprint().to_owned(),
                    from: old.spec.launch_fingerprint().to_owned(),
                    started_at_ms: at_ms,
                    completed_at_ms: None,
                    failures: 0,
                    last_failure: None,
                    rollback: None,
                };
                (Some(old.spec), Some(rollout))
            }
            Some(old) => (old.previous, old.rollout),
            None => (None, None),
        };
        self.models.insert(
            name.to_owned(),
            ModelRecord {
                name: name.to_owned(),
                spec: spec.clone(),
                desired_replicas: replicas,
                updated_at_ms: at_ms,
                last_failure,
                previous,
                rollout,
                last_scale,
                // A changed entry wakes the model: what rolls out or is
                // judged next must run.
                asleep_since_ms: None,
                woken_at_ms,
            },
        );
        Outcome::Applied
    }

    pub(super) fn sleep_model(&mut self, name: &str, at_ms: u64) -> Outcome {
        let Some(record) = self.models.get_mut(name) else {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        };
        if autoscale_of(&record.spec).is_none_or(|a| a.sleep_after.is_none()) {
            return Rejection::conflict(format!(
                "model {name} has no sleep mode (autoscale.sleep_after)"
            ));
        }
        if record.desired_replicas == 0 {
            return Rejection::conflict(format!("model {name} wants no replica to put to sleep"));
        }
        record.asleep_since_ms.get_or_insert(at_ms);
        Outcome::Applied
    }

    pub(super) fn wake_model(&mut self, name: &str, at_ms: u64) -> Outcome {
        let Some(record) = self.models.get_mut(name) else {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        };
        let Some(bounds) = autoscale_of(&record.spec) else {
            return Rejection::conflict(format!("model {name} is not autoscaled"));
        };
        if record.asleep_since_ms.take().is_some() {
            record.woken_at_ms = Some(at_ms);
        }
        if record.desired_replicas == 0 && bounds.max_replicas > 0 {
            record.desired_replicas = 1;
            record.last_scale = Some(ScaleDecision {
                from: 0,
                to: 1,
                requests_low: 0,
                requests_high: 0,
                ready_replicas: 0,
                target_per_replica: bounds.target_requests_per_replica,
                window_ms: 0,
                at_ms,
                woken_by_request: true,
                yielded_to: None,
                above_target: None,
                saturated: false,
                released_for_waiting: false,
            });
        }
        Outcome::Applied
    }

    pub(super) fn scale_model(&mut self, name: &str, decision: &ScaleDecision) -> Outcome {
        let Some(record) = self.models.get_mut(name) else {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        };
        let Some(bounds) = autoscale_of(&record.spec) else {
            return Rejection::conflict(format!("model {name} is not autoscaled"));
        };
        if record.desired_replicas != decision.from {
            return Rejection::conflict(format!(
                "model {name} wants {} replicas now, not {}: the decision is stale",
                record.desired_replicas, decision.from
            ));
        }
        if bounds.clamp(decision.to) != decision.to {
            return Rejection::invalid(format!(
                "{} replicas is outside model {name}'s bounds ({} to {})",
                decision.to, bounds.min_replicas, bounds.max_replicas
            ));
        }
        record.desired_replicas = decision.to;
        record.last_scale = Some(decision.clone());
        if decision.to == 0 {
            // Released: the next replica starts awake.
            record.asleep_since_ms = None;
        }
        Outcome::Applied
    }

    /// Replicas placed before fingerprints were recorded run the entry as
    /// it was until now: say so before what engines see of it changes, so
    /// their orders stay the ones they were launched with. (Only then: a
    /// log from before fingerprints applies to the state it always did.)
    fn stamp_unstamped_replicas(&mut self, old: &ModelRecord) {
        for replica in self.replicas.values_mut().filter(|r| r.model == old.name) {
            if replica.spec_fingerprint.is_none() {
                replica.spec_fingerprint = Some(old.spec.launch_fingerprint().to_owned());
            }
            if replica.served_names.is_none() {
                replica.served_names = Some(old.spec.served_names(&old.name));
            }
        }
    }

    /// Restores the launch spec the model had before its last change; its
    /// replica count, aliases and rollout settings stay as they are now.
    /// The replicas then roll back like any other change.
    pub(super) fn rollback_model(
        &mut self,
        name: &str,
        reason: &str,
        from: Option<&str>,
        at_ms: u64,
    ) -> Outcome {
        let Some(record) = self.models.get(name) else {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        };
        if let Some(from) = from
            && from != record.spec.launch_fingerprint()
        {
            return Rejection::conflict(format!(
                "model {name} no longer runs launch spec {from} (it runs {}): nothing to roll back",
                record.spec.launch_fingerprint()
            ));
        }
        let Some(previous) = &record.previous else {
            return Rejection::conflict(format!(
                "model {name} has no earlier launch spec to roll back to: its entry has not \
                 changed in a way engines see since it was added"
            ));
        };
        let (serde_json::Value::Object(mut restored), serde_json::Value::Object(now)) =
            (previous.stored().clone(), record.spec.stored().clone())
        else {
            return Rejection::invalid(format!("model {name}: a stored entry is not a map"));
        };
        for key in ModelSpec::NOT_LAUNCHED {
            match now.get(key) {
                Some(value) => restored.insert(key.to_owned(), value.clone()),
                None => restored.remove(key),
            };
        }
        let spec = ModelSpec::from_stored(serde_json::Value::Object(restored));
        let Some(mut record) = self.models.remove(name) else {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        };
        self.stamp_unstamped_replicas(&record);
        record.rollout = Some(Rollout {
            to: spec.launch_fingerprint().to_owned(),
            from: record.spec.launch_fingerprint().to_owned(),
            started_at_ms: at_ms,
            completed_at_ms: None,
            failures: 0,
            last_failure: None,
            rollback: Some(reason.to_owned()),
        });
        record.previous = Some(std::mem::replace(&mut record.spec, spec));
        record.updated_at_ms = at_ms;
        record.asleep_since_ms = None;
        self.models.insert(name.to_owned(), record);
        Outcome::Applied
    }

    /// The leader saw every replica of the model run `fingerprint`, ready.
    pub(super) fn finish_rollout(&mut self, name: &str, fingerprint: &str, at_ms: u64) -> Outcome {
        let Some(rollout) = self.models.get_mut(name).and_then(|m| m.rollout.as_mut()) else {
            return Rejection::not_found(format!("model {name} has no rollout"));
        };
        if rollout.to != fingerprint || rollout.completed_at_ms.is_some() {
            return Rejection::conflict(format!(
                "model {name}: the rollout to {fingerprint} is not the one in progress"
            ));
        }
        rollout.completed_at_ms = Some(at_ms);
        Outcome::Applied
    }

    /// Fills an empty catalog once per cluster. Each entry applies or is
    /// refused on its own, as in a batch.
    pub(super) fn seed_catalog(&mut self, models: &[SeedModel], at_ms: u64) -> Outcome {
        if self.catalog_seeded {
            return Rejection::conflict("the configured catalog was seeded already");
        }
        if !self.models.is_empty() {
            return Rejection::conflict(format!(
                "the catalog holds {} model(s) already; a configured catalog seeds only an \
                 empty one (change it with PUT /api/v1/models/NAME)",
                self.models.len()
            ));
        }
        self.catalog_seeded = true;
        for model in models {
            self.put_model(&model.name, &model.spec, model.replicas, at_ms);
        }
        Outcome::Applied
    }

    pub(super) fn delete_model(&mut self, name: &str) -> Outcome {
        if self.models.remove(name).is_none() {
            return Rejection::not_found(format!("model {name} is not in the catalog"));
        }
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
}

/// A catalog entry's name and its aliases.
fn model_names<'a>(name: &'a str, spec: &'a ModelSpec) -> impl Iterator<Item = &'a str> {
    std::iter::once(name).chain(spec.aliases().iter().map(String::as_str))
}

/// The entry's autoscale bounds; none when it has none or cannot be read.
fn autoscale_of(spec: &ModelSpec) -> Option<llmgw_catalog::Autoscale> {
    spec.model().ok()?.managed()?.autoscale
}
