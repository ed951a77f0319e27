//! The model catalog: entries, and names and aliases as one namespace.

use crate::command::{Outcome, Rejection, SeedModel};
use crate::model_spec::ModelSpec;
use crate::types::{FleetState, ModelRecord};

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
        self.models.insert(
            name.to_owned(),
            ModelRecord {
                name: name.to_owned(),
                spec: spec.clone(),
                desired_replicas: replicas,
                updated_at_ms: at_ms,
                last_failure: self.models.get(name).and_then(|m| m.last_failure.clone()),
            },
        );
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
